"""Tensor parallelism on a device mesh: the mesh strategy (strategy.py) splits the model with its
spec's plan, DTensor's collectives are timed and counted (probe.py), Megatron's count predicts
them (traffic.py)."""
