"""A search's picture: step time against memory per device for every layout that fits, the
Pareto front joined, the best starred, the device's memory as the wall on the right."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # files only: runs on machines without a display

from matplotlib.figure import Figure  # noqa: E402

from runner.search.price import Priced  # noqa: E402


def chart(fitting: list[Priced], front: list[Priced], best: Priced, device_gib: float,
          title: str) -> Figure:  # fmt: skip
    fig = Figure(figsize=(8, 5.5), layout="constrained")
    ax = fig.subplots()
    ax.scatter([p.memory_gib for p in fitting], [p.step_time_s for p in fitting], s=6,
               alpha=0.35, color="#4C72B0", label=f"{len(fitting):,} layouts that fit")  # fmt: skip
    ax.plot([p.memory_gib for p in front], [p.step_time_s for p in front], "o-", color="#C44E52",
            markersize=4, label=f"Pareto front ({len(front)}: none faster, smaller)")  # fmt: skip
    ax.scatter([best.memory_gib], [best.step_time_s], marker="*", s=220, color="#DD8452",
               zorder=3, label=f"best: {best.layout.words()}")  # fmt: skip
    ax.axvline(
        device_gib, color="#8C8C8C", linestyle="--", label=f"device memory {device_gib:g} GiB"
    )
    ax.set_yscale("log")
    ax.set_xlabel("memory per device (GiB, planned)")
    ax.set_ylabel("step time (s, planned; log)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, loc="upper right")
    return fig
