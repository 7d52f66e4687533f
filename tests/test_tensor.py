"""Tensor parallelism and the combined layouts: each equals the single-process run, every
collective is counted and matches the formula exactly; bad meshes are refused before launch."""

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from runner import validate
from runner.job import Job, resolve_job
from runner.layouts import traffic
from runner.mesh import Mesh, mesh_of
from runner.metrics import COMM_BYTES_PER_STEP, IDLE_FRACTION, STEP_TIME, prediction
from runner.planner.memory import GIB, largest_layer_gib, memory_per_device_gib, params_per_device
from tests.helpers.in_process import Cli
from tests.helpers.jobs import QUICK, compose_job, train
from tests.helpers.metrics import assert_registered
from tests.helpers.records import (
    all_runs,
    assert_redone_steps_repeat,
    forget_snapshots_of_step,
    loss_series,
    losses_by_step,
)

STEPS = 8
RELATIVE = 1e-5  # fp32: shards' partial sums and replicas' gradients add in another order
COMMON = [f"trainer.max_steps={STEPS}", "data.batch_size=16"]
# Small, so that 4 processes on 2 cores stay quick; the FFNN's 4 layers give each of 2 pipeline
# stages one column/row pair.
MODELS = {
    "decoder": ["model=decoder", "model.d_model=32", "model.n_layers=2", "model.dropout=0"],
    "ffnn": ["model=ffnn", "model.hidden=[64,64,64]"],
}
LAYOUTS = {  # the preset, and the mesh dimensions whose bytes the run must count
    "tensor": ["tp"],
    "dp_tp": ["dp", "tp"],
    "dp_pp": ["dp", "pp"],
    "pp_tp": ["pp", "tp"],
}
# Every layout snapshots at steps 4 and 8 into a folder of its own, so that resume=auto finds
# its own; with step 8 removed, the resumed decoders redo steps 5 to 8.
SNAPSHOTS = [
    "checkpoint.every_n_steps=4",
    "checkpoint.dir='snapshots/${parallel.dp}x${parallel.pp}x${parallel.tp}'",
]
LAYOUT_TAGS = {
    "tensor": "tensor",
    "dp_tp": "data+tensor",
    "dp_pp": "data+pipeline",
    "pp_tp": "pipeline+tensor",
}


@pytest.mark.slow
@pytest.mark.parametrize("model", ["decoder", "ffnn"])
def test_every_mesh_equals_the_single_process_run_and_counts_its_collectives(
    store: str, tmp_path: Path, cli: Cli, model: str
) -> None:
    job = [*MODELS[model], *COMMON]
    single = loss_series(store, train(*job))
    # The decoder's tp alone (its vocabulary split too) is the next test's job but for
    # vocab_parallel; dp_tp and pp_tp split its vocabulary here, and resume it.
    presets = LAYOUTS if model == "ffnn" else {k: v for k, v in LAYOUTS.items() if k != "tensor"}
    run_every_mesh(cli, tmp_path, store, presets, *job, *SNAPSHOTS)
    if model == "decoder":
        forget_snapshots_of_step(tmp_path / "snapshots", STEPS)
        run_every_mesh(cli, tmp_path, store, presets, *job, *SNAPSHOTS, "resume=auto")
    # The jobs of more than one process (the sweep's parent run has no world size).
    runs = {
        r.data.tags["parallel"]: r
        for r in all_runs(store)
        if r.data.tags.get("world_size", "1") != "1"
    }
    assert set(runs) == {LAYOUT_TAGS[preset] for preset in presets}
    for preset, dims in presets.items():
        run = runs[LAYOUT_TAGS[preset]]
        losses = losses_by_step(store, run.info.run_id)
        assert losses == pytest.approx(single, rel=RELATIVE), preset
        if model == "decoder":
            assert_redone_steps_repeat(store, run.info.run_id, range(4, STEPS))
        m = run.data.metrics
        # The decoder's vocabulary is split over tp (parallel.vocab_parallel, the default): its
        # embedding's, output layer's and loss's collectives are in both figures.
        for dim in dims:  # measured from the collectives that ran, predicted from the formulas
            key = f"comm_bytes_per_step/{dim}"
            assert m[key] == m[f"pred/{key}"], (preset, key)
        assert {k.split("/")[1] for k in m if k.startswith("comm_bytes")} == set(dims), preset
        assert (
            m[prediction(STEP_TIME.name)] > 0 and 0 < m[prediction(IDLE_FRACTION.name)] < 1
        )  # from the profile
        world = int(run.data.tags["world_size"])
        for rank in range(world):
            assert 0 < m[f"rank_{rank}/comm_time_s"] < m[STEP_TIME.name]
        assert_registered(run)


