"""A decoder whose feed-forward blocks are mixtures of experts: model.py, config.py, spec.py."""
