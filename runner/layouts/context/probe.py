"""The ring's exchanges, timed, with their payload: context parallelism's communication.

The ring (runner/layouts/context/ring.py) reports each exchange itself: from its launch to the
end of the wait for it (the bytes sent, and an upper bound of their time on the wire: the peer may
post its receive late), and apart from it the wait, the part no compute hid.
"""

from __future__ import annotations

from runner.layouts.probes import Recorder, Transfer

_recorders: list[Recorder] = []


def install(record: Recorder) -> None:
    """Route the ring's exchanges to `record` (this process's job's)."""
    _recorders[:] = [record]


def report(*transfers: Transfer) -> None:
    for transfer in transfers:
        for record in _recorders:
            record(transfer)
