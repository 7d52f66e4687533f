"""Plain torch modules, free of parallel code: layouts in runner.parallel take them as they are."""
