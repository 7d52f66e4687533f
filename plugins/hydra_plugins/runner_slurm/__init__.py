"""Hydra's submitit launcher, asking SLURM for what each job's mesh needs, and waiting for all.

The submitit launcher submits a sweep as one job array: every job gets the same resources, fixed
in the preset. A sweep over layouts (`parallel.dp=1,2 parallel.tp=1,2`) needs 1 to 4 processes,
so each job here is submitted on its own, asking for its mesh: `hardware.nodes` nodes with one task
per device on each (the tasks are the job's ranks, as under `srun --ntasks-per-node`), a CPU per
rank's thread, a GPU per task on GPU hardware. A value set in the preset or on the command line
(`hydra.launcher.cpus_per_task=4`) wins over what the mesh asks.

SLURM's warning `signal_delay_s` before the time limit is SIGUSR1, the runner's preemption signal
(runner/launcher/preemption.py), not submitit's USR2, which the runner does not answer: the job
snapshots, requeues itself and, given `resume=auto`, continues its run when SLURM starts it again.

The submitit launcher stops at the first failed job, leaving the sweep's parent run to end while
later jobs still train, and without SLURM's accounting (sacct) it never sees a job end that left
no result; here every job is waited for until squeue no longer lists it, and a failed one is
returned FAILED, named, for the sweeper to report once the others have finished. Selected by
`hydra/launcher=slurm`.
"""

# No `from __future__ import annotations`: Hydra runs this module without registering it, and
# dataclasses then cannot resolve string annotations.
import logging
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf, SlurmQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher
from omegaconf import OmegaConf

from runner.errors import SweepJobFailed
from runner.launcher import preemption

log = logging.getLogger(__name__)
OWN_KEYS = ("submitit_folder", "max_num_timeout", "signal_delay_s")  # not sbatch parameters


@dataclass
class RunnerSlurmConf(SlurmQueueConf):
    _target_: str = "hydra_plugins.runner_slurm.MeshSlurmLauncher"
    # null: what the job's mesh needs (MeshSlurmLauncher.asks)
    nodes: int | None = None  # type: ignore[assignment]
    tasks_per_node: int | None = None  # type: ignore[assignment]
    cpus_per_task: int | None = None


ConfigStore.instance().store(group="hydra/launcher", name="runner_slurm", node=RunnerSlurmConf)


class MeshSlurmLauncher(SlurmLauncher):
    def asks(self, overrides: Sequence[str]) -> dict[str, Any]:
        """The job's resources: its mesh's, where the preset leaves them null."""
        from runner.mesh import resolve

        cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
        resolve(cfg)  # fills hardware.devices from the mesh's sizes
        hw = cfg.hardware
        mesh = {
            "nodes": hw.nodes,
            "tasks_per_node": hw.devices,
            "cpus_per_task": hw.threads_per_rank or 1,
            "gpus_per_node": hw.devices if hw.accelerator == "gpu" else None,
        }
        return {k: v for k, v in mesh.items() if self.params.get(k) is None and v is not None}

    def executor(self, overrides: Sequence[str]) -> Any:
        """submitit's executor for one job: the preset's parameters, the mesh's resources, and
        SIGUSR1 (not submitit's USR2) signal_delay_s before the time limit."""
        import submitit

        shared = set(OmegaConf.structured(BaseQueueConf).keys())
        given = {k: v for k, v in self.params.items() if k not in OWN_KEYS and v is not None}
        signal = {"signal": f"{preemption.SIGNAL.name[3:]}@{self.params['signal_delay_s']}"}
        given["additional_parameters"] = signal | given.get("additional_parameters", {})
        executor = submitit.AutoExecutor(
            cluster="slurm",
            folder=self.params["submitit_folder"],
            slurm_max_num_timeout=self.params["max_num_timeout"],
        )
        executor.update_parameters(
            **{k if k in shared else f"slurm_{k}": v for k, v in given.items()},
            **self.asks(overrides),
        )
        return executor

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        jobs = []
        for idx, overrides in enumerate(job_overrides, initial_job_idx):
            job = self.executor(overrides).submit(
                self, list(overrides), "hydra.sweep.dir", idx, f"job_id_for_{idx}",
                Singleton.get_state(),
            )  # fmt: skip
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}: SLURM job {job.job_id}")
            jobs.append((idx, overrides, job))
        return [self.outcome(*job) for job in jobs]

    def outcome(self, idx: int, overrides: Sequence[str], job: Any) -> JobReturn:
        """Task 0's return (the rank that owns the run: FAILED when its job raised), or FAILED and
        named when SLURM's job ended without one."""
        first = job.task(0)
        while not first.done() and active(job.job_id):
            time.sleep(POLL_S)
        if first.paths.result_pickle.exists():
            return first.result()
        failed = JobReturn(overrides=list(overrides), status=JobStatus.FAILED)
        failed.return_value = SweepJobFailed(
            f"job #{idx} ({' '.join(filter_overrides(overrides))}) failed as SLURM job "
            f"{job.job_id}: see {first.paths.stderr}"
        )
        return failed


ACTIVE = {"PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED", "REQUEUED",
          "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT"}  # fmt: skip
POLL_S = 1.0  # how often squeue is asked, as submitit's own watcher would


def active(job_id: str) -> bool:
    """SLURM still runs the job, or will (requeued). From squeue: submitit asks sacct, which a
    cluster without accounting cannot answer, and would wait for ever for a job that left no
    result (a task killed, a bad-input exit)."""
    listed = subprocess.run(
        ["squeue", "-h", "-j", str(job_id), "-o", "%T"], capture_output=True, text=True
    )
    return bool(set(listed.stdout.split()) & ACTIVE)
