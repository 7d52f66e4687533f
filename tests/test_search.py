"""mode=search: every layout priced in one process, the rules' refusals counted by key, the best
one where it is known by hand, prices equal to a plan's, Megatron-LM's published meshes near the
top, and the one MLflow run a search records."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import pytest
from matplotlib.pyplot import imread
from mlflow import MlflowClient

from benchmarks.published import TABLE_1, overrides
from runner.metrics import MFU, SEARCH_BY_RULES, SEARCH_FIT, SEARCH_LAYOUTS, STEP_TIME
from runner.planner import plan
from runner.search.choose import pareto, ranked
from runner.search.price import job_of
from tests.helpers.jobs import compose_job, searched
from tests.helpers.records import all_runs

# Two nodes of two H100s whose link between nodes is 100,000 times slower than NVLink
SLOW_LINK = ["hardware=h100", "hardware.devices=2", "hardware.nodes=2", "data.batch_size=32",
             "hardware.inter_node.bandwidth_gbs=0.01", "hardware.inter_node.name=slow"]  # fmt: skip
# A grid small enough to count by hand: one micro-batch size, schedule, level, recomputation
SMALL = ["search.micro_batch_size=[1]", "search.schedule=[1f1b]", "search.shard=[none]",
         "search.recompute=[none]", "search.sequence_parallel=[false]",
         "search.cp=[1]"]  # fmt: skip


def test_a_slow_link_between_nodes_carries_the_pipeline_as_worked_out_by_hand() -> None:
    """By hand: across 2 nodes something must cross the slow link (0.01 GB/s x 0.8). A pipeline
    across the nodes sends each sample's activation forward and its gradient back: 16 samples a
    replica x 64 positions x 128 x 4 B x 2 = 1.05 MB, 0.131 s. Without one, data parallelism
    all-reduces the gradients across the nodes: 2 (n-1)/n x 4 B x the parameters a rank holds,
    0.66 M (2 blocks of 12 d^2 + 13 d, the 2048 x 128 embedding), half of them with tp 2 in the
    node: 1.32 MB, 0.165 s; with dp 4, 2 x 3/4 x 2.6 MB, 0.49 s."""
    fitting = ranked(searched(*SLOW_LINK).priced, "time")
    best, link = fitting[0], 0.01e9 * 0.8
    assert (best.layout.pp, best.layout.dp * best.layout.tp) == (2, 2)
    assert best.parts["pp"] == pytest.approx(16 * 64 * 128 * 4 * 2 / link, rel=1e-3)
    params = 2 * (12 * 128**2 + 13 * 128) + 2048 * 128
    (no_pipeline, *_) = [p for p in fitting if p.layout.pp == 1]
    assert (no_pipeline.layout.dp, no_pipeline.layout.tp) == (2, 2)
    assert no_pipeline.parts["dp"] == pytest.approx(params / 2 * 4 / link, rel=0.01)
    (plain, *_) = [p for p in fitting if p.layout.dp == 4]
    assert plain.parts["dp"] == pytest.approx(2 * 3 / 4 * params * 4 / link, rel=0.01)


def test_every_refused_layout_is_counted_under_the_rule_that_refused_it() -> None:
    """The default decoder (2 layers, 4 heads) on 4 devices, batch 4, one sample a micro-batch:
    tp 1 x pp 1, 2, 4; tp 2 x pp 1, 2; tp 4 x pp 1. Refused: pp 4 (2 layers); the rest pass
    (4 heads split 4 ways). With 2 heads, tp 4 is refused too."""
    grid = ["hardware=h100", "hardware.devices=4", "data.batch_size=4", *SMALL]
    found = searched(*grid)
    assert found.total == 6
    assert found.refusals.counts == {"parallel.pp": 1}
    assert "4 pipeline stages" in found.refusals.first["parallel.pp"]
    two_heads = searched(*grid, "model.n_heads=2")
    assert two_heads.refusals.counts == {"parallel.pp": 1, "model.n_heads": 1}
    assert {p.layout.tp for p in two_heads.priced} == {1, 2}


def test_a_search_prices_each_layout_as_a_plan_of_it_does() -> None:
    """The work layouts share (runner/memo.py) changes no figure: a sample of GPT-3's layouts,
    each planned alone, without a memo."""
    args = ["model=gpt3_175b", "hardware=h100_cluster", "hardware.nodes=16",
            "data.batch_size=256", "trainer.precision=bf16-mixed",
            "search.micro_batch_size=[1,4]"]  # fmt: skip
    found = searched(*args)
    cfg, _ = compose_job("mode=plan", *args)
    from runner.job import resolve_job
    from runner.validate import validate

    validate(cfg)
    base = resolve_job(cfg)
    fitting = [p for p in found.priced if p.fits]
    assert len(fitting) > 100
    for p in random.Random(0).sample(fitting, 60):
        alone = plan(job_of(base, p.layout))
        assert p.step_time_s == pytest.approx(alone[STEP_TIME.name], rel=1e-12)
        assert p.memory_gib == pytest.approx(alone["mem_per_device_gib"]["total"], rel=1e-12)
        assert p.mfu == pytest.approx(alone[MFU.name], rel=1e-12)


def test_the_pareto_front_has_no_layout_faster_and_smaller() -> None:
    """On the front: no layout is as fast and smaller, or faster and as small. Off it: one is,
    or it is another layout at a front point's very time and memory."""
    fitting = ranked(searched(*SLOW_LINK).priced, "time")
    front = pareto(fitting)
    points = {(p.step_time_s, p.memory_gib) for p in front}

    def beaten(p) -> bool:
        return any(q.step_time_s <= p.step_time_s and q.memory_gib <= p.memory_gib
                   and (q.step_time_s, q.memory_gib) != (p.step_time_s, p.memory_gib)
                   for q in fitting)  # fmt: skip

    assert 1 < len(front) < len(fitting)
    assert not any(beaten(p) for p in front)
    assert all(beaten(p) or (p.step_time_s, p.memory_gib) in points for p in fitting)


