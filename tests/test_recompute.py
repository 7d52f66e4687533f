"""Activation recomputation (trainer.recompute): the same losses as without it in every layout,
the bytes autograd holds for backward against the planner's count, and tensor parallelism's
extra all-reduces, exactly. The peak a run measures against the predicted drop: the recompute
study (tests/test_studies.py)."""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from runner.job import resolve_job
from runner.metrics import COMM_BYTES_PER_STEP, prediction
from runner.models.registry import spec_for
from runner.planner import predict
from runner.planner.memory import activation_bytes
from runner.training.rank import build_model
from runner.validate import validate
from tests.helpers.held import held
from tests.helpers.in_process import Cli
from tests.helpers.jobs import QUICK, compose_job, train
from tests.helpers.records import all_runs, loss_series, losses_by_step

MODES = ("full", "selective")
EXACT = 1e-6  # recomputation repeats the same arithmetic on the same values (and dropout masks)
PARALLEL = 1e-5  # a layout's partial sums add in another order (tests/test_tensor.py)
SMALL = {  # small enough for 4 processes on 2 cores
    "decoder": ["model=decoder", "model.d_model=32", "model.n_layers=2"],
    "ffnn": ["model=ffnn", "model.hidden=[64,64,64]"],  # a column/row pair per pipeline stage
}
STEPS = ["trainer.max_steps=8", "data.batch_size=16", "trainer.val_batches=0"]


@pytest.mark.slow
@pytest.mark.parametrize("model", ["decoder", "ffnn"])
def test_recomputing_changes_no_loss(store: str, model: str) -> None:
    # The decoder with its dropout: checkpoint restores the RNG state, the same masks come back.
    job = [*SMALL[model], *STEPS]
    plain = loss_series(store, train(*job))
    for mode in MODES:
        again = loss_series(store, train(*job, f"trainer.recompute={mode}"))
        assert again == pytest.approx(plain, rel=EXACT), mode


@pytest.mark.parametrize("model", ["decoder", "ffnn"])
def test_recomputing_keeps_every_name(model: str) -> None:
    # A snapshot of one mode resumes in another: the units' forward is wrapped, not the units.
    def names(mode: str) -> tuple[list[str], list[str]]:
        cfg, _ = compose_job(f"model={model}", f"trainer.recompute={mode}")
        built = build_model(cfg, spec_for(cfg.model))
        return list(built.state_dict()), [name for name, _ in built.named_parameters()]

    assert names("full") == names("selective") == names("none")


def planned_activations(*overrides: str) -> dict[str, float]:
    """The planner's activation bytes for the job, per mode."""
    cfg, _ = compose_job(*overrides)
    validate(cfg)
    planned = {}
    for mode in ("none", *MODES):
        cfg.trainer.recompute = mode
        planned[mode] = activation_bytes(resolve_job(cfg))
    return planned


def measure(*overrides: str) -> dict[str, float]:
    return {mode: held(list(overrides), mode) for mode in ("none", *MODES)}


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="counts glibc's malloc")
def test_the_planner_counts_what_autograd_holds_for_backward() -> None:
    # The default decoder (batch 32, sequence 64, d_model 128, 4 heads, 2 blocks, dropout 0.1)
    # in fp32. One block without recomputation is Korthikanti's (34 + 5as/h) sbh bytes at 16 bits
    # (22 MiB here), the logits' log-probabilities 16 MiB. Measured: none 56.2 MiB of 60
    # predicted, selective 44.1 of 42 (what the policy keeps: a block's input, its products'
    # outputs and the scores' product), full 20.1 MiB of 18: the spec's full figure is the
    # peak of backward, which
    # also holds one block's whole set while it recomputes; at the end of forward that set is
    # not there yet. What the planner does not count: the embedding's dropout mask and the
    # output layer's input (1.3 MiB), under its rounding of Korthikanti's 34 (12 sbh saved of
    # 17 a block, dropout masks 1 byte rather than 2).
    decoder = ["model=decoder"]
    measured, planned = measure(*decoder), planned_activations(*decoder)
    block = planned["none"] - planned_activations(*decoder, "model.n_layers=1")["none"]
    planned["full"] -= block  # the end of forward: no block recomputed yet
    for mode, kept in measured.items():
        assert 0.85 < kept / planned[mode] < 1.15, (mode, kept, planned[mode])
    assert measured["full"] < measured["selective"] < measured["none"]
    # The FFNN (default widths 64, 64, 32, 10) at batch 4096, so that its tensors outweigh
    # malloc's bookkeeping: one value per width and sample (each Linear's input is the output
    # the activation before it saved). Full keeps each Linear's input: the same. Selective
    # keeps each product's output besides. Measured within 1 % of each.
    ffnn = ["model=ffnn", "data.batch_size=4096"]
    measured, planned = measure(*ffnn), planned_activations(*ffnn)
    for mode, kept in measured.items():
        assert kept == pytest.approx(planned[mode], rel=0.02), mode