def run_every_mesh(cli: Cli, tmp_path: Path, store: str, presets: dict, *job: str) -> None:
    swept = ",".join(p for p in presets if p != "tensor")
    done = cli("-m", *job, *QUICK, f"parallel={swept}", f"logger.tracking_uri={store}",
               cwd=tmp_path)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    if "tensor" in presets:
        done = cli(*job, *QUICK, "parallel=tensor", "hardware.devices=2", cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.slow
def test_without_vocab_parallelism_only_the_blocks_all_reduce(
    store: str, tmp_path: Path, cli: Cli
) -> None:
    """parallel.vocab_parallel=false: every rank holds the whole embedding and computes every
    logit, so only the blocks' all-reduces run, as before vocabulary parallelism."""
    job = [*MODELS["decoder"], *COMMON]
    single = loss_series(store, train(*job))
    split = ["parallel=tensor", "hardware.devices=2", "parallel.vocab_parallel=false"]
    done = cli(*job, *QUICK, *split, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = [r for r in all_runs(store) if r.data.tags.get("world_size") == "2"]
    assert losses_by_step(store, run.info.run_id) == pytest.approx(single, rel=RELATIVE)
    m = run.data.metrics
    # 2 all-reduces forward and 2 backward per block, each of b*s*h = 16 x 64 x 32 fp32 values
    # (seq_len: the context, 64), 2 blocks. With the vocabulary split: +16 x 64 x (2 x 32 + 3).
    blocks_only = 4 * 2 * 16 * 64 * 32 * 4
    assert (
        m[COMM_BYTES_PER_STEP.at(dim="tp")]
        == m[prediction(COMM_BYTES_PER_STEP.at(dim="tp"))]
        == blocks_only
    )


def planned_tp8(*overrides: str) -> Job:
    cfg, _ = compose_job(
        "mode=plan", "model=decoder", "model.n_heads=8", "model.n_layers=2", "parallel.tp=8",
        *overrides,
    )  # fmt: skip
    validate.validate(cfg)
    return resolve_job(cfg)


def test_vocab_parallelism_splits_the_embedding_and_adds_its_collectives() -> None:
    """The decoder at tp=8: vocabulary V = 2,048, d_model h = 128, 2 blocks, a batch of b = 32
    samples of s = 64 tokens (the text data's defaults).

    Parameters per rank: the embedding's V/8 rows, 2,048 x 128 / 8 = 32,768; a block's split
    layers hold 1/8 (Q, K, V: 3 x (2,048 + 16); output: 2,048 + 128; FFN: 8,192 + 64 + 8,192
    + 128) and its norms are whole (4 x 128): 25,456. So 32,768 + 2 x 25,456 = 83,680; with
    the embedding whole, 262,144 + 50,912 = 313,056.

    tp bytes per step: the blocks' 4 all-reduces of b*s*h = 262,144 values each, 2 blocks, fp32:
    8,388,608 bytes. The vocabulary's, fp32 at every precision: the embedding's forward
    all-reduce and the output layer's backward one (b*s*h each), loss_parallel's three of b*s
    (max, sum of exponentials, target logit): 2,048 x (256 + 3) x 4 = 2,121,728 bytes. Calls: 8
    and 5. In bf16-mixed the blocks' forward halves are 16-bit: 6,291,456 + 2,121,728."""
    split, whole = planned_tp8(), planned_tp8("parallel.vocab_parallel=false")
    assert (params_per_device(split), params_per_device(whole)) == (83_680, 313_056)
    # The largest layer is the embedding's shard, with fp32 weight, gradient and 2 Adam moments.
    assert largest_layer_gib(split) * GIB == 32_768 * 16
    moved = traffic(split)
    assert (moved.payload["tp"], moved.calls["tp"]) == (8_388_608 + 2_121_728, 8 + 5)
    assert (traffic(whole).payload["tp"], traffic(whole).calls["tp"]) == (8_388_608, 8)
    bf16 = traffic(planned_tp8("trainer.precision=bf16-mixed")).payload["tp"]
    assert bf16 == 6_291_456 + 2_121_728
    # The fp32 logits of the last stage: b*s*V/8 rather than b*s*V values.
    held = [memory_per_device_gib(job)["activations"] * GIB for job in (whole, split)]
    assert held[0] - held[1] == 32 * 64 * (2_048 - 256) * 4


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["parallel=tensor", "hardware.devices=3"], "model.n_heads"),  # 4 heads
        (
            ["model=ffnn", "model.hidden=[63,32]", "parallel=tensor", "hardware.devices=2"],
            "model.hidden[0]",
        ),
        (["model=neuron", "parallel=tensor", "hardware.devices=2"], "parallel.tp"),
        (["model=ffnn", "model.hidden=[]", "parallel=tensor", "hardware.devices=2"], "parallel.tp"),
        (["parallel=dp_tp", "hardware.devices=2"], "parallel"),  # 2 x 2 is not 2
        (["parallel.dp=2", "parallel.pp=2", "hardware.devices=2"], "parallel"),
        (["parallel=data", "parallel.tp=3", "hardware.devices=4"], "hardware.devices"),
        (["parallel.dp=null", "parallel.tp=null", "hardware.devices=4"], "parallel.tp"),
        (
            ["parallel=dp_pp", "data.batch_size=32", "parallel.microbatches=5"],
            "parallel.microbatches",
        ),
        (["parallel.tp=0"], "parallel.tp"),
    ],
)
def test_bad_meshes_are_refused_before_launch(overrides: list[str], key: str) -> None:
    cfg, _ = compose_job(*overrides)
    with pytest.raises(validate.ConfigError) as error:
        validate.validate(cfg)
    assert error.value.key == key


