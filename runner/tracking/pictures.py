"""Pictures a person would rather look at than read: each rank's timeline of a few steps."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # files only: runs on machines without a display

from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

COLORS = {
    "forward": "#4C72B0",
    "backward": "#DD8452",
    "weight": "#8172B3",
    "optimizer": "#55A868",
    "all-reduce": "#C44E52",
    "p2p wait": "#937860",
    "tp all-reduce": "#DA8BC3",
    "tp all-gather": "#8C8C8C",
    "tp reduce-scatter": "#CCB974",
    "sp all-gather": "#17BECF",  # sequence parallelism's, on the tp ranks
    "sp reduce-scatter": "#BCBD22",
    "dp all-gather": "#64B5CD",
    "dp reduce-scatter": "#E17C05",
    "dp wait": "#8B0000",  # the rank waiting for a prefetched all-gather: exposed
    "cp send-recv": "#9467BD",  # the ring attention's keys and values (or their gradients)
    "cp wait": "#4B0082",  # the rank waiting for them: exposed
    "ep all-to-all": "#FF7F0E",  # a mixture of experts' tokens to their experts and back
    "ep counts all-to-all": "#FFBB78",  # dropless: how many tokens each expert gets, first
    "idle": "#E5E5E5",
}
# What a bar's legend says where its kind alone would puzzle: a pure pipeline all-reduces too (the
# loss's mean over ranks, for the log and to agree on a stop), not only DDP's gradients.
LEGEND = {
    "all-reduce": "all-reduce (gradients; the loss's mean)",
    "dp wait": "dp wait (exposed)",
    "cp wait": "cp wait (exposed)",
}
LABEL_WIDTH = 0.008  # of the time axis a character of a bar's label takes, at 7 points
LEGEND_COLUMNS = 5
# Compute fills the row; communication runs beside it (it may overlap compute), in a band below.
COMM_KINDS = {
    k
    for k in COLORS
    if k.split()[-1]
    in (
        "all-reduce",
        "all-gather",
        "reduce-scatter",
        "send-recv",
        "all-to-all",
        "wait",
    )
}


from runner.layouts.probes import Span  # noqa: E402


def rank_timeline(spans_by_rank: list[list[list[Span]]], title: str) -> Figure:
    """One row per rank, time across; idle is the grey behind whatever runs."""
    fig = Figure(figsize=(11, 1.1 + 0.8 * len(spans_by_rank)))
    ax = fig.add_subplot()
    every = [span for steps in spans_by_rank for step in steps for span in step]
    t0 = min(span[1] for span in every)
    t1 = max(span[2] for span in every)
    for rank, steps in enumerate(spans_by_rank):
        y = len(spans_by_rank) - 1 - rank
        ax.broken_barh([(0, (t1 - t0) * 1e3)], (y - 0.4, 0.8), color=COLORS["idle"])
        # One collection a kind and row: a rank's steps hold hundreds of spans, and matplotlib
        # draws each collection at a fixed cost (a 2-rank, 8-step timeline drawn and saved in
        # 0.13 s, not 0.42)
        bars: dict[str, list[tuple[float, float]]] = {}
        for kind, a, b, label in (span for step in steps for span in step):
            bars.setdefault(kind, []).append(((a - t0) * 1e3, (b - a) * 1e3))
            if label and (b - a) / (t1 - t0) >= LABEL_WIDTH * len(label):  # else they overlap
                mid = ((a + b) / 2 - t0) * 1e3
                ax.text(mid, y + 0.12, label, ha="center", va="center", fontsize=7, color="white")
        for kind, xs in bars.items():
            lane = (y - 0.4, 0.2) if kind in COMM_KINDS else (y - 0.15, 0.55)
            ax.broken_barh(xs, lane, color=COLORS[kind])
    ax.set_yticks(
        range(len(spans_by_rank)), [f"rank {r}" for r in reversed(range(len(spans_by_rank)))]
    )
    ax.set_xlabel("time (ms)")
    ax.set_xlim(0, (t1 - t0) * 1e3)
    ax.set_title(title)
    shown = {span[0] for span in every} | {"idle"}
    handles = [Patch(color=c, label=LEGEND.get(k, k)) for k, c in COLORS.items() if k in shown]
    rows = -(-len(handles) // LEGEND_COLUMNS)
    fig.legend(handles=handles, ncols=min(len(handles), LEGEND_COLUMNS), loc="lower center",
               frameon=False)  # fmt: skip
    fig.tight_layout(rect=(0, 0.35 * rows / fig.get_figheight(), 1, 1))
    return fig
