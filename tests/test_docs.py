"""The docs cannot drift (issue 15): every command in README.md and docs/*.md runs here.

Commands in ```sh blocks are runnable; ```text blocks hold what cannot run here (GPUs, SLURM,
servers) and the transcripts of bad input. Each `python -m runner ...` command runs through the
command line's entry point in this process (tests/helpers/in_process.py), in a folder of its
document's own, in the document's order (a report needs its sweep, a calibrated profile its
calibration, a resume its killed job), shortened by trainer overrides unless it snapshots, resumes
or injects a fault; a command printed on several pages runs on one of them. `make TARGET` and
`.venv/bin/python -m benchmarks.NAME` take minutes or run the suite itself: they must name a
target or a module that exists. Any other command fails the check, so
that nothing printed goes unchecked. The claims printed beside the commands (the seed's price,
sweep sizes, process counts, worked examples, faults and resume, equal losses, the one-line
errors) are asserted where a run can show them.

docs/extending.md's "Add a model" is followed by tests/test_extending.py and left out here.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient
from mlflow.entities import Run

from runner import validate
from runner.metrics import (
    CALIBRATE_MEMORY_BANDWIDTH,
    CALIBRATE_WORKSPACE,
    COST,
    ENERGY,
    EXAMPLE_GRAD_W_A1,
    EXAMPLE_GRAD_W_B1,
    EXAMPLE_Y_HAT,
    EXAMPLE_Y_HAT_SHIFTED,
    EXAMPLE_Z,
    LOST_STEPS,
    LOST_TIME,
    PLAN_FITS,
)
from tests.helpers.jobs import REPOSITORY, compose_job
from tests.helpers.metrics import assert_registered
from tests.helpers.records import all_runs, assert_redone_steps_repeat, logged_per_step, loss_series

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)
RUNNER = ("python", "-m", "runner")
# Sections that another test runs: tests/test_extending.py writes the toy model before its commands.
# tests/test_studies.py runs the studies, tests/test_network.py the network study.
COVERED_ELSEWHERE = {
    "extending.md": "## Add a model",
    "studies.md": "## The studies",
    "network.md": "## The study: idle time as the link narrows",
}
# Appended to each command, unless it sets the key itself (Hydra keeps the last value of a key).
SHORTEN = [
    "trainer.max_steps=3",
    "trainer.warmup_steps=1",
    "trainer.val_batches=0",
    "trainer.progress_bar=false",
    "trainer.val_every_n_steps=3",
]
# A command that snapshots, resumes or injects a fault runs as printed: its steps are its point.
AS_PRINTED = ("fault.", "checkpoint.", "resume")
# Shortened even where the command sets it: the length a command prints is incidental to what it
# shows (equal losses, a layout that runs), and a run's length is most of the suite's time.
ALWAYS = {"trainer.max_steps"}


# --- reading the documents ---


@dataclass(frozen=True)
class Block:
    doc: str  # the path relative to the repository, e.g. docs/planner.md
    language: str
    body: str
    line: int  # the line of the block's first body line in the document
    after: str  # the prose between the block and the next fenced block


@dataclass(frozen=True)
class Command:
    doc: str
    line: int
    argv: tuple[str, ...]
    comment: str  # the comment lines just above it in its block, and its own trailing comment
    block: Block
    last_in_block: bool

    def __str__(self) -> str:
        return shlex.join(self.argv)

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


def document_text(path: Path) -> str:
    """The document, less any section another test runs (blanked, so line numbers hold)."""
    text = path.read_text()
    heading = COVERED_ELSEWHERE.get(path.name)
    if heading and heading in text:
        head, rest = text.split(heading, 1)
        section, sep, tail = rest.partition("\n## ")
        text = head + "\n" * (heading + section).count("\n") + sep + tail
    return text


def blocks(path: Path) -> list[Block]:
    text = document_text(path)
    found = list(FENCE.finditer(text))
    out = []
    for i, match in enumerate(found):
        end = found[i + 1].start() if i + 1 < len(found) else len(text)
        line = text.count("\n", 0, match.start(2)) + 1
        doc = str(path.relative_to(ROOT))
        out.append(Block(doc, match.group(1), match.group(2), line, text[match.end() : end]))
    return out


def commands(path: Path) -> list[Command]:
    """Every command of the ```sh blocks: continuation lines joined, comments dropped."""
    out = []
    for block in blocks(path):
        if block.language != "sh":
            continue
        found: list[Command] = []
        above: list[str] = []
        pending, first = "", 0
        for offset, raw in enumerate(block.body.splitlines()):
            if not pending and raw.lstrip().startswith("#"):
                above.append(raw.strip().lstrip("#").strip())
                continue
            if not pending and not raw.strip():
                above = []
                continue
            if not pending:
                first = block.line + offset
            if raw.rstrip().endswith("\\"):
                pending += raw.rstrip()[:-1] + " "
                continue
            full, pending = pending + raw, ""
            trailing = re.search(r"\s#\s?(.*)$", full)
            comment = " ".join([*above, trailing.group(1) if trailing else ""]).strip()
            argv = tuple(shlex.split(full, comments=True))
            found.append(Command(block.doc, first, argv, comment, block, False))
            above = []
        assert not pending, f"{block.doc}:{block.line}: a block ends inside a continued line"
        if found:
            found[-1] = replace(found[-1], last_in_block=True)
        out += found
    return out


def kind(argv: tuple[str, ...]) -> str:
    if argv[:3] == RUNNER:
        return "runner"
    if argv[:1] == ("make",):
        return "make"
    if argv[:2] == (".venv/bin/python", "-m") and argv[2:3]:
        return "benchmark" if argv[2].split(".")[0] == "benchmarks" else "unknown"
    return "unknown"


def makefile_targets() -> set[str]:
    return set(re.findall(r"^([\w.-]+):", (ROOT / "Makefile").read_text(), re.MULTILINE))


def benchmark_file(module: str) -> Path:
    parts = module.split(".")
    if len(parts) == 1:
        return ROOT / "benchmarks" / "__main__.py"
    return ROOT.joinpath(*parts[:-1], parts[-1] + ".py")


def override_key(arg: str) -> str | None:
    if arg.startswith("-") or "=" not in arg:
        return None
    return arg.split("=", 1)[0].lstrip("+~")


def overrides(cmd: Command) -> dict[str, str]:
    """The command's key=value overrides, as typed (a sweep's values still comma-separated)."""
    out = {}
    for arg in cmd.argv[3:]:
        key = override_key(arg)
        if key is not None:
            out[key] = arg.split("=", 1)[1]
    return out


def expected_exit(cmd: Command) -> int:
    """A command that injects a fault (a `fault.` key other than its step) exits with 1; one told
    to stop (fault.preempt_at_step) with 3, resumable (runner/launcher/preemption.py); any other
    with 0."""
    faults = {
        k for k, v in overrides(cmd).items()
        if k.startswith("fault.") and k != "fault.at_step" and v != "null"
    }  # fmt: skip
    if "fault.preempt_at_step" in faults:
        return 3
    return 1 if faults else 0


def fails_on_purpose(cmd: Command) -> bool:
    return expected_exit(cmd) != 0


def run_args(cmd: Command) -> list[str]:
    """The command's arguments, shortened by SHORTEN unless it must run as printed."""
    args = list(cmd.argv[3:])
    keys = set(overrides(cmd)) - ALWAYS
    if any(k.startswith(AS_PRINTED) for k in keys):
        return args
    return args + [o for o in SHORTEN if override_key(o) not in keys]


def top_level_values(value: str) -> list[str]:
    """A sweep's comma-separated values; commas inside [] or () belong to one value."""
    values, depth, start = [], 0, 0
    for i, ch in enumerate(value):
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        elif ch == "," and depth == 0:
            values.append(value[start:i])
            start = i + 1
    return [*values, value[start:]]


def is_sweep(cmd: Command) -> bool:
    return "-m" in cmd.argv[3:] or "--multirun" in cmd.argv[3:]


def sweep_jobs(cmd: Command) -> int:
    return math.prod(len(top_level_values(v)) for v in overrides(cmd).values())


def transcripts(path: Path) -> list[tuple[str, tuple[str, ...], str]]:
    """(where, argv, error) of every `$ python -m runner ...` in a ```text block followed by an
    `error:` line; an error wrapped over lines is one line (the docs say so where they wrap)."""
    out = []
    for block in blocks(path):
        if block.language != "text":
            continue
        lines = block.body.splitlines()
        for i, line in enumerate(lines):
            if not line.startswith("$ python -m runner"):
                continue
            printed = []
            for following in lines[i + 1 :]:
                if following.startswith("$ "):
                    break
                printed.append(following.strip())
            error = " ".join(printed).strip()
            if error.startswith("error:"):
                argv = tuple(shlex.split(line[2:], comments=True))
                out.append((f"{block.doc}:{block.line + i}", argv, error))
    return out


ALL_COMMANDS = [c for doc in DOCS for c in commands(doc)]
# A command printed on several pages runs on the first that prints it, topic pages before the
# README's overview (a report and the sweep it reads are printed together, so move together).
RUN_ON: dict[tuple[str, ...], str] = {}
for _cmd in [c for doc in [*DOCS[1:], DOCS[0]] for c in commands(doc)]:
    RUN_ON.setdefault(_cmd.argv, _cmd.doc)


def runs_on_another_page(cmd: Command) -> bool:
    return RUN_ON[cmd.argv] != cmd.doc


RUN_DOCS = [doc for doc in DOCS if any(kind(c.argv) == "runner" for c in commands(doc))]
TRANSCRIPTS = [t for doc in DOCS for t in transcripts(doc)]


# --- the quick checks: what is printed is of a known form and names what exists ---


def test_the_documents_print_commands_and_transcripts() -> None:
    assert len([c for c in ALL_COMMANDS if kind(c.argv) == "runner"]) >= 40, ALL_COMMANDS
    assert {doc.name for doc in RUN_DOCS} >= {"README.md", "planner.md", "reliability.md"}
    assert len(TRANSCRIPTS) >= 4, TRANSCRIPTS


def test_every_documented_command_is_run_or_names_what_exists() -> None:
    targets = makefile_targets()
    problems = []
    for cmd in ALL_COMMANDS:
        what = kind(cmd.argv)
        if what == "make":
            missing = [t for t in cmd.argv[1:] if not t.startswith("-") and t not in targets]
            if len(cmd.argv) < 2 or missing:
                problems.append(f"{cmd.where}: `{cmd}`: no such Makefile target {missing}")
        elif what == "benchmark":
            path = benchmark_file(cmd.argv[2])
            if not path.is_file():
                problems.append(f"{cmd.where}: `{cmd}`: no {path.relative_to(ROOT)}")
        elif what == "unknown":
            problems.append(
                f"{cmd.where}: `{cmd}` is of no form this test checks: a ```sh block holds "
                "`python -m runner ...` (run here), `make TARGET` or `.venv/bin/python -m "
                "benchmarks.NAME` (checked to exist); put what cannot run here in a ```text block"
            )
    assert not problems, "\n".join(problems)


def test_a_command_says_it_fails_on_purpose_exactly_when_it_injects_a_fault() -> None:
    wrong = [
        f"{c.where}: `{c}`: injects a fault: {fails_on_purpose(c)}; comment: {c.comment!r}"
        for c in ALL_COMMANDS
        if kind(c.argv) == "runner" and fails_on_purpose(c) != ("on purpose" in c.comment)
    ]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize(("where", "argv", "error"), TRANSCRIPTS, ids=[t[0] for t in TRANSCRIPTS])
def test_bad_input_fails_as_the_transcript_shows(
    tmp_path: Path,
    cli: Callable[..., subprocess.CompletedProcess],
    where: str,
    argv: tuple[str, ...],
    error: str,
) -> None:
    assert argv[:3] == RUNNER, where
    done = cli(*argv[3:], cwd=tmp_path)
    last = (done.stderr.strip().splitlines() or [""])[-1]
    assert (done.returncode, last) == (2, error), f"{where}: `{shlex.join(argv)}`\n{done.stderr}"


# --- the slow check: every command runs, and its claims hold ---


@dataclass
class Outcome:
    cmd: Command
    args: list[str]
    done: subprocess.CompletedProcess
    seconds: float
    root: Path
    uri: str
    new: list[Run] = field(default_factory=list)

    @property
    def keys(self) -> dict[str, str]:
        return overrides(self.cmd)

    def parent(self) -> Run:
        (parent,) = [r for r in self.new if r.data.tags.get("mode") == "sweep"]
        return parent

    def trained(self) -> list[Run]:
        """Its runs of jobs: a sweep's children, or the one run of a single job."""
        return [r for r in self.new if r.data.tags.get("mode") != "sweep"]


