"""The sweep this process has open, if any, so that the command line can end it FAILED when the
sweep stops part-way (bad input, Ctrl-C, a failed job) without importing MLflow to find out:
runner/tracking/sweep_run.py registers how to end it while it is open. Imports nothing heavy."""

from __future__ import annotations

from collections.abc import Callable

_end: Callable[[], None] | None = None


def opened(end_failed: Callable[[], None]) -> None:
    global _end
    _end = end_failed


def closed() -> None:
    global _end
    _end = None


def end_failed() -> None:
    """End the open sweep's parent run FAILED; nothing if none is open."""
    if _end is not None:
        _end()
