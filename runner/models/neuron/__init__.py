"""One artificial neuron (the seed's chapter 1): model.py, its schema config.py, its spec.py."""
