"""A decoder-only transformer (the seed's chapter on GPT): model.py, config.py, spec.py, and
parallelize.py, its pipeline stages and its tensor-parallel plan (Megatron-LM's)."""
