"""`python -m runner`: Hydra's command line, with bad input reported in one line and exit code 2.

Hydra prints its own multi-line errors and exits 1. The runner asks Hydra to raise instead
(HYDRA_FULL_ERROR) and turns configuration errors into one line naming the key; anything else is a
real failure and keeps its traceback. A user who sets HYDRA_FULL_ERROR=1 gets Hydra's full trace.
"""

from __future__ import annotations

import os
import sys
from typing import NoReturn

import hydra
import yaml
from hydra.errors import HydraException, MissingConfigException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from runner.compat.hydra_mode import mode_from_the_command_line
from runner.config import register_configs
from runner.config_dirs import CONF_DIR
from runner.errors import JobFailed, Stopped, SweepJobFailed
from runner.launcher.cluster import external_launcher, global_rank
from runner.launcher.lifeline import listen_to_ctrl_c
from runner.launcher.preemption import EXIT_PREEMPTED, Preempted
from runner.quiet import quiet_third_parties
from runner.studies.catalog import RESOLVER, listed
from runner.tracking import open_sweep
from runner.validate import ConfigError

EXIT_BAD_INPUT = 2


def task(cfg: DictConfig) -> dict[str, float]:
    from hydra.core.hydra_config import HydraConfig

    from runner.app import run_job

    hc = HydraConfig.get()
    try:
        return run_job(cfg, dict(hc.runtime.choices), list(hc.overrides.task))
    except ConfigError as error:
        # SystemExit passes Hydra's job wrapper, which would print its own lines for an Exception.
        fail(str(error))
    except JobFailed as error:
        if not failing_on_purpose(cfg, hc.mode):
            raise
        # Its run is FAILED with what it lost: the study's measurement. The sweep goes on.
        print(f"job #{hc.job.num + 1} failed, as the study expects: {error}", file=sys.stderr)
        return {}


def failing_on_purpose(cfg: DictConfig, mode: RunMode | None) -> bool:
    """A job of a study whose jobs end FAILED (study.ends), run as the study's sweep."""
    study = cfg.get("study")
    return mode == RunMode.MULTIRUN and study is not None and study.ends == "FAILED"


def one_line(error: BaseException) -> str:
    """The key and the reason, from a Hydra or OmegaConf error, on one line."""
    if isinstance(error, MissingConfigException) and error.options:
        group, _, name = (error.missing_cfg_file or "option/?").rpartition("/")
        options = sorted(o for o in error.options if not o.endswith("_schema"))
        return f"{group}={name}: no such option; available: {', '.join(options)}"
    cause = error.__cause__ if isinstance(error.__cause__, OmegaConfBaseException) else error
    said = str(error).splitlines()
    if cause is error and len(said) > 1 and said[0].rstrip().endswith(":"):
        # Hydra's "In 'experiment/x': ConfigKeyError raised while composing config:" and,
        # below it, OmegaConf's reason and the key it names
        keys = [ln.split(":", 1)[1].strip() for ln in said if ln.strip().startswith("full_key:")]
        return f"{keys[0]}: {said[1].strip()}" if keys else said[1].strip()
    key = getattr(cause, "full_key", None)
    message = str(cause).splitlines()[0].strip() if str(cause) else type(cause).__name__
    context = str(error).splitlines()[0].strip() if cause is not error else ""
    line = f"{key}: {message}" if key else message
    return f"{line} ({context})" if context and context not in line else line


def not_yaml(error: yaml.MarkedYAMLError) -> str:
    mark = error.problem_mark or error.context_mark
    where = f"{mark.name}, line {mark.line + 1}" if mark else "a config file"
    return f"{where}: not valid YAML: {error.problem or error.context}"


def fail(message: str) -> NoReturn:
    # Under torchrun or srun every rank finds the same bad input: the first one says it.
    if external_launcher() is None or global_rank() == 0:
        print(f"error: {message}", file=sys.stderr)
    raise SystemExit(EXIT_BAD_INPUT)


# Ctrl-C, a signal to the launcher, a failed rank, a sweep's job that a cluster ended: one line,
# no traceback of the launcher (the ranks printed their own traces).
STOPPED = (KeyboardInterrupt, SweepJobFailed, JobFailed, Stopped)


# Hydra's modes of a command line: it takes one, and says so in a traceback
HYDRA_MODES = {"-m": "--multirun", "--multirun": "--multirun", "-c": "--cfg", "--cfg": "--cfg",
               "-i": "--info", "--info": "--info", "--run": "--run", "-r": "--run",
               "-sc": "--shell-completion", "--shell-completion": "--shell-completion"}  # fmt: skip


def check_one_mode(args: list[str]) -> None:
    asked = sorted({HYDRA_MODES[a] for a in args if a in HYDRA_MODES})
    if len(asked) > 1:
        fail(f"{' and '.join(asked)}: one at a time (--run, --multirun, --cfg, --info)")


def main() -> None:
    check_one_mode(sys.argv[1:])
    listen_to_ctrl_c()
    quiet_third_parties()
    register_configs()
    mode_from_the_command_line()  # one composition of the config, not two (compat/hydra_mode.py)
    OmegaConf.register_new_resolver(RESOLVER, listed, replace=True)  # --help's list of studies
    full_trace = os.environ.get("HYDRA_FULL_ERROR") == "1"  # as Hydra reads it: 0 is off
    os.environ["HYDRA_FULL_ERROR"] = "1"
    entry = hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")(task)
    try:
        entry()
    except (HydraException, OmegaConfBaseException) as error:
        open_sweep.end_failed()  # a sweep that stopped part-way: FAILED, not RUNNING
        if full_trace:
            raise
        fail(one_line(error))
    except yaml.MarkedYAMLError as error:  # a config file of the user's that is not YAML
        open_sweep.end_failed()
        if full_trace:
            raise
        fail(not_yaml(error))
    except BaseException as error:
        open_sweep.end_failed()  # a sweep that stopped part-way: FAILED, not RUNNING
        if isinstance(error, Preempted):  # asked to stop (runner/launcher/preemption.py)
            print(f"stopped: {error}; resume=auto continues its run", file=sys.stderr)
            raise SystemExit(EXIT_PREEMPTED) from None
        if isinstance(error, STOPPED):
            print(f"error: {error or 'interrupted'}", file=sys.stderr)
            raise SystemExit(1) from None
        raise
