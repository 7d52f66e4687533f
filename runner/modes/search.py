"""mode=search: which layout? Every layout of the model for its global batch and precision on
hardware.nodes x hardware.devices (runner/search/space.py), priced by the planner in this one
process (runner/search/price.py), the best that fit printed first by search.objective, then one
paragraph: how many layouts in how long, why the best beats the runner-up, how many the rules and
memory refused. Then one MLflow run (tag mode=search): every layout as layouts.csv, the chart of
step time against memory (search.png), the best layout as params (best.*) with the commands
that plan and train it. The config's own parallel group is not read: the search sets it.
"""

from __future__ import annotations

import csv
import dataclasses
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from runner.config.search import SearchConfig
from runner.job import Job, typed
from runner.metrics import (
    SEARCH_BEST,
    SEARCH_BY_MEMORY,
    SEARCH_BY_RULES,
    SEARCH_FIT,
    SEARCH_LAYOUTS,
    SEARCH_SECONDS,
)
from runner.search.choose import pareto, ranked, why
from runner.search.price import Priced, price
from runner.search.space import Layout, Refusals, View, layouts, verdicts
from runner.units import count
from runner.validate import device_memory_gib

COLUMNS = [f.name for f in dataclasses.fields(Layout)]
FIGURES = [*SEARCH_BEST, "bound"]  # Priced's fields, the csv's columns after the verdict
FIT = "fit"  # a layout's verdict: it fits; or "memory", or the refusing rule's key


@dataclasses.dataclass
class Searched:
    priced: list[Priced]
    refused: list[tuple[Layout, str]]  # refused by a rule: the layout and the rule's words
    refusals: Refusals
    seconds: float

    @property
    def total(self) -> int:
        return len(self.priced) + len(self.refused)


def search(cfg: DictConfig, job: Job, settings: SearchConfig) -> Searched:
    from tqdm import tqdm

    base = View(OmegaConf.to_container(cfg, resolve=True))
    ring = job.trainer.attention != "math"  # the ring attention is a fused kernel of its own
    candidates = list(layouts(settings, base.hardware, job.spec, job.batch_size, ring))
    hw = job.hardware
    print(f"searching {len(candidates):,} layouts of {hw.nodes} node(s) x {hw.devices} devices",
          flush=True)  # fmt: skip
    shared = dataclasses.replace(job, memo={})  # what layouts share (runner/memo.py)
    have, start = device_memory_gib(job.hardware), time.perf_counter()
    out = Searched([], [], Refusals({}, {}), 0.0)
    for layout, refused in tqdm(verdicts(candidates, base), total=len(candidates), unit=" layouts",
                                disable=None, mininterval=0.5, leave=False):  # fmt: skip
        if refused is None:
            out.priced.append(price(shared, layout, have))
        else:
            out.refusals.add(refused)
            out.refused.append((layout, str(refused)))
    out.seconds = time.perf_counter() - start
    return out


def table(best: list[Priced], objective: str) -> str:
    extra = {"cost": ("cost", lambda p: f"${p.cost_usd:,.0f}"),
             "time_to_train": ("train (h)", lambda p: f"{p.hours:,.1f}")}  # fmt: skip
    extra = extra.get(objective)
    head = ["#", "layout", "step (s)", "MFU", "memory (GiB)", "bubble", "bound"]
    rows = [
        [str(i + 1), p.layout.words(), f"{p.step_time_s:.4g}", f"{p.mfu:.1%}",
         f"{p.memory_gib:.3g}", f"{p.bubble:.3f}", p.bound]
        + ([extra[1](p)] if extra else [])
        for i, p in enumerate(best)
    ]  # fmt: skip
    head += [extra[0]] if extra else []
    widths = [max(len(r[c]) for r in [head, *rows]) for c in range(len(head))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip()
                     for r in [head, *rows])  # fmt: skip


def paragraph(found: Searched, fitting: list[Priced], objective: str, have: float) -> str:
    memory = len(found.priced) - len(fitting)
    rules = "; ".join(
        f"{key} {n:,} (e.g. '{found.refusals.first[key].split(': ', 1)[1]}')"
        for key, n in sorted(found.refusals.counts.items(), key=lambda kv: -kv[1])
    )
    said = [
        f"{found.total:,} layouts in {found.seconds:.1f} s: {len(fitting):,} fit in"
        f" {have:,.0f} GiB a device, {memory:,} refused by memory,"
        f" {found.refusals.total:,} refused by rules" + (f" ({rules})" if rules else "") + "."
    ]
    if len(fitting) > 1:
        said.append(why(fitting, objective))
    elif not fitting:
        said.append("No layout fits: more devices (search.nodes), a smaller batch or "
                    "trainer.precision=bf16-mixed.")  # fmt: skip
    return " ".join(said)


