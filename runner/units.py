"""Numbers as people read them: counts and bytes with a unit that keeps them short."""

from __future__ import annotations


def count(n: float) -> str:
    """12,345; 0.7 M; 174.6 B: parameters, tokens."""
    if abs(n) >= 1e9:
        return f"{n / 1e9:,.1f} B"
    return f"{n / 1e6:,.1f} M" if abs(n) >= 1e5 else f"{n:,.0f}"


BYTE_UNITS = (("GB", 1e9), ("MB", 1e6), ("kB", 1e3))  # powers of ten, as link speeds are


def size(n: float) -> str:
    """12 B, 32.0 MB: bytes, in powers of ten as link speeds are."""
    for unit, scale in BYTE_UNITS:
        if abs(n) >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{n:,.0f} B"
