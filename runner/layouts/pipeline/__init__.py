"""Pipeline parallelism with torch.distributed.pipelining: the Lightning strategy (strategy.py),
the stages and schedules (stages.py), every schedule action and P2P send timed (probe.py), the
P2P traffic and the bubble predicted (traffic.py)."""