# The bound every row of Table 1 meets: the published mesh's step time, at its best layout,
# against the fastest layout's of the default grid. Three rows miss the 5 % target (18.4 B
# +10.9 %, 39.1 B +8.9 %, 1,008 B +5.6 %; docs/planner.md says why); every other is within it.
EVERY_ROW = 1.15
WITHIN_5 = {1.7, 3.6, 7.5, 76.1, 145.6, 529.6, 1008.0}


@pytest.mark.slow
def test_megatron_lms_published_meshes_plan_near_the_best_of_the_grid() -> None:
    """Narayanan et al. 2021, Table 1, every row: the published t x p x d, at its best layout,
    plans within 15 % of the fastest layout of the default grid, and within 5 % on the rows
    docs/planner.md names (benchmarks/search.py prints them all). Not its rank among the meshes
    that fit: how many fit moves with what the grid holds (each row's unfused attention,
    trainer.attention=math, leaves out every context-parallel mesh, which the full grid held
    before)."""
    slower = {}
    for row in TABLE_1:
        args = [o for o in overrides(row) if not o.startswith(("parallel.", "mode="))]
        fitting = ranked(searched(*args).priced, "time")
        published = (row.gpus // (row.tp * row.pp), 1, row.pp, row.tp)
        (mine, *_) = [
            p for p in fitting if (p.layout.dp, p.layout.cp, p.layout.pp, p.layout.tp) == published
        ]
        slower[row.params_b] = mine.step_time_s / fitting[0].step_time_s
    assert max(slower.values()) <= EVERY_ROW, slower
    assert {b for b, s in slower.items() if s <= 1.05} == WITHIN_5, slower


@pytest.mark.slow
def test_a_search_is_one_run_with_its_table_chart_and_the_command_that_plans_the_best(
    cli, store: str, tmp_path: Path
) -> None:
    args = ["mode=search", *SLOW_LINK, "search.top=3", f"logger.tracking_uri={store}"]
    done = cli(*args, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    (said,) = [ln for ln in lines if " layouts in " in ln]
    assert "refused by rules (parallel.pp" in said and "ahead of the runner-up" in said
    (runner_line,) = [ln for ln in lines if ln.startswith("plan it: ")]
    (run,) = [r for r in all_runs(store) if r.data.tags.get("mode") == "search"]
    assert run.info.status == "FINISHED"
    client = MlflowClient(store)
    table = Path(client.download_artifacts(run.info.run_id, "layouts.csv")).read_text()
    rows = list(csv.DictReader(table.splitlines()))
    assert len(rows) == run.data.metrics[SEARCH_LAYOUTS.name]
    verdicts = [r["verdict"] for r in rows]
    assert verdicts.count("fit") == run.data.metrics[SEARCH_FIT.name]
    refused = [v for v in verdicts if v not in ("fit", "memory")]
    assert len(refused) == run.data.metrics[SEARCH_BY_RULES.name]
    assert set(refused) == {"parallel.pp"}  # too many stages
    picture = imread(client.download_artifacts(run.info.run_id, "search.png"))
    assert picture.shape[0] > 300
    params = run.data.params
    assert params["best.pp"] == "2" and params["best.plan_command"] in runner_line
    # The command plans the best layout at the step time the search found for it
    command = params["best.plan_command"].split()[3:]
    planned = cli(*command, "plan.json=true", cwd=tmp_path)
    assert planned.returncode == 0, planned.stderr
    figures = json.loads(planned.stdout.strip().splitlines()[-1])
    assert figures[STEP_TIME.name] == pytest.approx(run.data.metrics["best/step_time_s"], rel=1e-9)


def test_the_math_kernel_leaves_context_parallelism_out_of_the_default_grid() -> None:
    """trainer.attention=math: a cp rank runs its own ring kernel, so every cp mesh would be
    refused; the default grid tries none (Table 1's searches spent most of their time refusing
    them), and a cp the user lists is still tried and refused by the rule's key."""
    node = ["model=decoder", "hardware=dgx_a100", "data.batch_size=16"]
    fused = searched(*node)
    assert {p.layout.cp for p in fused.priced} > {1}  # the fused kernel's grid splits sequences
    plain = searched(*node, "trainer.attention=math")
    assert {p.layout.cp for p in plain.priced} == {1}
    assert "trainer.attention" not in plain.refusals.counts
    # The same layouts otherwise: every cp = 1 layout of the fused grid
    assert {p.layout for p in plain.priced} == {p.layout for p in fused.priced if p.layout.cp == 1}
    listed = searched(*node, "trainer.attention=math", "search.cp=[1,2]")
    assert {layout.cp for layout, _ in listed.refused} >= {2}
    assert listed.refusals.counts["trainer.attention"] > 0
