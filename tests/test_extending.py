"""docs/extending.md's recipe for a model, followed to the letter: its blocks written into a copy
of the repository, the toy trained with every layout and planned, each layout's losses equal to
the single process's."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from runner.metrics import PLAN_PARAMS
from tests.helpers.jobs import QUICK, copy_of_the_repository
from tests.helpers.records import all_runs, loss_series

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "docs" / "extending.md"
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)
LAYOUTS = {"none", "data", "pipeline", "tensor"}


def model_recipe() -> list[tuple[str, str]]:
    """(language, text) of every fenced block of the section "Add a model"."""
    text = RECIPE.read_text()
    section = text.split("## Add a model", 1)[1].split("\n## ", 1)[0]
    return BLOCK.findall(section)


def follow(recipe: list[tuple[str, str]], root: Path) -> list[str]:
    """Write each block that names its file in its first line; put the registry's new line in
    place; return the commands of the shell blocks."""
    commands = []
    for language, body in recipe:
        first = body.splitlines()[0]
        if language == "sh":
            commands += [line for line in body.splitlines() if line.startswith("python -m runner")]
        elif first.startswith("MODELS = "):
            registry = root / "runner" / "models" / "registry.py"
            source = registry.read_text()
            assert re.search(r"^MODELS = .*$", source, re.MULTILINE), "the registry lists MODELS"
            registry.write_text(re.sub(r"^MODELS = .*$", first, source, flags=re.MULTILINE))
        else:
            path = root / first.removeprefix("# ").strip()
            assert first.startswith("# ") and path.suffix in (".py", ".yaml"), first
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(body)
    return commands


def in_one_interpreter(root: Path, commands: list[list[str]]) -> list[dict]:
    """The commands run by one new interpreter that imports the copy's runner (tests/helpers/
    in_process.py): the copy's registry, not this process's, knows the toy."""
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(root), str(ROOT)])}
    done = subprocess.run(
        [sys.executable, "-m", "tests.helpers.in_process", str(root), json.dumps(commands)],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


@pytest.mark.slow
def test_a_model_added_as_the_recipe_says_trains_in_every_layout_and_plans(
    tmp_path: Path,
) -> None:
    root = copy_of_the_repository(tmp_path / "repo")
    commands = follow(model_recipe(), root)
    assert len(commands) == 5, commands
    quick = [*QUICK, "trainer.max_steps=12", "trainer.val_batches=0", "plan.json=true"]
    results = in_one_interpreter(root, [[*c.split()[3:], *quick] for c in commands])
    assert len(results) == len(commands), results
    for done in results:
        assert done["returncode"] == 0, f"{done['args']}\n{done['stderr'][-3000:]}"
    runs = all_runs(f"sqlite:///{root / 'mlflow.db'}")
    assert {r.data.tags["model"] for r in runs} == {"toy"}
    (planned,) = [r for r in runs if r.data.tags["mode"] == "plan"]
    assert planned.data.metrics[PLAN_PARAMS.name] == 64 * 32 + 32 + 32 * 10 + 10
    trained = {r.data.tags["parallel"]: r for r in runs if r.data.tags["mode"] == "train"}
    assert set(trained) == LAYOUTS
    uri = f"sqlite:///{root / 'mlflow.db'}"
    single = loss_series(uri, trained["none"].info.run_id)
    assert len(single) == 12
    for layout in LAYOUTS - {"none"}:
        assert loss_series(uri, trained[layout].info.run_id) == pytest.approx(single, rel=1e-5)
