"""The garbage collector paused while a process imports, and resumed once its imports are in.

Importing torch, Lightning, MLflow and Hydra makes about a million objects that live as long as
the process; every full collection during the imports walks all of them again. Measured here,
importing what a rank needs took 9.9 s with the collector on and 7.7 s with it paused: two
seconds of every `python -m runner` a launcher, torchrun or srun starts. Once resumed, what was
imported is frozen (gc.freeze): later full collections, and a forked child's copy-on-write pages,
leave it alone (runner/training/preload.py freezes the fork server's imports the same way).
"""

from __future__ import annotations

import gc


def pause() -> None:
    """At a process's start, before its imports (runner/__main__.py)."""
    gc.disable()


def resume() -> None:
    """Once the imports are in: the collector on again, with what is alive now out of its sight.
    Where nothing paused it (the runner called in another program's process, a test's), nothing
    is done: that program's objects are not the runner's to freeze."""
    if gc.isenabled():
        return
    gc.freeze()
    gc.enable()
