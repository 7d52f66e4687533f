"""One rank's training: the LightningModule (module.py), the Trainer and its loop (rank.py), the
callbacks that time, count and snapshot (callbacks/), and rank 0's record of the run (record.py)."""
