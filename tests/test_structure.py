"""The shape a newcomer relies on: models are named only in their folders and the registry, and
packages import in one direction (plugins -> runner; planner -> layouts -> models)."""

from __future__ import annotations

import ast
from pathlib import Path

from runner.models.registry import SPECS

ROOT = Path(__file__).resolve().parents[1]
MODELS_DIR = ROOT / "runner" / "models"


def modules(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def docstrings(tree: ast.AST) -> set[int]:
    """ids of the string nodes that are docstrings: prose may speak of a model."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def model_names_in(path: Path) -> list[str]:
    """Every model class, model `_target_` or model folder the code of `path` names."""
    classes = {spec.target.rsplit(".", 1)[1] for spec in SPECS.values()}
    folders = {f"runner.models.{name}" for name in SPECS}
    tree = ast.parse(path.read_text())
    prose = docstrings(tree)
    named = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name | ast.alias | ast.Attribute):
            name = getattr(node, "id", None) or getattr(node, "attr", None) or node.name
            folder = any(name == f or name.startswith(f"{f}.") for f in folders)
            named += [name] if folder or name.rsplit(".", 1)[-1] in classes else []
        if isinstance(node, ast.ImportFrom) and node.module:
            named += [node.module for f in folders if node.module.startswith(f"{f}.")]
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
            named += [f for f in folders if f in node.value]
    return named


def test_no_module_outside_the_models_folder_names_a_model() -> None:
    outside = [p for p in modules("runner", "plugins", "benchmarks") if MODELS_DIR not in p.parents]
    found = {str(p.relative_to(ROOT)): names for p in outside if (names := model_names_in(p))}
    assert found == {}


def test_the_check_finds_a_model_named_outside_its_folder(tmp_path: Path) -> None:
    for code in (
        "from runner.models.decoder.model import Decoder\n",
        "import runner.models.ffnn.spec\n",
        "TARGET = 'runner.models.neuron.model.Neuron'\n",
        "def f(model):\n    return isinstance(model, FFNN)\n",
    ):
        (tmp_path / "m.py").write_text(code)
        assert model_names_in(tmp_path / "m.py"), code


def imported(path: Path) -> set[str]:
    """Every module `path` imports, at the top or inside a function."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
    return out


def reaches(folder: str, forbidden: tuple[str, ...]) -> dict[str, set[str]]:
    found = {}
    for path in modules(folder):
        bad = {m for m in imported(path) if m.startswith(forbidden)}
        if bad:
            found[str(path.relative_to(ROOT))] = bad
    return found


def test_packages_import_in_one_direction() -> None:
    assert reaches("runner", ("plugins",)) == {}
    later = ("runner.layouts", "runner.planner", "runner.training", "runner.modes")
    assert reaches("runner/models", later) == {}
    assert reaches("runner/layouts", ("runner.planner", "runner.training", "runner.modes")) == {}
    assert reaches("runner/planner", ("runner.training", "runner.modes")) == {}
