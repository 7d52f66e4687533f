"""A real one-node SLURM cluster for the tests, from Debian's `slurm-wlm` and `munge`: munged,
slurmctld and slurmd with a generated slurm.conf (the node on 127.0.0.1, Linux process tracking,
no task plugin, consumable CPUs, this host's CPUs, a scheduler's pass every second; keys,
state, spool, logs and sockets in a temporary folder). Needs root (slurmd starts jobs as their
user); where it cannot start, the tests skip with one line saying why.

The daemons run in the foreground as this process's children, each in its own session, and are
killed with it however it ends. On the way out every job is cancelled and its steps (slurmstepd
leaves slurmd's session) end before the daemons do; whatever of the cluster is left is killed,
and a survivor is an error.

By hand: `sudo .venv/bin/python -m tests.helpers.one_node_slurm` starts one, prints the
SLURM_CONF to export, and stops it on Enter.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from runner.launcher.cluster import free_port
from runner.launcher.lifeline import die_with_parent

DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "sinfo", "srun", "scontrol")
START_S = 60  # the daemons answer in a few seconds here


class Unavailable(RuntimeError):
    """SLURM cannot run here: the one line saying why."""


def unavailable() -> str | None:
    missing = [name for name in DAEMONS if shutil.which(name) is None]
    if missing:
        return f"SLURM is not installed ({', '.join(missing)} missing; .ci/run installs them)"
    if os.geteuid() != 0:
        return "a SLURM cluster needs root here (slurmd starts jobs as their user)"
    return None


def slurm_conf(root: Path, host: str) -> str:
    """One node, one partition, everything under root, every port on 127.0.0.1."""
    return f"""ClusterName=runner-tests
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
AuthType=auth/munge
AuthInfo=socket={root}/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
# A job whose start time passes (a requeued one's) waits for the next pass of the scheduler:
# every 60 s by default (backfill's every 30 s), here every second. Measured: a requeued job
# started 14.4 s after its requeue, 1.4 s with these.
SchedulerParameters=sched_interval=1,bf_interval=1
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
NodeName={host} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""


def wait_until_idle(env: dict[str, str], daemons: list[subprocess.Popen], root: Path) -> None:
    deadline = time.monotonic() + START_S
    while True:
        done = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True)
        if done.stdout.strip() == "idle":
            return
        dead = [d for d in daemons if d.poll() is not None]
        if dead:
            name = dead[0].args[0]
            said = (root / f"{name}.err").read_text().strip().splitlines() or ["no message"]
            raise Unavailable(f"{name} ended (exit code {dead[0].returncode}): {said[-1]}")
        if time.monotonic() > deadline:
            said = done.stderr.strip().splitlines() or [done.stdout.strip()]
            raise Unavailable(f"SLURM's node was not idle within {START_S} s: {said[-1]}")
        time.sleep(0.2)  # polling interval of sinfo


