from runner.cli import main

# Guarded: spawned ranks import this module again as __mp_main__ and must not start a new job.
if __name__ == "__main__":
    main()
