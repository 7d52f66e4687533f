"""torch.distributed's module default timeout for process groups made without one.

Groups made after the world's (the mesh's dimensions, the tied embedding's) take torch's module
default (30 minutes), not the world's timeout: the runner makes that default the config's too.
Checked on torch 2.11 and 2.13.
"""

from __future__ import annotations

from datetime import timedelta

from runner.compat import private

CHECKED = "2.11, 2.13"


def set_default_timeout(seconds: float) -> None:
    from torch.distributed import distributed_c10d

    where = "torch.distributed.distributed_c10d"
    for name in ("default_pg_timeout", "default_pg_nccl_timeout"):
        private(distributed_c10d, name, where, "torch", CHECKED)
        setattr(distributed_c10d, name, timedelta(seconds=seconds))
