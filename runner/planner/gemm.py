"""A matrix product's time on a device: its FLOPs at the share of peak that products of its size
reach (the profile's curve), or at what memory can feed, whichever is lower (the roofline).

Size is the cube root of m*n*k: a product's three dimensions each bound how well it fills the
device's tiles and waves, and a product's input and weight gradients (m, k, n and k, n, m) have
the size and arithmetic intensity of its forward. Larger models multiply larger matrices: their
products run closer to peak, which is why large runs reach a higher share of it (Narayanan et al.
2021, Table 1: 44 % at 1.7 B parameters, 52 % at 1 T on A100s). Torch-free.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

from runner.models.spec import Gemm


def curve_share(points: Sequence[Sequence[float]], size: float) -> float:
    """The curve's share of peak at `size`, read on a log scale, flat beyond its ends (no
    points: peak)."""
    if not points:
        return 1.0
    if size <= points[0][0]:
        return points[0][1]
    for (n0, e0), (n1, e1) in zip(points, points[1:], strict=False):
        if size <= n1:
            at = math.log(size / n0) / math.log(n1 / n0)
            return e0 + at * (e1 - e0)
    return points[-1][1]


def size(g: Gemm) -> float:
    return (g.m * g.n * g.k) ** (1 / 3)


def intensity(g: Gemm, elem: int) -> float:
    """FLOPs per byte of its two inputs and output, each read or written once."""
    return 2 * g.m * g.n * g.k / (elem * (g.m * g.k + g.k * g.n + g.m * g.n))


def seconds(
    g: Gemm, peak: float, points: Sequence[Sequence[float]], bandwidth: float | None, elem: int
) -> float:
    """One forward product (all its `count`) at `peak` FLOP/s and `bandwidth` bytes/s."""
    curve = points if isinstance(points, tuple) else tuple(map(tuple, points))
    return g.count * _one(g.m, g.n, g.k, peak, curve, bandwidth, elem)


# A model's blocks repeat a few shapes, a search's layouts a few more: one product's time is kept
# by its shape, whatever its count (a stage's blocks, heads, samples)
@functools.lru_cache(maxsize=2**16)
def _one(
    m: int, n: int, k: int, peak: float, points: tuple[tuple[float, ...], ...],
    bandwidth: float | None, elem: int,
) -> float:  # fmt: skip
    g = Gemm(m, n, k)
    rate = peak * curve_share(points, size(g))
    if bandwidth:
        rate = min(rate, intensity(g, elem) * bandwidth)
    return g.flops / rate