def commands(overrides: list[str], layout: Layout) -> dict[str, str]:
    """The command lines that plan and train the layout: the search's own overrides less what
    the layout sets, and the layout's."""
    mine = {o.split("=", 1)[0].lstrip("+~") for o in layout.overrides()}
    kept = [o for o in overrides if not o.startswith(("mode=", "search.", "parallel="))
            and o.split("=", 1)[0] not in mine]  # fmt: skip
    line = " ".join([*kept, *layout.overrides()])
    return {"plan": f"python -m runner mode=plan {line}", "train": f"python -m runner {line}"}


def run(
    cfg: DictConfig, job: Job, choices: Mapping[str, str | None], overrides: list[str]
) -> dict[str, Any]:
    settings = typed(SearchConfig, cfg.search)
    found = search(cfg, job, settings)
    fitting = ranked(found.priced, settings.objective)
    have = device_memory_gib(job.hardware)
    if fitting:
        print(table(fitting[: settings.top], settings.objective))
    print(paragraph(found, fitting, settings.objective, have), flush=True)
    best = fitting[0] if fitting else None
    if best is not None:
        print(f"plan it: {commands(overrides, best.layout)['plan']}", flush=True)
    record(cfg, choices, overrides, found, fitting, have)
    return {"layouts": found.total, "fit": len(fitting), "seconds": found.seconds}


def record(cfg: DictConfig, choices: Mapping[str, str | None], overrides: list[str],
           found: Searched, fitting: list[Priced], have: float) -> None:  # fmt: skip
    from mlflow.entities import Param

    from runner.launcher.cluster import world_size
    from runner.search.chart import chart
    from runner.tracking.job_run import recorded_run

    metrics = {SEARCH_LAYOUTS.name: found.total, SEARCH_SECONDS.name: found.seconds,
               SEARCH_FIT.name: len(fitting), SEARCH_BY_RULES.name: found.refusals.total,
               SEARCH_BY_MEMORY.name: len(found.priced) - len(fitting)}  # fmt: skip
    with recorded_run(cfg, choices, overrides, world_size(cfg)) as record:
        client, run_id = record.client, record.run_id
        if fitting:
            best = fitting[0]
            metrics |= {m.name: getattr(best, field) for field, m in SEARCH_BEST.items()}
            said = {f"best.{k}": str(v) for k, v in best.layout.parallel.items()}
            said |= {"best.nodes": str(best.layout.nodes), "best.recompute": best.layout.recompute}
            said |= {f"best.{k}_command": v for k, v in commands(overrides, best.layout).items()}
            record.log_batch("params", [Param(k, v) for k, v in said.items()])
            client.set_tag(run_id, "best", best.layout.words())
            client.set_tag(run_id, "bound", best.bound)
            devices = f"{count(best.layout.nodes)} x {cfg.hardware.devices}"
            title = f"{choices.get('model')} on {devices} {choices.get('hardware')}"
            figure = chart(fitting, pareto(fitting), best, have, title)
            client.log_figure(run_id, figure, "search.png")
        record.log_metrics(metrics)
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "layouts.csv"
            write_csv(path, found)
            client.log_artifact(run_id, str(path))


def write_csv(path: Path, found: Searched) -> None:
    """Every layout searched: its fields, its verdict (fit, memory, or the rule's key) and why,
    and its figures where it was priced."""
    with path.open("w", newline="") as f:
        out = csv.writer(f)
        out.writerow([*COLUMNS, "verdict", "reason", *FIGURES])
        for p in found.priced:
            verdict = FIT if p.fits else "memory"
            figures = [getattr(p, k) for k in FIGURES] if p.fits else [p.memory_gib]
            out.writerow([*(getattr(p.layout, c) for c in COLUMNS), verdict, "", *figures])
        for layout, said in found.refused:
            key, reason = said.split(": ", 1)
            out.writerow([*(getattr(layout, c) for c in COLUMNS), key, reason])