def alive(pid: int) -> bool:
    """Running, or able to: not gone, not a zombie waiting to be reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


SERVING = ("munged", "slurmctld", "slurmd", "slurmscriptd")  # the cluster: alive while it runs


def stragglers(conf: str, but: tuple[str, ...] = SERVING) -> list[str]:
    """This cluster's live processes other than its daemons (`but`): job steps (slurmstepd), batch
    scripts, srun, tasks. slurmstepd leaves slurmd's session, so they are found by SLURM_CONF in
    their environment, which each of them inherits."""
    mark, found = f"SLURM_CONF={conf}".encode(), []
    for proc in Path("/proc").iterdir():
        try:
            mine = mark in (proc / "environ").read_bytes().split(b"\0")
            name = (proc / "comm").read_text().strip()
        except (OSError, ValueError):
            continue
        if mine and name not in but and int(proc.name) != os.getpid() and alive(int(proc.name)):
            found.append(f"{proc.name} {name}")
    return found


def cluster_said(env: dict[str, str], lines: int = 30) -> str:
    """The last lines of slurmctld's and slurmd's logs: why a job did not start or end."""
    root = Path(env["SLURM_CONF"]).parent
    said = []
    for daemon in ("slurmctld", "slurmd"):
        log = root / f"{daemon}.log"
        tail = log.read_text(errors="replace").splitlines()[-lines:] if log.exists() else []
        said += [f"--- {daemon}.log", *tail]
    return "\n".join(said)


def until(done: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)  # polling interval
    return True


def stop(env: dict[str, str], daemons: list[subprocess.Popen]) -> None:
    """Cancel every job and let its steps end while the daemons still answer them (a slurmstepd
    outlives its job by a moment, and hangs once slurmd is gone); then kill the daemons' process
    groups and whatever of the cluster is left. Nothing of it survives."""
    conf = env["SLURM_CONF"]
    if all(daemon.poll() is None for daemon in daemons):
        with contextlib.suppress(subprocess.TimeoutExpired):
            subprocess.run(
                ["scancel", "--partition=debug"], env=env, capture_output=True, timeout=10
            )
        until(lambda: not stragglers(conf), 10)
    for daemon in daemons:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(daemon.pid, signal.SIGKILL)
        daemon.wait()
    for left in stragglers(conf, but=()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(left.split()[0]), signal.SIGKILL)
    if not until(lambda: not stragglers(conf, but=()), 10):
        raise RuntimeError(f"SLURM left processes behind: {stragglers(conf, but=())}")


def start(daemon: str, *args: str, env: dict[str, str], root: Path) -> subprocess.Popen:
    """A daemon in the foreground: this process's child, in a session of its own, killed when this
    process ends however it ends; its stderr in root/DAEMON.err."""
    with open(root / f"{daemon}.err", "w") as err:
        return subprocess.Popen(
            [daemon, *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )


@contextlib.contextmanager
def one_node_slurm() -> Iterator[dict[str, str]]:
    """The environment in which sinfo, srun and sbatch reach the cluster (SLURM_CONF set)."""
    why = unavailable()
    if why:
        raise Unavailable(why)
    with tempfile.TemporaryDirectory(prefix="slurm-") as folder:
        root = Path(folder)
        for sub in ("state", "spool"):
            (root / sub).mkdir()
        key = root / "munge.key"
        made = subprocess.run(["mungekey", "-c", "-k", str(key)], capture_output=True, text=True)
        if made.returncode != 0:
            raise Unavailable(f"mungekey failed: {made.stderr.strip()[-200:]}")
        host = socket.gethostname().split(".")[0]
        (root / "slurm.conf").write_text(slurm_conf(root, host))
        env = os.environ | {"SLURM_CONF": str(root / "slurm.conf")}
        daemons: list[subprocess.Popen] = []
        try:
            daemons.append(
                start("munged", "-F", "--force", f"--key-file={key}",
                      f"--socket={root}/munge.sock", f"--pid-file={root}/munged.pid",
                      f"--log-file={root}/munged.log", f"--seed-file={root}/munge.seed",
                      env=env, root=root)
            )  # fmt: skip
            munged = daemons[0]  # slurmctld needs its socket at once
            until(lambda: (root / "munge.sock").exists() or munged.poll() is not None, START_S)
            for daemon in ("slurmctld", "slurmd"):
                daemons.append(start(daemon, "-D", "-f", env["SLURM_CONF"], env=env, root=root))
            wait_until_idle(env, daemons, root)
            yield env
        finally:
            stop(env, daemons)


if __name__ == "__main__":
    try:
        with one_node_slurm() as started:
            print(f"export SLURM_CONF={started['SLURM_CONF']}   # then sinfo, srun, sbatch")
            input("Enter (or Ctrl-C) stops the cluster and every job on it. ")
    except Unavailable as why:
        raise SystemExit(f"error: {why}") from None
    except KeyboardInterrupt:
        pass  # stopped on the way out of the with
