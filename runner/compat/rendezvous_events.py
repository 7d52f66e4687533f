"""torch's elastic rendezvous names the method that logs each of its events by `inspect.stack()`,
twice an event (`dynamic_rendezvous.get_method_name`). That builds every frame's source context,
and `inspect.getmodule` walks sys.modules for each frame: with torch, Lightning and MLflow loaded,
a job of 2 ranks spent 1.9 of its launch's 2.9 s there (cProfile of `python -m runner
model=ffnn parallel=data hardware.devices=2` on the 2-core AVX2 EPYC), and under pytest's deeper
stack a sixteenth of the whole suite's CPU. The same name read from the frame itself costs
microseconds. Checked on torch 2.13 (torch's sources since 2.0 define it the same way).
"""

from __future__ import annotations

import sys

from runner.compat import private

CHECKED = "2.13"
WHERE = "torch.distributed.elastic.rendezvous.dynamic_rendezvous"


def method_name(depth: int = 2) -> str:
    """What `get_method_name(depth)` answers: the function `depth` frames above this one."""
    try:
        return sys._getframe(depth).f_code.co_name
    except ValueError:  # a stack shallower than depth, as torch's own answer
        return "no_method_name"


def name_methods_cheaply() -> None:
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    private(dynamic_rendezvous, "get_method_name", WHERE, "torch", CHECKED)
    dynamic_rendezvous.get_method_name = method_name
