"""Pipeline time-step tables as the seed draws them: which device is busy at each time step.

The seed's chapter 8 walks 4 devices and 4 micro-batches through 11 time steps, packing a stage's
forward and backward of different micro-batches into one step. GPipe, as torch runs it, does every
forward before any backward: 2(m + p - 1) time steps. Both are printed beside the order in which the
real schedule ran each action on each rank.
"""

from __future__ import annotations

SEED_ACTIVE = [25, 50, 75, 100, 75, 50, 75, 100, 75, 50, 25]  # % of GPUs busy, figures 8-3 to 8-13
SEED_DEVICES = ["A1", "A2", "B1", "B2"]


def gpipe_steps(p: int, m: int) -> list[list[str]]:
    """GPipe's ideal grid: row = device, column = time step, cell = F<mb>, B<mb> or '.'."""
    grid = [["."] * (2 * (m + p - 1)) for _ in range(p)]
    for s in range(p):
        for j in range(m):
            grid[s][s + j] = f"F{j}"
            grid[s][(m + p - 1) + (p - 1 - s) + j] = f"B{j}"
    return grid


def grid_text(grid: list[list[str]], names: list[str]) -> str:
    header = "step    " + " ".join(f"{t + 1:>3}" for t in range(len(grid[0])))
    rows = [
        f"{name:<7} " + " ".join(f"{cell:>3}" for cell in row)
        for name, row in zip(names, grid, strict=True)
    ]
    busy = [sum(row[t] != "." for row in grid) * 100 // len(grid) for t in range(len(grid[0]))]
    return "\n".join([header, *rows, "busy %  " + " ".join(f"{b:>3}" for b in busy)])


def measured_order(spans_by_rank: list[list[tuple[str, float, float, str]]]) -> str:
    """Each rank's compute actions in the order it ran them, with start times (ms)."""
    codes = {"forward": "F", "backward": "B", "weight": "W"}
    lines = []
    for rank, spans in enumerate(spans_by_rank):
        acts = sorted((a, codes[k] + label) for k, a, _, label in spans if k in codes)
        lines.append(f"rank {rank}: " + "  ".join(f"{name}@{a * 1e3:.1f}" for a, name in acts))
    return "\n".join(lines)


def report(
    p: int, m: int, schedule: str, first_step: list[list[tuple[str, float, float, str]]]
) -> str:
    parts = [
        f"What the {schedule} schedule ran, one step after warm-up (rank: action@ms):",
        measured_order(first_step),
        "",
    ]
    parts += [
        f"GPipe's ideal table for p = {p} stages, m = {m} micro-batches: "
        f"2(m + p - 1) = {2 * (m + p - 1)} time steps, bubble (p - 1)/(m + p - 1) = "
        f"{p - 1}/{m + p - 1}:",
        grid_text(gpipe_steps(p, m), [f"rank {s}" for s in range(p)]),
        "",
    ]
    if (p, m) == (4, 4):
        parts += [
            "The seed's table (figures 8-3 to 8-13) has 11 time steps, busy "
            + ", ".join(f"{a} %" for a in SEED_ACTIVE)
            + ".",
            "It differs from GPipe's 14 because it packs a stage's forward of one micro-batch and",
            "backward of another into the same time step from step 5 on (B2 computes output 2",
            "and error E1 together): backward starts before all forwards are done, as in 1F1B,",
            "while GPipe runs every forward first and every backward after.",
        ]
    return "\n".join(parts)
