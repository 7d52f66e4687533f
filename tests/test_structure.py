"""The shape a newcomer relies on: models are named only in their folders and the registry,
packages import in one direction (plugins -> runner; planner -> layouts -> models), and no module
of runner/ reaches itself again through its imports, those inside functions included."""

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
    assert reaches("runner", ("plugins", "hydra_plugins")) == {}
    later = ("runner.layouts", "runner.planner", "runner.training", "runner.modes")
    assert reaches("runner/models", later) == {}
    assert reaches("runner/layouts", ("runner.planner", "runner.training", "runner.modes")) == {}
    assert reaches("runner/planner", ("runner.training", "runner.modes")) == {}
    # The MLflow record and the studies sit above the work they record: nothing below them
    # (models, layouts, the planner, one rank's training) writes to the store itself.
    record = ("runner.tracking", "runner.studies")
    for below in ("runner/models", "runner/layouts", "runner/planner", "runner/network"):
        assert reaches(below, (*record, "runner.modes")) == {}, below
    assert reaches("runner/studies", ("runner.launcher", "runner.training", "runner.layouts",
                                      "runner.planner", "runner.modes")) == {}  # fmt: skip
    assert reaches("runner/tracking", ("runner.training", "runner.modes", "runner.planner")) == {}
    assert reaches("runner/launcher", ("runner.modes", "runner.studies")) == {}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the modules of the package it imports, at the top or inside a function. `from
    a.b import c` imports the module a.b.c where there is one, else the names a.b defines: a
    package's `__init__` counts only for what it defines itself, not for its submodules."""
    root = package.parent
    paths = {module_name(p, root): p for p in sorted(package.rglob("*.py"))}

    def known(name: str) -> str | None:
        while name and name not in paths:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package_of = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {known(alias.name) for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's package, up level - 1
                    up = package_of.rsplit(".", node.level - 1)[0]
                    base = f"{up}.{base}".rstrip(".")
                for alias in node.names:
                    whole = f"{base}.{alias.name}"
                    found.add(whole if whole in paths else known(base))
        graph[name] = {m for m in found if m is not None and m != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected group of modules (Tarjan's), as a path that
    starts and ends at the same module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [path_around(graph, group) for group in groups]


def path_around(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """The shortest way from the group's first module back to itself, within the group."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & group):
                if w == start:
                    return [*paths[v], start]
                if w not in paths:
                    paths[w] = [*paths[v], w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no way around {group}")


def test_no_module_of_the_runner_imports_itself_through_others() -> None:
    found = cycles(import_graph(ROOT / "runner"))
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_the_cycle_check_finds_a_cycle_through_an_import_inside_a_function(
    tmp_path: Path,
) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("from pkg.sub.b import B\n")  # a re-export: no cycle
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from pkg.sub import b\n    return b\n")
    (package / "sub" / "b.py").write_text("from ..a import f\nB = f\n")
    (package / "c.py").write_text("import pkg.a\n")
    assert cycles(import_graph(package)) == [["pkg.a", "pkg.sub.b", "pkg.a"]]
