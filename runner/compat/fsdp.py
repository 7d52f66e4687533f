"""FSDP2's default collectives, which the sharded layout's probe extends (runner/layouts/sharded/
probe.py). They live in a private module of torch's: torch 2.8 and later (the GPU machines' 2.11,
this machine's 2.13) keep them there under these names."""

from torch.distributed.fsdp._fully_shard._fsdp_collectives import (  # noqa: F401
    DefaultAllGather,
    DefaultReduceScatter,
)
