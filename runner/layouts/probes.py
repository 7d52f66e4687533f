"""What a layout's probe records of a step: typed, so the timing callback combines any layout's
records without knowing which layout made them. Torch-free.

A Transfer is one collective or point-to-point call this rank took part in. How it blocks the
rank decides where its time goes:
- `blocking`: the rank waits for it where it is called (a tensor-parallel all-reduce inside a
  layer, the loss's reduction for logging): its whole span is communication, not compute;
- overlapped (not blocking): launched while compute goes on and waited for at the end of the
  phase (a DDP gradient bucket): only what outlasts the last launch is exposed.
A Schedule is a step whose work a schedule ran as actions (a pipeline's forward, backward and
weight-gradient chunks, and its P2P waits), in place of the forward/backward hooks.

Times are stamps while the step runs (runner/clock.py: the host's clock, or CUDA events) and
seconds once it is over: `settled` turns one into the other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

Seconds = Callable[[Any], float]  # a stamp to seconds (runner/clock.py)
Span = tuple[str, float, float, str]  # kind, start (s), end (s), label (a micro-batch number)

# nccl-tests' bus bandwidth: the bytes each rank's link carries per byte of payload S are
# 2(n-1)/n for an all-reduce and (n-1)/n for an all-gather or a reduce-scatter (a ring's); the
# factor here is the part before (n-1)/n. (A P2P send carries its payload once: factor 1.)
# A wait moves nothing.
BUS_BYTES = {
    "all-reduce": 2.0,
    "all-gather": 1.0,
    "reduce-scatter": 1.0,
    "send-recv": 1.0,
    "all-to-all": 1.0,  # each rank's link carries what it sends to the others: (n-1)/n of S
}


def bus_bytes(kind: str, nbytes: int) -> float:
    """A collective's payload weighted as nccl-tests weights it, less the (n-1)/n (the timeline's
    kinds end in the collective's name: "all-reduce", "tp all-gather")."""
    return BUS_BYTES.get(kind.split()[-1], 0.0) * nbytes


@dataclass(frozen=True)
class Transfer:
    dim: str  # whose traffic it is: dp | tp | sp | cp | pp (runner/mesh.py: TRAFFIC_DIMS); ""
    # for logging's reductions
    kind: str  # the timeline's name: "all-reduce", "tp all-reduce", ...
    start: Any  # when it was launched (a bucket: when its gradients were ready): a stamp, then s
    end: Any  # when it was done
    nbytes: int = 0  # payload S, as nccl-tests names it
    blocking: bool = True
    apart: bool = False  # overlapped; its exposed part is recorded apart (a wait) or unknown

    @property
    def seconds(self) -> float:
        return self.end - self.start

    def settled(self, seconds: Seconds) -> Transfer:
        return replace(self, start=seconds(self.start), end=seconds(self.end))


Recorder = Callable[[Transfer], None]  # where a probe reports each transfer


@dataclass(frozen=True)
class Action:
    kind: str  # "F<stage>", "B<stage>", "W<stage>" (compute), or "wait" (blocked on P2P)
    start: Any  # a stamp, then seconds
    end: Any
    microbatch: int  # -1 for a wait

    @property
    def computes(self) -> bool:
        return self.kind != "wait"

    def settled(self, seconds: Seconds) -> Action:
        return replace(self, start=seconds(self.start), end=seconds(self.end))


@dataclass
class Schedule:
    """One step as a pipeline schedule ran it, on this rank."""

    window: tuple[float, float]  # the schedule's start and end (the tied weights' sum included)
    optimizer: tuple[float, float]
    actions: list[Action] = field(default_factory=list)
    transfers: list[Transfer] = field(default_factory=list)  # the strategy's own collectives
    sent_bytes: int = 0  # what this rank handed pp's link: P2P sends, a tied weight's sum
    # Each batch of P2P sends from its launch to the end of the wait for it: an upper bound of its
    # time on the wire (the peer may post its receive late), for the bandwidth it delivered; and
    # the tied weight's sum.
    sends: list[Transfer] = field(default_factory=list)

    def settled(self, seconds: Seconds) -> Schedule:
        return Schedule(
            (seconds(self.window[0]), seconds(self.window[1])),
            (seconds(self.optimizer[0]), seconds(self.optimizer[1])),
            [a.settled(seconds) for a in self.actions],
            [t.settled(seconds) for t in self.transfers],
            self.sent_bytes,
            [t.settled(seconds) for t in self.sends],
        )

    def work_s(self) -> float:
        return sum(a.end - a.start for a in self.actions if a.computes)

    def waits_s(self) -> float:
        return sum(a.end - a.start for a in self.actions if not a.computes)

    def spans(self, origin: float) -> list[Span]:
        names = {"F": "forward", "B": "backward", "W": "weight", "w": "p2p wait"}
        spans = [
            (names[a.kind[0]], a.start - origin, a.end - origin, "" if a.microbatch < 0 else
             str(a.microbatch))
            for a in self.actions
        ]  # fmt: skip
        start, end = self.optimizer
        return [*spans, ("optimizer", start - origin, end - origin, "")]
