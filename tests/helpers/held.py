"""What a model holds from forward to backward, as training builds it, measured in this process
(glibc's malloc: runner/training/callbacks/memory.py) against the planner's activation bytes."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

import torch

from runner.losses import LOSSES
from runner.models.registry import spec_for
from runner.training.callbacks.memory import allocated_bytes
from runner.training.rank import build_model
from tests.helpers.jobs import compose_job


def held(overrides: list[str], mode: str) -> int:
    """Bytes held from forward to backward by the model as training builds it. In a function of
    its own: nothing of it (a loss's graph holds the model's weights) outlives the measurement."""
    torch.manual_seed(0)
    cfg, _ = compose_job(*overrides, f"trainer.recompute={mode}")
    model, loss_fn = build_model(cfg, spec_for(cfg.model)), LOSSES[cfg.data.loss]
    if cfg.model._target_.endswith("Decoder"):
        shape, vocab = (cfg.data.batch_size, cfg.data.seq_len), cfg.data.vocab_size
        x, y = torch.randint(0, vocab, shape), torch.randint(0, vocab, shape)
    else:
        x = torch.randn(cfg.data.batch_size, cfg.model.in_features)
        y = torch.randint(0, cfg.model.out_features, (cfg.data.batch_size,))
    loss_fn(model(x), y).backward()  # once first: allocations made once per process
    with only_new_objects_collected():
        gc.collect()
        before = allocated_bytes()
        loss = loss_fn(model(x), y)
        gc.collect()
        bytes_held = allocated_bytes() - before + x.nbytes  # the batch: the first layer's input
    loss.backward()
    return bytes_held


@contextlib.contextmanager
def only_new_objects_collected() -> Iterator[None]:
    """The collector passes over what existed before (gc.freeze): a full collection of this
    process's millions of objects (torch's, MLflow's, every earlier test's) took half a second,
    and what it could free is there before and after alike."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
