"""torch.distributed.pipelining's batched P2P calls, which every schedule sends and waits through:
the pipeline's probe wraps them to count the bytes sent and time the waits. Private functions of
`torch.distributed.pipelining.schedules`, called by module attribute. Checked on torch 2.13.
"""

from __future__ import annotations

from collections.abc import Callable

from runner.compat import private

CHECKED = "2.13"
WHERE = "torch.distributed.pipelining.schedules"


def wrap_p2p(send: Callable[[Callable], Callable], wait: Callable[[Callable], Callable]) -> None:
    """Replace `_batch_p2p` by send(original) and `_wait_batch_p2p` by wait(original)."""
    from torch.distributed.pipelining import schedules

    for name, wrap in (("_batch_p2p", send), ("_wait_batch_p2p", wait)):
        setattr(schedules, name, wrap(private(schedules, name, WHERE, "torch", CHECKED)))
