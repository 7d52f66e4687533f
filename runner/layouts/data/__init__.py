"""Data parallelism: Lightning's DDP (strategy.py), its gradient buckets timed and counted by a
communication hook (probe.py), its all-reduce traffic predicted (traffic.py)."""