@pytest.mark.parametrize(
    ("overrides", "mesh", "devices"),
    [
        (["parallel.dp=2", "parallel.tp=2"], Mesh(dp=2, tp=2), 4),  # the mesh sets the processes
        (["parallel=tensor", "hardware.devices=2"], Mesh(tp=2), 2),
        (["parallel=data", "parallel.tp=2", "hardware.devices=4"], Mesh(dp=2, tp=2), 4),
        (["parallel=pp_tp"], Mesh(pp=2, tp=2), 4),
        (["parallel=data"], Mesh(), 1),  # data parallelism on one device is the plain run
    ],
)
def test_a_null_size_takes_the_devices_the_others_leave(
    overrides: list[str], mesh: Mesh, devices: int
) -> None:
    cfg, _ = compose_job(*overrides)
    validate.validate(cfg)
    assert (mesh_of(cfg), cfg.hardware.devices) == (mesh, devices)


def test_tensor_ranks_are_neighbours_and_share_the_data() -> None:
    """Megatron's order: tp innermost, then cp, dp, pp; only the dp index picks a data shard."""
    mesh = Mesh(pp=2, dp=2, tp=2, cp=2)
    assert [tuple(mesh.coords(r).values()) for r in range(16)] == [
        (p, d, c, t) for p in range(2) for d in range(2) for c in range(2) for t in range(2)
    ]
    assert all(mesh.rank(**mesh.coords(r)) == r for r in range(16))
    assert mesh.layout == "data+pipeline+context+tensor"
    assert (mesh.size("dp"), mesh.size("sp"), mesh.size("cp")) == (4, 2, 2)  # cp sums with dp


def test_the_layout_presets_are_complete_meshes() -> None:
    for preset, world in {"dp_tp": 4, "dp_pp": 4, "pp_tp": 4, "dp_cp": 4, "none": 1}.items():
        cfg, _ = compose_job(f"parallel={preset}")
        validate.validate(cfg)
        assert OmegaConf.select(cfg, "hardware.devices") == world, preset


def test_under_torchrun_a_null_device_count_is_what_it_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")
    monkeypatch.setenv("WORLD_SIZE", "4")
    cfg, _ = compose_job("parallel=tensor", "hardware.nodes=2")
    validate.validate(cfg)
    assert (mesh_of(cfg), cfg.hardware.devices) == (Mesh(tp=4), 2)
    cfg, _ = compose_job("parallel=dp_tp", "parallel.dp=1")  # a mesh of 2, 4 processes started
    with pytest.raises(validate.ConfigError) as error:
        validate.validate(cfg)
    assert error.value.key == "parallel"