def comm(run: object) -> tuple[float, float]:
    m = run.data.metrics  # type: ignore[attr-defined]
    return m[COMM_BYTES_PER_STEP.at(dim="tp")], m[prediction(COMM_BYTES_PER_STEP.at(dim="tp"))]


def tp_bytes_without_recompute(*job: str) -> float:
    cfg, _ = compose_job(*job)
    validate(cfg)
    return predict(resolve_job(cfg))[prediction(COMM_BYTES_PER_STEP.at(dim="tp"))]


# Each layout with a mode: data x tensor with selective; the decoder's 3-D mesh (its tied
# embedding summed between the first and last stages of DDP-wrapped, vocabulary-split shards)
# with full.
THREE_D = ["parallel=pp_tp", "parallel.dp=2", "parallel.microbatches=2"]
LAYOUTS = {
    "decoder": [("data+tensor", ["parallel=dp_tp"], "selective"), ("data+pipeline+tensor",
                THREE_D, "full")],
    "ffnn": [("data+tensor", ["parallel=dp_tp"], "full")],
}  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("model", ["decoder", "ffnn"])
def test_every_layout_recomputes_to_the_same_losses_and_counts_its_bytes(
    store: str,
    tmp_path: Path,
    model: str,
    cli: Cli,
) -> None:
    job = [*SMALL[model], "model.dropout=0" if model == "decoder" else "seed=0", *STEPS]
    single = loss_series(store, train(*job))
    for _, layout, mode in LAYOUTS[model]:
        done = cli(*job, *QUICK, *layout, f"trainer.recompute={mode}", cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
    runs = {r.data.tags["parallel"]: r for r in all_runs(store) if r.data.tags["world_size"] != "1"}
    for tag, layout, mode in LAYOUTS[model]:
        run = runs[tag]
        assert losses_by_step(store, run.info.run_id) == pytest.approx(single, rel=PARALLEL), tag
        m = run.data.metrics  # every collective that ran, in every dimension, against the formula
        moved = [k for k in m if k.startswith("comm_bytes_per_step/")]
        assert len(moved) == tag.count("+") + 1 and all(m[k] == m[f"pred/{k}"] for k in moved)
        # Selective saves the all-reduces' outputs (the probe counts none replayed). Full re-runs
        # the decoder's 2 forward all-reduces of b*s*h a block, per step and tp rank: b = 16/dp
        # samples, s = 64, h = 32, 2 blocks over 2 stages. The FFNN's row layers all-reduce in
        # DTensor's output hooks, outside the forward recomputation re-runs: no bytes more.
        again = 2 * 8 * 64 * 32 * 2 * 4 / 2 if (model, mode) == ("decoder", "full") else 0
        assert comm(run)[1] == tp_bytes_without_recompute(*job, *layout) + again


@pytest.mark.slow
def test_full_recomputation_all_reduces_again_at_autocast_precision(
    store: str,
    tmp_path: Path,
    cli: Cli,
) -> None:
    # In bf16-mixed each block all-reduces b*s*h twice forward in 16 bits, twice backward in 32
    # (the fp32 stream's gradients) and, recomputing, twice more in 16 bits: 16 bytes a value,
    # what fp32 sends without recomputation (the vocabulary's collectives are fp32 in both).
    job = [*SMALL["decoder"], "model.dropout=0", *STEPS, "parallel=tensor", "hardware.devices=2"]
    done = cli(*job, *QUICK, "trainer.recompute=full", "trainer.precision=bf16-mixed", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = all_runs(store)
    measured, predicted = comm(run)
    assert measured == predicted == tp_bytes_without_recompute(*job)
    # In fp32: 2 more all-reduces of b*s*h a block (b = 16 samples, s = 64, h = 32, 2 blocks).
    cfg, _ = compose_job(*job, "trainer.recompute=full")
    validate(cfg)
    fp32 = predict(resolve_job(cfg))[prediction(COMM_BYTES_PER_STEP.at(dim="tp"))]
    assert fp32 == tp_bytes_without_recompute(*job) + 2 * 16 * 64 * 32 * 2 * 4


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (["trainer.recompute=some"], "none, full, selective"),
        (
            [
                "parallel=pipeline", "hardware.devices=2", "model.n_layers=4",
                "parallel.schedule=zero_bubble", "parallel.virtual_stages=2",
                "trainer.recompute=full",
            ],
            "zero_bubble",
        ),
    ],
)  # fmt: skip
def test_bad_recompute_is_refused_in_one_line(
    tmp_path: Path,
    overrides: list[str],
    named: str,
    cli: Cli,
) -> None:
    done = cli(*overrides, cwd=tmp_path)
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: trainer.recompute:") and named in line, line
