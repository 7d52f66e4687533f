"""docs/extending.md's recipe for a model, followed to the letter: its blocks written into a copy
of the repository, the toy trained with every layout and planned, each layout's losses equal to
the single process's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import QUICK, all_runs, copy_of_the_repository, loss_series, run_cli

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


@pytest.mark.slow
def test_a_model_added_as_the_recipe_says_trains_in_every_layout_and_plans(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = copy_of_the_repository(tmp_path / "repo")
    commands = follow(model_recipe(), root)
    assert len(commands) == 5, commands
    monkeypatch.setenv("PYTHONPATH", str(root))  # the copy's runner, not the installed one
    quick = [*QUICK, "trainer.max_steps=12", "trainer.val_batches=0"]
    for command in commands:
        args = command.split()[3:]
        done = run_cli(*args, *quick, "plan.json=true", cwd=root, timeout=180)
        assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"
    runs = all_runs(f"sqlite:///{root / 'mlflow.db'}")
    assert {r.data.tags["model"] for r in runs} == {"toy"}
    (planned,) = [r for r in runs if r.data.tags["mode"] == "plan"]
    assert planned.data.metrics["params_total"] == 64 * 32 + 32 + 32 * 10 + 10
    trained = {r.data.tags["parallel"]: r for r in runs if r.data.tags["mode"] == "train"}
    assert set(trained) == LAYOUTS
    uri = f"sqlite:///{root / 'mlflow.db'}"
    single = loss_series(uri, trained["none"].info.run_id)
    assert len(single) == 12
    for layout in LAYOUTS - {"none"}:
        assert loss_series(uri, trained[layout].info.run_id) == pytest.approx(single, rel=1e-5)