def tracking_uri(cmd: Command, root: Path) -> str:
    uri = overrides(cmd).get("logger.tracking_uri", "sqlite:///mlflow.db")
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return f"sqlite:///{root / uri.removeprefix('sqlite:///')}"
    return uri


def runs_in(uri: str) -> list[Run]:
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).exists():
        return []  # not made yet: opening it would make its tables
    return all_runs(uri)


def printed_number(text: str) -> tuple[float, float]:
    """A number as printed, and half its last digit: what its rounding allows."""
    decimals = len(text.split(".")[1]) if "." in text else 0
    return float(text), 0.5 * 10**-decimals + 1e-12


def check_runs_recorded(o: Outcome, history: list[Outcome]) -> bool:
    """A job records one run (a sweep a parent and a child per job: README), FINISHED, or FAILED
    when it fails; `--cfg job` prints the config and records nothing; a resume adds no run, but
    on another layout (reliability.md: "a new run from step N")."""
    if "--cfg" in o.args:
        assert o.new == [], "--cfg job recorded a run"
        printed = yaml.safe_load(o.done.stdout)
        assert {"model", "data", "trainer"} <= set(printed), o.done.stdout[:500]
        return True
    if "resume" in o.keys and "a new run from step" not in o.cmd.comment:
        assert o.new == [], "a resume opened a new run rather than continuing its own"
        return True
    status = {0: "FINISHED", 1: "FAILED", 3: "KILLED"}[expected_exit(o.cmd)]
    if is_sweep(o.cmd):
        parent = o.parent()
        children = [r for r in o.new if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
        assert len(o.new) == 1 + len(children), "a sweep's run is not nested under its parent"
        assert len(children) == sweep_jobs(o.cmd), (
            f"{len(children)} child runs, but the values swept give {sweep_jobs(o.cmd)} jobs"
        )
        assert {r.info.status for r in o.new} == {status}
    else:
        (run,) = o.new
        assert run.info.status == status, run.info.status
        for group in ("model", "hardware"):
            if group in o.keys:
                assert run.data.tags[group] == o.keys[group], (group, run.data.tags)
    if "logger.experiment_name" in o.keys:
        client = MlflowClient(o.uri)
        names = {client.get_experiment(r.info.experiment_id).name for r in o.new}
        assert names == {o.keys["logger.experiment_name"]}
    return True


def check_counts_in_comment(o: Outcome, history: list[Outcome]) -> bool:
    """Comments such as "3 jobs, each on 2 processes", "4 layouts", "2 replicas x 2 shards: 4
    processes", "heads split over 2 ranks", "4 layers on 4 devices": the runs show them."""
    jobs = re.search(r"\b(\d+) (?:jobs|layouts)\b", o.cmd.comment)
    if jobs:
        assert len(o.trained()) == int(jobs.group(1)), (jobs.group(0), len(o.trained()))
    procs = re.search(r"(?<!to )\b(\d+) (?:processes|ranks)\b|\bon (\d+) devices\b", o.cmd.comment)
    if procs and "--cfg" not in o.args:
        n = procs.group(1) or procs.group(2)
        assert {r.data.tags.get("world_size") for r in o.trained()} == {n}, procs.group(0)
    return bool(jobs or procs)


def check_price(o: Outcome, history: list[Outcome]) -> bool:
    """planner.md: the seed's price "gives 50,000 devices, 25,200,000 kWh and $2,520,000"."""
    said = re.search(r"It gives ([\d,]+) devices, ([\d,.]+) kWh and \$([\d,.]+)", o.cmd.block.after)
    if not (said and o.cmd.last_in_block):
        return False
    devices, kwh, usd = (float(s.replace(",", "")) for s in said.groups())
    (run,) = o.new
    m = run.data.metrics
    assert (m["world_size"], m[ENERGY.name], m[COST.name]) == pytest.approx((devices, kwh, usd))
    assert run.data.tags["world_size"] == str(int(devices))
    return True


def check_fits(o: Outcome, history: list[Outcome]) -> bool:
    """planner.md: after the plan sweep, "Two layouts fit: tp 4 x pp 16 and tp 8 x pp 16": the
    children tagged fits=yes are exactly those."""
    said = re.match(r"\s*\w+ layouts fit: ((?:tp \d+ x pp \d+(?:,| and)? ?)+)", o.cmd.block.after)
    if not (said and is_sweep(o.cmd) and o.cmd.last_in_block):
        return False
    named = {tuple(map(int, pair)) for pair in re.findall(r"tp (\d+) x pp (\d+)", said.group(1))}
    fitting = {
        (int(r.data.params["parallel.tp"]), int(r.data.params["parallel.pp"]))
        for r in o.trained()
        if r.data.tags[PLAN_FITS.name] == "yes"
    }
    assert fitting == named, (fitting, named)
    return True


def check_plan_json(o: Outcome, history: list[Outcome]) -> bool:
    """planner.md: with `plan.json=true` the plan prints one JSON object as the last line."""
    if o.keys.get("plan.json") != "true":
        return False
    plan = json.loads(o.done.stdout.strip().splitlines()[-1])
    assert plan["world_size"] == o.new[0].data.metrics["world_size"]
    return True


def check_worked_example(o: Outcome, history: list[Outcome]) -> bool:
    """README: "z = 4.8, y_hat = 0.992; bias -4.0 -> 0.622" and "y_hat 1.7, loss 0.245,
    gradients 0.84 and 2.1", logged as metrics."""
    printed = {
        "seed_neuron": {
            EXAMPLE_Z.name: r"z = ([\d.]+)",
            EXAMPLE_Y_HAT.name: r"y_hat = ([\d.]+)",
            EXAMPLE_Y_HAT_SHIFTED.name: r"-> ([\d.]+)",
        },
        "seed_backprop": {
            EXAMPLE_Y_HAT.name: r"y_hat ([\d.]+)",
            "loss": r"loss ([\d.]+)",
            EXAMPLE_GRAD_W_A1.name: r"gradients ([\d.]+)",
            EXAMPLE_GRAD_W_B1.name: r"gradients [\d.]+ and ([\d.]+)",
        },
    }.get(o.keys.get("experiment", ""), {})
    found = {k: re.search(p, o.cmd.comment) for k, p in printed.items()}
    if not any(found.values()):
        return False
    (run,) = o.new
    for metric, match in found.items():
        if match:
            value, slack = printed_number(match.group(1))
            assert abs(run.data.metrics[metric] - value) <= slack, (metric, run.data.metrics)
    return True


def check_fault(o: Outcome, history: list[Outcome]) -> bool:
    """reliability.md: "the run's tag failed_rank is 1"; "rank 0 gives up after 30 s"; "The
    snapshot at step 10 fails: no space left" and leaves the previous snapshot the newest."""
    tag = re.search(r"tag failed_rank is (\d+)", o.cmd.comment)
    if tag:
        assert o.new[0].data.tags.get("failed_rank") == tag.group(1), o.new[0].data.tags
    if "fault.hang_rank" in o.keys:
        timeout = float(o.keys.get("dist.timeout_s", 600))
        assert o.seconds >= timeout, f"ended after {o.seconds:.0f} s, before the {timeout} s"
    if "fault.disk_full_at_step" in o.keys:
        at, every = int(o.keys["fault.disk_full_at_step"]), int(o.keys["checkpoint.every_n_steps"])
        folder = o.root / o.keys.get("checkpoint.dir", "snapshots") / o.new[0].info.run_id
        complete = sorted(p.name for p in folder.glob("step_*") if p.name[5:].isdigit())
        assert complete[-1:] == [f"step_{at - every:08d}"], complete
        assert "no space left" in o.done.stderr.lower(), o.done.stderr[-2000:]
        # One line, no traceback; the failing step's loss kept, and what the failure cost.
        assert "Traceback" not in o.done.stderr, o.done.stderr[-2000:]
        assert o.done.stderr.strip().splitlines()[-1].startswith("error: "), o.done.stderr[-500:]
        assert len(loss_series(o.uri, o.new[0].info.run_id)) == at
        assert {LOST_STEPS.name, LOST_TIME.name} <= set(o.new[0].data.metrics), o.new[
            0
        ].data.metrics
    return bool(tag) or any(k in o.keys for k in ("fault.hang_rank", "fault.disk_full_at_step"))


def check_resume(o: Outcome, history: list[Outcome]) -> bool:
    """reliability.md: "Continue from step 10, in the same run: steps 10 and 11 are redone; the
    run ends FINISHED" and "In the kill-and-resume example above, `lost_steps` is 2"."""
    if o.keys.get("resume") != "auto":
        return False
    snapshotting = ("checkpoint.every_n_steps", "fault.preempt_at_step")
    (killed,) = [
        h for h in history if any(k in h.keys for k in snapshotting) and fails_on_purpose(h.cmd)
    ][-1:]
    run_id = killed.new[0].info.run_id
    if "a new run from step" in o.cmd.comment:
        return check_resumed_elsewhere(o, run_id)
    run = MlflowClient(o.uri).get_run(run_id)
    assert run.info.status == "FINISHED", run.info.status
    steps = int(o.keys.get("trainer.max_steps", 0))
    assert len(logged_per_step(o.uri, run_id)) == steps
    redone = re.search(r"steps (\d+) and (\d+) are redone", o.cmd.comment)
    if redone:
        first, last = map(int, redone.groups())
        assert_redone_steps_repeat(o.uri, run_id, range(first, last + 1))
    lost = re.search(r"kill-and-resume example above, `lost_steps` is (\d+)", o.cmd.block.after)
    lost = lost or re.search(
        r"kill-and-resume example above, `lost_steps` is (\d+)", document_text(ROOT / o.cmd.doc)
    )
    if lost and "fault.kill_rank" in killed.keys:
        assert run.data.metrics.get(LOST_STEPS.name) == float(lost.group(1)), run.data.metrics
    return True


def check_resumed_elsewhere(o: Outcome, killed: str) -> bool:
    """reliability.md: "The same snapshot on one process: a new run from step 20, tagged
    resumed_from, for 5 steps"."""
    start, steps = map(int, re.search(r"from step (\d+).* for (\d+) steps", o.cmd.comment).groups())
    (new,) = o.new
    assert new.data.tags["resumed_from"] == f"{killed}/step_{start:08d}", new.data.tags
    assert list(logged_per_step(o.uri, new.info.run_id)) == list(range(start, start + steps))
    assert f"a new run from its step {start}" in o.done.stdout, o.done.stdout[-1000:]
    return True


def check_calibrate(o: Outcome, history: list[Outcome]) -> bool:
    """planner.md: mode=calibrate measures this host into conf/hardware/calibrated.yaml where it
    ran (never into the package: the test checks the repository's own conf/ is untouched), a
    complete profile that hardware=calibrated composes there: each precision's matmul peak (a
    CPU's fp32, bf16 and fp8) with its curve (the best size's share 1; fp32's 32-square product
    far below it), a large copy's bandwidth, the links' times growing with the message."""
    if o.keys.get("mode") != "calibrate":
        return False
    (run,) = o.new
    assert_registered(run)
    client = MlflowClient(o.uri)
    measured = json.loads(
        Path(client.download_artifacts(run.info.run_id, "calibration.json")).read_text()
    )
    peaks = measured["matmul_flops"]
    # fp32, bf16, and fp8: torch 2.13's CPU build multiplies float8 (the project's pin)
    assert set(peaks) == {"fp32", "bf16", "fp8"} and min(peaks.values()) > 1e8  # 0.1 GFLOP/s
    for link in ("all_reduce", "p2p"):  # more bytes take longer; loopback moves > 10 MB/s
        assert measured["times"][link][-1] > measured["times"][link][0]
        assert measured[link]["bandwidth_bytes_s"] > 1e7
    assert measured[CALIBRATE_MEMORY_BANDWIDTH.name] > 1e9  # any host copies 1 GB/s
    with contextlib.chdir(o.root):  # ./conf is on Hydra's search path where the reader works
        cfg, choices = compose_job("hardware=calibrated", "mode=plan")
    assert choices["hardware"] == "calibrated"
    validate.check_profile(cfg.hardware)
    for key, flops in peaks.items():
        assert cfg.hardware.peak_tflops[key] == pytest.approx(flops / 1e12, rel=1e-3)
        shares = dict(map(tuple, cfg.hardware.gemm_efficiency[key]))
        assert max(shares.values()) == 1.0 and min(shares.values()) > 0
    # fp32's BLAS on any CPU: a 32-square product is call overhead, far below the peak. Not bf16's:
    # where the CPU has no bf16 instructions its products peak small (the AVX2 EPYC: 128 best,
    # 32 at 0.82, 1,024 at 0.31), and beside another process's load 32 came out best once.
    fp32 = dict(map(tuple, cfg.hardware.gemm_efficiency["fp32"]))
    assert fp32[32] < 0.5 * max(fp32.values())
    assert 0 < cfg.hardware.compute_efficiency <= 1
    # what the runner's rank held beyond its tensors, as the planner reads it (MiB)
    workspace = measured[CALIBRATE_WORKSPACE.name] / 2**20
    assert cfg.hardware.workspace_mib[measured["compute"]] == pytest.approx(workspace, abs=0.01)
    return True


def check_host_figures(o: Outcome, history: list[Outcome]) -> bool:
    """planner.md: after mode=calibrate, a job with hardware.figures=host is priced with what it
    measured (kept for this host: no second calibration), and its run says so."""
    if o.keys.get("hardware.figures") != "host":
        return False
    (calibrated,) = [h for h in history if h.keys.get("mode") == "calibrate"]
    (cal_run,) = calibrated.new
    (run,) = o.new
    assert "calibrating" not in o.done.stdout, o.done.stdout[-1000:]
    assert run.data.tags["priced_by"].startswith("this host's figures (")
    flops = cal_run.data.metrics["matmul_flops/fp32"]
    assert float(run.data.params["hardware.peak_tflops.fp32"]) == pytest.approx(flops / 1e12)
    return True


def check_report(o: Outcome, history: list[Outcome]) -> bool:
    """planner.md: mode=report compares the newest sweep's runs."""
    if o.keys.get("mode") != "report":
        return False
    sweeps = [h for h in history if is_sweep(h.cmd) and h.uri == o.uri and h.new]
    assert sweeps, "a report with no sweep before it"
    (run,) = o.new
    assert run.data.tags.get("report.sweep") == sweeps[-1].parent().info.run_id, run.data.tags
    return True


def check_equal_losses(o: Outcome, history: list[Outcome]) -> bool:
    """parallelism.md: with `model.dropout=0` a layout's train_loss equals the single process's,
    step for step (to 1e-5 relative); a sweep that says "the same losses", each of its jobs."""
    layout = {"parallel", "hardware.devices"} | {k for k in o.keys if k.startswith("parallel.")}
    said = "the same losses" in o.cmd.comment if is_sweep(o.cmd) else "model.dropout" in o.keys
    if not said or o.keys.get("model.dropout", "0") != "0" or not (layout & set(o.keys)):
        return False
    same = {k: v for k, v in o.keys.items() if k not in layout}
    singles = [
        h
        for h in history
        if h.keys == same and not is_sweep(h.cmd) and h.cmd.doc == o.cmd.doc and h.new
    ]
    assert singles, f"no single-process run of {same} before it on its page"
    single = loss_series(o.uri, singles[-1].new[0].info.run_id)
    for run in o.trained():
        parallel = loss_series(o.uri, run.info.run_id)
        assert len(parallel) == len(single) > 0
        assert parallel == pytest.approx(single, rel=1e-5), run.info.run_name
    return True


CHECKS = [
    check_runs_recorded,
    check_counts_in_comment,
    check_price,
    check_fits,
    check_plan_json,
    check_worked_example,
    check_fault,
    check_resume,
    check_calibrate,
    check_host_figures,
    check_report,
    check_equal_losses,
]


# The claims each document prints beside its commands: should a rewording hide one from its check,
# the check must not go quiet.
CLAIMS = {
    "README.md": {"check_counts_in_comment", "check_worked_example"},  # its report: planner.md's
    "docs/measurement.md": {"check_counts_in_comment"},
    "docs/parallelism.md": {"check_counts_in_comment", "check_equal_losses"},
    "docs/planner.md": {
        "check_price",
        "check_fits",
        "check_plan_json",
        "check_calibrate",
        "check_host_figures",
        "check_report",
    },
    "docs/reliability.md": {"check_fault", "check_resume"},
}


def configs_state() -> list[tuple[str, int]]:
    """Every config file of the repository (conf/ and experiments/ at its top), as it is."""
    found = [*(REPOSITORY / "conf").rglob("*"), *(REPOSITORY / "experiments").rglob("*")]
    return sorted((str(p), p.stat().st_mtime_ns) for p in found if p.is_file())


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("doc", RUN_DOCS, ids=[str(d.relative_to(ROOT)) for d in RUN_DOCS])
def test_every_command_of_the_document_runs_as_printed(
    doc: Path,
    tmp_path: Path,
    empty_store: Path,
    cli: Callable[..., subprocess.CompletedProcess],
    record_property: Callable[[str, object], None],
) -> None:
    root = tmp_path / "here"  # where the document's reader types its commands
    root.mkdir()
    shutil.copy(empty_store, root / "mlflow.db")  # made already, as after a reader's first run
    configs_before = configs_state()
    history: list[Outcome] = []
    failures: list[str] = []
    timings: list[str] = []
    asserted: set[str] = set()
    started = time.monotonic()
    for cmd in [c for c in commands(doc) if kind(c.argv) == "runner"]:
        if runs_on_another_page(cmd):
            continue
        args = run_args(cmd)
        uri = tracking_uri(cmd, root)
        before = {r.info.run_id for r in runs_in(uri)}
        start = time.monotonic()
        done = cli(*args, cwd=root)
        seconds = time.monotonic() - start
        timings.append(f"{seconds:7.1f} s  {cmd.where}  {cmd}")
        expected = expected_exit(cmd)
        if done.returncode != expected:
            failures.append(
                f"{cmd.where}: `{cmd}`\n  ran as: python -m runner {shlex.join(args)}\n"
                f"  exit code {done.returncode}, expected {expected}\n"
                f"  stderr's end:\n{done.stderr[-3000:]}"
            )
            continue
        new = [r for r in runs_in(uri) if r.info.run_id not in before]
        outcome = Outcome(cmd, args, done, seconds, root, uri, new)
        for check in CHECKS:
            try:
                if check(outcome, history):
                    asserted.add(check.__name__)
            except Exception as error:  # reported with the others, below
                failures.append(
                    f"{cmd.where}: `{cmd}`\n  ran as: python -m runner {shlex.join(args)}\n"
                    f"  {check.__name__}: {type(error).__name__}: {error}"
                )
        history.append(outcome)
    # Each command's time, in --junitxml's report and on a failure
    record_property("seconds", f"{time.monotonic() - started:.0f}")
    record_property("timings", "\n".join(timings))
    print(f"\n{doc.relative_to(ROOT)}: {time.monotonic() - started:.0f} s")
    print("\n".join(timings))
    assert configs_state() == configs_before, "a command wrote into the repository's configs"
    assert not failures, "\n\n".join(failures)
    unchecked = CLAIMS.get(str(doc.relative_to(ROOT)), set()) - asserted
    assert not unchecked, f"claims no command of {doc.name} showed: {sorted(unchecked)}"
