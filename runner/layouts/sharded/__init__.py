"""Sharded data parallelism: ZeRO-1 through torch's ZeroRedundancyOptimizer, ZeRO-2/3 through
FSDP2's fully_shard (shard.py), their collectives timed and counted (probe.py), predicted
(traffic.py)."""
