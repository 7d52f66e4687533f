"""A feed-forward network (the seed's chapter 2): model.py, config.py, spec.py, and parallelize.py,
how its layers split into pipeline stages and tensor-parallel column/row pairs."""
