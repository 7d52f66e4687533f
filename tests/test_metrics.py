"""The registry of metrics (runner/metrics.py) and what it must agree with: docs/measurement.md
names every entry and no metric the runner does not log, the code spells no metric name itself,
and `registered` tells a logged key of the runner's from any other. That real runs log only
registered names is checked where the suite already trains or plans (tests/helpers/metrics.py)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from runner import metrics
from runner.metrics import REGISTRY, registered
from tests.helpers.metrics import unregistered
from tests.test_structure import docstrings

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "measurement.md"
# The sections of docs/measurement.md that list metrics, by the start of their `## ` heading; each
# runs to the next `## ` heading, its `### ` subsections included.
METRIC_SECTIONS = ("## Metrics", "## Sampled profiler traces", "## What measuring costs")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
SPAN = re.compile(r"`([^`\n]+)`")
PART = r"(?:[a-z0-9_]|<[a-z_]+>)+"
NAME_LIKE = re.compile(rf"{PART}(?:/{PART})*")
PLACEHOLDER = re.compile(r"<[a-z_]+>")


def metric_sections(text: str) -> str:
    """The metric sections' prose: fenced blocks (commands) dropped."""
    kept, keep = [], False
    for line in FENCE.sub("", text).splitlines():
        if line.startswith("## "):
            keep = line.startswith(METRIC_SECTIONS)
        if keep:
            kept.append(line)
    return "\n".join(kept)


def looks_like_a_metric(span: str) -> bool:
    """A backticked span names a metric when it is made of lowercase letters, digits, `_`, `/`
    and `<placeholder>`s only (no space, `=`, `.`, `-` or capital: not a config key, an override,
    a file, a precision or an environment variable), does not start with `/` (a path), and holds
    a `_` or a `/` outside its placeholders (not a bare word such as `dp`, nor a placeholder
    alone such as `<dim>`). Bare words (`mfu`, `z`) are not checked this way; they are registered
    names, checked the other way round."""
    rest = PLACEHOLDER.sub("", span)
    return bool(NAME_LIKE.fullmatch(span)) and ("_" in rest or "/" in rest)


def known(name: str) -> bool:
    """A registered pattern, as written, or a concrete key one matches."""
    return any(m.name == name for m in REGISTRY) or registered(name) is not None


def documented() -> set[str]:
    return set(SPAN.findall(metric_sections(DOC.read_text())))


def test_the_docs_name_every_registered_metric_as_the_registry_spells_it() -> None:
    assert sorted({m.name for m in REGISTRY} - documented()) == []


def test_every_metric_the_docs_name_is_one_the_runner_logs() -> None:
    named = {span for span in documented() if looks_like_a_metric(span)}
    assert sorted(span for span in named if not known(span)) == []


def test_what_looks_like_a_metric_in_the_docs() -> None:
    metric_like = ["comm_bytes_per_step/<dim>", "rank_3/idle_fraction", "<link>/latency_s",
                   "step_time_s", "comm_bytes_per_step/xx"]  # fmt: skip
    other = ["trainer.max_steps=3", "hardware.power_w", "/proc/self/clear_refs", "<dim>",
             "<memory_part>", "bf16-mixed", "MLFLOW_DISABLE_TELEMETRY", "dp", "mfu",
             "profile.trace.json", "mode=plan"]  # fmt: skip
    assert [looks_like_a_metric(s) for s in metric_like] == [True] * len(metric_like)
    assert [looks_like_a_metric(s) for s in other] == [False] * len(other)
    assert not known("comm_bytes_per_step/xx")  # the check would fail on it
    section = "## Metrics\n\n`a_b`\n\n```sh\n`c_d`\n```\n## Pictures\n\n`e_f`\n"
    assert SPAN.findall(metric_sections(section)) == ["a_b"]


@pytest.mark.parametrize(
    ("key", "pattern"),
    [
        ("rank_12/idle_fraction", "rank_<r>/idle_fraction"),
        ("comm_bytes_per_step/dp/reduce_scatter", "comm_bytes_per_step/dp/<collective>"),
        ("median_abs_error/comm_bytes_per_step/tp", "median_abs_error/<figure>"),
        ("p2p/latency_s", "<link>/latency_s"),
    ],
)
def test_a_logged_key_matches_its_pattern(key: str, pattern: str) -> None:
    found = registered(key)
    assert found is not None and found.name == pattern


# A value each placeholder may take, to make a concrete key of every pattern.
SAMPLES = {"dim": "tp", "r": "12", "collective": "reduce_scatter", "component": "attention",
           "memory_part": "optimizer_state", "time_part": "bubble", "precision": "bf16",
           "link": "p2p", "figure": "comm_bytes_per_step/pp", "node": "node_1",
           "system": "cpu_utilization_percentage"}  # fmt: skip


def test_every_entry_matches_its_concrete_keys() -> None:
    assert set(SAMPLES) == set(metrics.PARTS)
    for m in REGISTRY:
        parts = {p: SAMPLES[p] for p in metrics.PLACEHOLDER.findall(m.name)}
        found = registered(m.at(**parts), m.mode)
        assert found is not None and found.name == m.name, m


