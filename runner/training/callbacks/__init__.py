"""Lightning callbacks that time and count what really runs."""
