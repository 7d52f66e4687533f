"""When work happens on the device: the host's clock on a CPU, CUDA events on a GPU.

The probes and the timing callback take a stamp where a phase, an action or a transfer starts and
ends, and turn the step's stamps into seconds once the step is over. On a CPU the work runs where
the host calls it: a stamp is the host's clock, and turning it into seconds changes nothing. On a
GPU the host only launches work: a stamp is a CUDA event recorded on the stream the work runs on
(a collective's: the stream that waits for it), read after the step with one synchronization.
So nothing inside a step waits for the device, and the overlap of compute and communication that
is being measured stays as it is. Both go through the same calls: `stamp`, then `settle` once per
step, then `seconds`.
"""

from __future__ import annotations

import time
from typing import Any

Stamp = Any  # a float (the host's clock) or a torch.cuda.Event


class HostClock:
    def stamp(self) -> Stamp:
        return time.perf_counter()

    def settle(self) -> None:
        """The step's work has all run by the time the host gets here."""

    def seconds(self, stamp: Stamp) -> float:
        return stamp


class EventClock:
    """CUDA events on the current stream, in seconds on the host's clock: the first event is
    recorded with the device idle (after a synchronization), at a known host time."""

    def __init__(self, cuda: Any = None) -> None:
        import torch

        self.cuda = cuda or torch.cuda  # a stand-in in the suite, which has no GPU
        self.cuda.synchronize()
        self.origin, self.origin_s = self._event(), time.perf_counter()

    def _event(self) -> Stamp:
        event = self.cuda.Event(enable_timing=True)
        event.record()
        return event

    def stamp(self) -> Stamp:
        return self._event()

    def settle(self) -> None:
        self.cuda.synchronize()  # the step's one synchronization: every event has happened

    def seconds(self, stamp: Stamp) -> float:
        if isinstance(stamp, float):  # a time never stamped (0.0), or one read already
            return stamp
        return self.origin_s + self.origin.elapsed_time(stamp) / 1e3


_clock: list[HostClock | EventClock] = [HostClock()]


def use(clock: HostClock | EventClock) -> None:
    """The clock every probe stamps with in this process (the timing callback sets it)."""
    _clock[0] = clock


def stamp() -> Stamp:
    return _clock[0].stamp()


def settle() -> None:
    _clock[0].settle()


def seconds(stamp: Stamp) -> float:
    return _clock[0].seconds(stamp)
