"""Studies (experiments/): the list a command can run, the formulas a figure is held against, and a
study's report on its sweep's parent run."""
