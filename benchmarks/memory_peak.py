"""The planner's memory per device against the peaks measured here, layout by layout and
precision by precision: the suite's layouts of a 3.7 M-parameter decoder (d_model 256, 4 blocks,
dropout 0.1, batch 8) in fp32, and a layout of each kind in bf16-true, fp8 and bf16-mixed, 6 steps
each. Measured: `peak_allocated_gib`, the tensors' bytes at the step's sampled peak (the CPU's
counterpart of CUDA's allocated peak: docs/measurement.md) with the math library's workspace, and
`activations_gib`. Prints planned / measured for each; the target is every pair within 15 % of
the measured peak.

The planner's peak is the largest of the step's moments (runner/planner/memory.py), the
workspace this host's calibration measured at the job's precision resident in each.

Usage: .venv/bin/python -m benchmarks.memory_peak [sweep index ...]
"""

from __future__ import annotations

import sys
import tempfile

from benchmarks.common import QUIET, ratio_line, runner, training_runs
from runner.metrics import HELD_FOR_BACKWARD, PEAK_ALLOCATED, PEAK_MEMORY, prediction
from runner.planner.host_figures import Calibrated, Host, load

JOB = ["model=decoder", "model.d_model=256", "model.n_layers=4",
       "data.batch_size=8", "trainer.max_steps=6", "trainer.warmup_steps=2",
       "trainer.val_every_n_steps=100", *QUIET]  # fmt: skip
# Priced by this host's own figures (hardware.figures=host: calibrated once a precision and
# kept), as the math library's workspace is the CPU's: a CPU whose bf16 products go through
# oneDNN keeps 7 MiB of its kernels and buffers (conf/hardware/cpu.yaml), the AVX2-only EPYC
# half a MiB (its calibration, 2026-12-07), where the profile's 7 MiB put the bf16-true pipeline
# 23 % over its measured peak. mode=calibrate measures 32-true and bf16-mixed loops; bf16-true's
# and fp8's products are bf16 too, and take the bf16-mixed calibration's workspace (the
# bf16-mixed sweeps run first).
HOST = "hardware.figures=host"
CALIBRATES = ("32-true", "bf16-mixed")
SWEEPS = [
    ["parallel=none", "trainer.recompute=none,full,selective"],
    ["parallel=data", "hardware.devices=2", "parallel.shard=none,optimizer,gradients,full"],
    ["parallel=pipeline", "hardware.devices=2", "parallel.microbatches=4",
     "parallel.schedule=gpipe,1f1b"],
    ["parallel=tensor", "hardware.devices=2", "parallel.sequence_parallel=false,true",
     "trainer.recompute=none,selective"],
    ["parallel=none", "model.dropout=0", "trainer.recompute=none,selective"],  # fused attention
    ["parallel=none", "parallel.microbatches=4"],  # gradient accumulation
    ["parallel=pipeline", "hardware.devices=2", "parallel.microbatches=4",
     "parallel.schedule=interleaved_1f1b", "parallel.virtual_stages=2"],
    ["parallel=cp", "hardware.devices=2"],
    ["model=moe", "parallel=ep", "hardware.devices=2"],
    ["parallel=fsdp_tp", "hardware.devices=4"],
    ["parallel=pp_tp", "hardware.devices=4", "parallel.microbatches=4"],
    # 16-bit weights over fp32 masters (FSDP2 on every replica), float8 linear layers over them
    ["parallel=none", "trainer.precision=bf16-true,fp8"],
    ["parallel=data", "hardware.devices=2", "parallel.shard=optimizer,full",
     "trainer.precision=bf16-true,fp8"],
    ["parallel=tp_sp", "hardware.devices=2", "trainer.precision=bf16-true"],
    ["parallel=fsdp_tp", "hardware.devices=4", "trainer.precision=bf16-true"],
    ["parallel=pipeline", "hardware.devices=2", "parallel.microbatches=4",
     "trainer.precision=bf16-true"],
    ["parallel=cp", "hardware.devices=2", "parallel.shard=optimizer",
     "trainer.precision=bf16-true"],
    ["model=moe", "parallel=ep", "hardware.devices=2", "parallel.shard=optimizer",
     "trainer.precision=bf16-true"],
    # autocast over fp32 weights
    ["parallel=none", "trainer.precision=bf16-mixed"],
    ["parallel=data", "hardware.devices=2", "parallel.shard=none,full",
     "trainer.precision=bf16-mixed"],
    ["parallel=tp_sp", "hardware.devices=2", "trainer.precision=bf16-mixed"],
]  # fmt: skip
SHOWN = ("model", "parallel", "parallel.shard", "parallel.schedule", "parallel.microbatches",
         "trainer.recompute", "parallel.sequence_parallel", "model.dropout",
         "trainer.precision")  # fmt: skip


def precisions(sweep: list[str]) -> list[str]:
    said = [o.split("=", 1)[1] for o in sweep if o.startswith("trainer.precision=")]
    return said[0].split(",") if said else ["32-true"]


def bf16_workspace() -> list[str]:
    """This host's bf16 workspace, from its bf16-mixed calibration, for bf16-true and fp8 jobs."""
    host = Host.here(None)  # the profile's threads a rank (hardware=cpu: all cores)
    paths = [Calibrated("cpu", "decoder", "bf16-mixed", bool(split)).path(host) for split in (0, 1)]
    if not any(path.is_file() for path in paths):  # no bf16-mixed sweep chosen: calibrate apart
        with tempfile.TemporaryDirectory() as scratch:
            runner(*JOB, HOST, "trainer.precision=bf16-mixed", "trainer.max_steps=3", cwd=scratch)
    kept = [load(path) for path in paths]
    mib = next(k for k in kept if k)["figures"]["workspace_mib"]["bf16"]
    return [f"hardware.workspace_mib.bf16={mib}", f"hardware.workspace_mib.fp8={mib}"]


def main() -> None:
    only = [int(i) for i in sys.argv[1:]]  # sweeps by index (all by default)
    chosen = [s for i, s in enumerate(SWEEPS) if not only or i in only]
    calibrated = [s for s in chosen if set(precisions(s)) <= set(CALIBRATES)]
    with tempfile.TemporaryDirectory() as tmp:
        for sweep in calibrated:
            runner("-m", *JOB, HOST, *sweep, cwd=tmp)
        for sweep in [s for s in chosen if s not in calibrated]:
            runner("-m", *JOB, *bf16_workspace(), *sweep, cwd=tmp)
        runs = training_runs(tmp)
    print("| layout | planned MiB | measured MiB | planned / measured | activations planned"
          " / measured |\n|---|---:|---:|---:|---:|")  # fmt: skip
    ratios = []
    for run in runs:
        m, p = run.data.metrics, run.data.params
        name = " ".join(f"{k.split('.')[-1]}={p.get(k, run.data.tags.get(k))}" for k in SHOWN)
        planned, measured = m[prediction(PEAK_MEMORY.name)], m[PEAK_ALLOCATED.name]
        acts = m.get(HELD_FOR_BACKWARD.name)
        ratios.append(planned / measured)
        share = (
            f"{m[prediction(HELD_FOR_BACKWARD.name)] / acts:.2f}" if acts else "n/a (a schedule)"
        )
        print(f"| {name} | {planned * 1024:.1f} | {measured * 1024:.1f} | {planned / measured:.2f}"
              f" | {share} |")  # fmt: skip
    worst = max(ratios, key=lambda r: abs(r - 1))
    print(ratio_line("memory: the worst planned / measured peak", worst, "0.85 to 1.15"))


if __name__ == "__main__":
    main()
