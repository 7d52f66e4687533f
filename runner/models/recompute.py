"""Activation recomputation (`trainer.recompute`): a model's units (the spec's `recompute_units`:
the decoder's blocks, the FFNN's Linear layers) keep less for backward and recompute the rest.

- `full`: a unit keeps only its input; backward re-runs its whole forward (torch's non-reentrant
  checkpoint), tensor-parallel all-reduces included.
- `selective`: torch's selective checkpointing, with torchtitan's kind of op-level policy: the
  outputs of matrix products, attention and collectives are saved, the cheap rest (norms,
  activations, dropout, adds, views) recomputed. No collective runs again but sequence
  parallelism's all-gathers, whose whole output is gathered again rather than kept.

The unit's `forward` is replaced on the instance, so module names, parameter names and state-dict
keys stay what they were (snapshots resume across modes), and every layout (DDP, DTensor's
splits, pipeline stages, which hold these very modules) runs the wrapped units as they are.
Dropout recomputes the same masks: checkpoint restores the RNG state before re-running.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

aten = torch.ops.aten
# Matrix products (what nn.Linear and `@` dispatch to) and attention: costly to recompute.
SAVED_OPS = {
    aten.mm.default,
    aten.addmm.default,
    aten.bmm.default,
    aten.baddbmm.default,
    aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_cudnn_attention.default,
}

# Collectives whose outputs are kept, so that recomputation moves no bytes: DTensor's sums of
# partial results. Every other functional collective op runs again: sequence parallelism's
# all-gather of the stream into the split layers (whole: t times what each rank's positions
# hold), as Megatron-LM gathers it again in backward, and the waits and autograd wrappers around
# the kept ones (no-ops on a tensor that is there already).
SAVED_COLLECTIVES = {
    torch.ops._c10d_functional.all_reduce.default,
    torch.ops._c10d_functional.reduce_scatter_tensor.default,
}
_replaying = False  # inside a selective recomputation: saved collectives are replayed, not run


def replayed(kind: str) -> bool:
    """Whether a collective of `kind` called now is served from selective checkpointing's saved
    outputs (the tensor-parallel probe counts only collectives that move bytes): all but the
    all-gathers, which run again."""
    return _replaying and kind != "all-gather"


def _policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    if op in SAVED_OPS or op in SAVED_COLLECTIVES:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


@contextlib.contextmanager
def _replayed(recompute: Any) -> Iterator[None]:
    global _replaying
    before, _replaying = _replaying, True
    try:
        with recompute:
            yield
    finally:
        _replaying = before


def _selective_contexts() -> tuple[Any, Any]:
    forward, recompute = create_selective_checkpoint_contexts(_policy)
    if torch.compiler.is_compiling():
        # Compiling takes torch's two modes as they are; it runs no tensor-parallel collective
        # (trainer.compile is refused with parallel.tp > 1), so no probe needs the flag.
        return forward, recompute
    return forward, _replayed(recompute)


def _checkpointed(forward: Callable[..., Any], mode: str) -> Callable[..., Any]:
    context = _selective_contexts if mode == "selective" else None
    options: dict[str, Any] = {"context_fn": context} if context else {}

    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():  # validation: nothing is kept for backward anyway
            return forward(*args, **kwargs)
        # No early stop: recomputation re-runs the whole unit, each forward all-reduce in it too,
        # even one that nothing after it needs (the planner counts them all: tp_recompute_traffic).
        return checkpoint(
            forward, *args, use_reentrant=False, early_stop=False, **options, **kwargs
        )

    return run


def recompute(units: Iterable[nn.Module], mode: str) -> None:
    """Make each unit recompute its activations in backward, as `mode` (runner.choices.RECOMPUTE)
    says; `none` leaves them as they are."""
    if mode == "none":
        return
    for unit in units:
        unit.forward = _checkpointed(unit.forward, mode)
