"""What the tests share besides fixtures (tests/conftest.py holds those): composing and training
jobs in this process, reading their MLflow records, the command line in this process or in one
of its own, MLflow servers, a one-node SLURM cluster."""
