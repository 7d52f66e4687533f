from runner.launcher import collector

collector.pause()  # resumed once the job's imports are in (runner/launcher/collector.py)

from runner.cli import main  # noqa: E402

# Guarded: spawned ranks import this module again as __mp_main__ and must not start a new job.
if __name__ == "__main__":
    main()