@pytest.mark.parametrize(
    ("key", "mode"),
    [
        ("step_time", None),  # a prefix of a name
        ("step_time_s_max", None),  # a form nobody registered
        ("rank_x/idle_fraction", None),  # a rank is a number
        ("rank_0/step_time_s", None),  # step time is not logged per rank
        ("rank_<r>/idle_fraction", None),  # the pattern itself is no logged key
        ("comm_bytes_per_step/xp", None),  # no such mesh dimension
        ("comm_bytes_per_step/dp/all_to_all", None),  # no such collective
        ("comm_bytes_per_step/tp/all_gather", None),  # per collective: data parallelism's only
        ("pred/train_time_s", None),  # nothing predicts it
        ("median_abs_error/train_loss", "report"),  # not predicted: not reported
        ("median_abs_error/pred/step_time_s", "report"),
        ("loss", "train"),  # the worked example's, not training's
        ("tokens_per_s", "train"),  # the plan's
        ("bubble_fraction", "train"),  # a rank's own, combined into bubble_fraction_measured
        ("mem_per_device_gib/swap", "plan"),
    ],
)
def test_a_key_the_runner_does_not_log_matches_nothing(key: str, mode: str | None) -> None:
    assert registered(key, mode) is None
    assert unregistered({key: 1.0}, mode) == [key]


def test_the_helpers_build_registered_names() -> None:
    assert metrics.COMM_BYTES_PER_STEP.at(dim="tp") == "comm_bytes_per_step/tp"
    assert metrics.of_rank(metrics.PEAK_ALLOCATED, 3) == "rank_3/peak_allocated_gib"
    assert metrics.worst(metrics.COMM_OVERLAP_FRACTION) == "comm_overlap_fraction_max"
    assert metrics.prediction(metrics.STEP_TIME.name) == "pred/step_time_s"
    assert metrics.prediction(metrics.BUBBLE_MEASURED.name) == "bubble_fraction_theory"
    assert metrics.REPORT_ERROR.at(figure="mfu") == "median_abs_error/mfu"
    assert (metrics.PLAN_MTBF.group, metrics.PLAN_MTBF.leaf) == ("snapshots", "job_mtbf_hours")
    with pytest.raises(ValueError, match="dim"):
        metrics.COMM_BYTES_PER_STEP.at()  # a part left out
    with pytest.raises(ValueError, match="rank"):
        metrics.STEP_TIME.at(rank=0)  # a part the name does not have
    with pytest.raises(KeyError, match="rank_<r>/step_time_s"):
        metrics.of_rank(metrics.STEP_TIME, 0)  # no per-rank form registered


def test_every_entry_is_whole_and_named_once_per_mode() -> None:
    for m in REGISTRY:
        assert m.unit is not None and m.meaning and m.mode, m
        assert "\n" not in m.meaning, m
        assert set(metrics.PLACEHOLDER.findall(m.name)) <= set(metrics.PARTS), m
        if m.writer.startswith("runner."):  # the runner's own module makes the key
            path = ROOT / m.writer.replace(".", "/")
            assert path.with_suffix(".py").is_file() or (path / "__init__.py").is_file(), m
    names = [(m.mode, m.name) for m in REGISTRY]
    assert len(names) == len(set(names))


# Literals in the code that equal a registered name but are not that metric.
NOT_METRICS = {
    ("runner/config/hardware.py", "step_overhead_s"): "a hardware profile's field",
    ("runner/config/plan.py", "hours"): "plan.hours, the config's",
    ("runner/modes/calibrate/__init__.py", "step_overhead_s"): "the profile it writes: its field",
    ("runner/modes/calibrate/__init__.py", "cores"): "the profile it writes: its field",
    ("runner/modes/plan.py", "fits"): "the run's tag, and the table's word",
    ("runner/planner/host_figures.py", "step_overhead_s"): "the profile's field it keeps",
    ("runner/planner/host_figures.py", "cores"): "the profile's field it keeps",
    ("runner/planner/__init__.py", "mfu"): "__all__: the function",
    ("runner/tracking/store.py", "world_size"): "the run's tag",
    ("runner/training/callbacks/rank_timing.py", "bubble_fraction"): "a rank's own, not logged",
}


def string_literals(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every string constant of the code, docstrings left out (prose)."""
    tree = ast.parse(path.read_text())
    prose = docstrings(tree)
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose
    ]


def test_no_module_spells_a_metric_name_itself() -> None:
    """Every metric name is written in runner/metrics.py only: everywhere else it is read from
    there. A literal equal to a logged name or a registered pattern is one spelt twice."""
    names = {m.name for m in REGISTRY}
    found = []
    for folder in ("runner", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            where = str(path.relative_to(ROOT))
            if where == "runner/metrics.py":
                continue
            found += [
                f"{where}:{line}: {text}"
                for line, text in string_literals(path)
                if (text in names or registered(text)) and (where, text) not in NOT_METRICS
            ]
    assert found == []
