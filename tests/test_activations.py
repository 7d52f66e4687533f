"""The planner's activations (runner/models/decoder/spec.py) against what autograd keeps for
backward, counted by its saved-tensor hooks: one process, one forward, no timing, so the same on
any CPU. Each storage once (a view of a kept tensor, or a tensor two operations keep, such as the
ReLU's output that its backward and the second product share, is one tensor), the parameters
left out."""

from __future__ import annotations

import pytest
import torch

from runner import validate
from runner.job import resolve_job
from runner.models.attention_kernel import use_attention_kernel
from runner.plain_loop import build, random_batch
from runner.planner.memory import activation_bytes
from tests.helpers.jobs import compose_job


def saved_bytes(*overrides: str) -> tuple[int, float]:
    """What one forward of the job's model keeps for backward, and what the planner says."""
    cfg, _ = compose_job(*overrides)
    validate.validate(cfg)
    model, _, loss_fn = build(cfg)
    use_attention_kernel(model, cfg.trainer.attention)
    x, y = random_batch(cfg, model)
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        kept.setdefault(storage.data_ptr(), storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss_fn(model(x), y)
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    got = sum(n for ptr, n in kept.items() if ptr not in weights)
    return got, activation_bytes(resolve_job(cfg))


# What the count leaves out is a few values a token where it counts d_model's: the norms' means
# and deviations, attention's log-sum-exp (0.3 MiB of 82 at a batch of 64): within 1 %. In fp32:
# 16-bit runs are held to their measured peaks (tests/test_precision.py), the math attention
# keeping some of its inputs in fp32 there, which this count does not follow.
@pytest.mark.parametrize(
    "overrides",
    [
        ["model.dropout=0", "data.batch_size=64"],  # SDPA's flash kernel, no masks
        ["data.batch_size=32"],  # dropout: the math path, its scores and masks
        ["model.dropout=0", "trainer.attention=math"],  # the math path's softmax alone
        ["model.n_heads=8", "model.n_kv_heads=2"],  # grouped queries on the math path
        ["model.ffn_hidden=384", "model.n_layers=3"],
    ],
    ids=["flash", "dropout", "math", "grouped", "ffn"],
)
def test_the_planned_activations_are_what_autograd_keeps(overrides: list[str]) -> None:
    torch.manual_seed(0)
    got, planned = saved_bytes("hardware.devices=1", *overrides)
    assert planned == pytest.approx(got, rel=0.01), (got / 2**20, planned / 2**20)
