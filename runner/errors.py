"""The errors a job ends with: a user's config (it names the key and says what is allowed), a
rank that failed, a launcher told to stop, a sweep's job that a cluster ended. Torch-free: the
command line tells them apart without importing what raised them."""

from collections.abc import Mapping
from typing import Any


class ConfigError(ValueError):
    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key


def require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ConfigError(key, message)


def one_of(value: object, key: str, allowed: tuple[str, ...]) -> None:
    require(value in allowed, key, f"'{value}' is not one of: {', '.join(allowed)}")


def positive(node: Mapping[str, Any], prefix: str, *names: str) -> None:
    for name in names:
        value = node[name]
        require(value > 0, f"{prefix}.{name}", f"must be positive, got {value}")


class SweepJobFailed(RuntimeError):
    """A sweep's job that a cluster ended without its result (killed, cancelled, bad input); its
    log there says why. The sweep reports it, in one line, once the other jobs have finished."""


class JobFailed(RuntimeError):
    """A rank of the job failed; the run is FAILED and names it."""

    def __init__(self, rank: int, why: str) -> None:
        super().__init__(f"rank {rank} failed: {why}")
        self.rank, self.why = rank, why

    def __reduce__(self) -> tuple[type, tuple[int, str]]:  # pickled by a sweep on SLURM
        return JobFailed, (self.rank, self.why)


class Stopped(RuntimeError):
    """The launcher was told to stop by a signal (SIGTERM, SIGINT, ...) while its ranks ran; it
    stopped them. The message is torch's launcher's ("Process N got signal: 15")."""
