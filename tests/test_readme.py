"""The README held to the code: its configuration table to conf/ and runner/choices.py (every
option of every group and key it lists, and none that is gone), its project tree to the
packages (every path it names exists; every package and top-level folder is named), and its
list of documents to docs/."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from runner import choices

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
TICKED = re.compile(r"`([^`]+)`")
# Written where a user runs mode=calibrate (git-ignored here): an option once it exists.
MADE_BY_THE_RUNNER = {"hardware": {"calibrated"}}
# The keys the table lists with their values, and the runner's list of each.
KEYS = {
    "parallel.shard": choices.SHARDS,
    "trainer.precision": choices.PRECISIONS,
    "trainer.grad_reduce": choices.GRAD_REDUCE,
    "trainer.fp8_recipe": choices.FP8_RECIPES,
    "trainer.recompute": choices.RECOMPUTE,
    "trainer.attention": choices.ATTENTION,
    "dist.backend": choices.BACKENDS,
    "hardware.figures": choices.FIGURES,
}


def section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start : end if end != -1 else None]


def table_rows() -> dict[str, set[str]]:
    """The configuration table: each row's first cell (a blank one continues the row above) and
    the values its second cell names in backticks."""
    rows: dict[str, set[str]] = {}
    last = ""
    for line in section("Configuration").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or set(cells[0]) <= {"-", " "} and cells[0] or cells[0] == "group":
            continue
        name = TICKED.findall(cells[0])
        last = name[0] if name else last
        rows.setdefault(last, set()).update(TICKED.findall(cells[1]))
    return rows


def group_options(group: str) -> set[str]:
    return {p.stem for p in (ROOT / "conf" / group).glob("*.yaml")}


def test_the_configuration_table_names_every_option_of_every_group_and_no_other() -> None:
    rows = table_rows()
    groups = sorted(  # a folder of yaml files is a group: model/, hydra/launcher/, ...
        str(p.parent.relative_to(ROOT / "conf")) for p in (ROOT / "conf").glob("*/**/*.yaml")
    )
    groups = sorted(set(groups))
    assert set(groups) <= set(rows), f"groups missing from the README's table: {groups}"
    for group in groups:
        listed = rows[group]
        options = group_options(group) | MADE_BY_THE_RUNNER.get(group, set())
        assert listed == options, (group, "missing", options - listed, "gone", listed - options)


def test_the_configuration_tables_keys_name_every_choice_and_no_other() -> None:
    rows = table_rows()
    for key, allowed in KEYS.items():
        assert rows[key] == set(allowed), (key, set(allowed) ^ rows[key])


def tree() -> list[Path]:
    """The project tree's paths: each line's names (before the gap that starts its comment),
    nested by indentation under the last folder above them."""
    block = section("Project structure").split("```text\n")[1].split("```")[0]
    paths, parents = [], {}  # indentation -> the folder there
    for line in block.splitlines():
        if not line.strip() or line.startswith(" " * 10):  # a comment's continuation
            continue
        indent = len(line) - len(line.lstrip())
        names = re.split(r"\s{2,}", line.strip())[0].split()
        parent = parents.get(indent - 2, Path()) if indent else Path()
        for name in names:
            path = parent / name.rstrip("/")
            paths.append(path)
            if name.endswith("/"):
                parents[indent] = path
    return paths


def test_every_path_the_project_tree_names_exists() -> None:
    named = tree()
    assert len(named) > 20
    missing = [str(p) for p in named if not (ROOT / p).exists()]
    assert not missing, missing


def top_level_folders() -> set[str]:
    """The folders a checkout holds at its top: git's tracked ones, so that what a user made in
    it (`pip wheel .`'s build/, a run's outputs/) is not taken for the project's; outside a git
    checkout (an unpacked sdist), the folders on disk. Dot-folders (.ci/, .venv/) are not named."""
    listed = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    if listed.returncode == 0 and listed.stdout:
        folders = {line.split("/")[0] for line in listed.stdout.splitlines() if "/" in line}
    else:  # what the runner and a build write, as .gitignore lists them
        made = {"outputs", "multirun", "mlruns", "snapshots", "__pycache__", "build", "dist"}
        folders = {p.name for p in ROOT.iterdir() if p.is_dir() and p.name not in made}
    return {f for f in folders if not f.startswith(".") and not f.endswith(".egg-info")}


def test_the_project_tree_names_every_package_and_top_level_folder() -> None:
    named = {str(p) for path in tree() for p in (path, *path.parents)}
    packages = {
        str(p.parent.relative_to(ROOT)) for p in (ROOT / "runner").glob("*/__init__.py")
    } | {str(p.parent.relative_to(ROOT)) for p in (ROOT / "runner").glob("*/*/__init__.py")}
    folders = top_level_folders()
    assert not (packages - named), sorted(packages - named)
    assert not (folders - named), sorted(folders - named)


def test_the_list_of_documents_names_every_document() -> None:
    listed = set(re.findall(r"\]\(docs/([\w.]+\.md)\)", section("Documentation")))
    assert listed == {p.name for p in (ROOT / "docs").glob("*.md")}
