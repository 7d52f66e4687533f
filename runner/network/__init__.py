"""Networks a run makes for itself: nodes on emulated links on one host (emulation.py)."""
