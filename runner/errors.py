"""The one error a user's config can cause: it names the key and says what is allowed."""

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
