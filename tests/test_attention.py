"""Attention's kernel (trainer.attention, runner/planner/attention.py): a fused kernel computes the
causal half of the square in tiles and recomputes Q K^T in backward; the math path computes the
whole square and keeps its scores, in the runtime and in the plan alike."""

import pytest
import torch
from hydra.utils import instantiate

from runner.job import resolve_job
from runner.models.attention_kernel import use_attention_kernel
from runner.planner.attention import backward_passes, computed_share
from runner.planner.timing import stage_products
from runner.validate import validate
from tests.helpers.jobs import compose_job


def scores_products(*overrides: str) -> tuple:
    """The job and its first block's Q K^T and softmax(.) V products (own block)."""
    cfg, _ = compose_job("mode=plan", "model.n_layers=1", *overrides)
    validate(cfg)
    job = resolve_job(cfg)
    qk, pv, *_ = [g for g in stage_products(job, 0) if g.attention]
    return job, qk, pv


@pytest.mark.parametrize(
    ("overrides", "share"),
    [  # the tiles on and below the diagonal: (s + t) / 2s for query tiles t rows high
        # flash's tiles in 16 bits, the memory-efficient kernel's in fp32
        (
            ["hardware=h100", "model.context_len=8192", "trainer.precision=bf16-true"],
            (8192 + 128) / (2 * 8192),
        ),  # fmt: skip
        (["hardware=h100", "model.context_len=8192"], (8192 + 64) / (2 * 8192)),
        (["model.dropout=0"], (64 + 32) / (2 * 64)),  # torch's CPU tile at s 64: 32
        (["model.dropout=0", "model.context_len=256"], (256 + 64) / (2 * 256)),  # from 192: 64
        (["model.dropout=0", "model.context_len=1024"], (1024 + 256) / (2 * 1024)),  # 768: 256
    ],
)
def test_a_fused_kernel_computes_the_causal_half_and_qk_again_in_backward(
    overrides: list[str], share: float
) -> None:
    job, qk, pv = scores_products(*overrides)
    assert computed_share(job, qk) == computed_share(job, pv) == share
    assert (backward_passes(job, qk), backward_passes(job, pv)) == (3, 2)


@pytest.mark.parametrize(
    "overrides",
    [
        ["hardware=h100", "model.context_len=8192", "trainer.attention=math"],
        ["model.dropout=0.1"],  # torch's CPU flash kernel takes no dropout: the math path
    ],
)
def test_the_math_path_computes_the_whole_square_and_keeps_it(overrides: list[str]) -> None:
    job, qk, pv = scores_products(*overrides)
    assert computed_share(job, qk) == computed_share(job, pv) == 1
    assert (backward_passes(job, qk), backward_passes(job, pv)) == (2, 2)


def test_the_ring_computes_its_own_block_whole_and_keeps_no_scores() -> None:
    job, qk, pv = scores_products("hardware=h100", "parallel.cp=2", "model.context_len=8192")
    assert computed_share(job, qk) == 1 and backward_passes(job, qk) == 3


def saved_bytes(kernel: str) -> int:
    """What one forward of a 1-block decoder (dropout 0) leaves for backward, each storage once."""
    cfg, _ = compose_job("model.n_layers=1", "model.dropout=0")
    torch.manual_seed(0)
    model = instantiate(cfg.model)
    use_attention_kernel(model, kernel)
    held: dict[int, int] = {}

    def keep(t: torch.Tensor) -> torch.Tensor:
        held[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda t: t):
        model(torch.randint(0, cfg.data.vocab_size, (2, 64)))
    return sum(held.values())


def test_trainer_attention_math_runs_the_math_path_which_keeps_the_scores() -> None:
    """The math path keeps the softmax weights, 2 samples x 4 heads x 64 x 64 in fp32, where
    flash keeps their log-sum-exp, one a query; the rest alike."""
    b, heads, s = 2, 4, 64
    assert saved_bytes("math") - saved_bytes("auto") == b * heads * s * s * 4 - b * heads * s * 4
