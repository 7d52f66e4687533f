"""Private upstream APIs the runner patches, each wrapped in one module of this folder that names
the releases it was checked on and fails in one line where the API is missing (a newer or older
release may have moved it): lightning.py, pipelining.py, collectives.py, process_group.py,
ddp_dtensor.py, device_mesh.py, float8.py, hydra_mode.py, rendezvous_events.py."""

from __future__ import annotations

from typing import Any


class MissingAPI(RuntimeError):
    """A private upstream API the runner patches is not in the installed release."""


def private(owner: Any, name: str, where: str, package: str, checked: str) -> Any:
    """`owner.name`, or one line saying what is missing, in which release, and what was checked."""
    if not hasattr(owner, name):
        from importlib.metadata import version

        raise MissingAPI(
            f"{where}.{name} is missing in {package} {version(package)}; "
            f"the runner patches it and was checked with {package} {checked}"
        )
    return getattr(owner, name)
