"""Models: a folder each (model.py, config.py, spec.py), listed once in registry.py. The modules are
plain torch, free of parallel code: the layouts (runner/layouts/) split them as their specs say."""
