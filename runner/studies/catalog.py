"""The studies a command can run (experiments/ files; a user's ./experiments first, as Hydra's
search path has them), each with its question read from its file: `python -m runner --help` lists
them through the `runner_studies` resolver in its template (conf/config.yaml)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import yaml

from runner.config_dirs import EXPERIMENTS_DIR

RESOLVER = "runner_studies"
WIDTH, INDENT = 100, "    "


def question(path: Path) -> str:
    """The study's question, or what its file's first comment says where it asks none."""
    text = path.read_text()
    try:
        study = (yaml.safe_load(text) or {}).get("study") or {}
    except yaml.YAMLError:
        study = {}
    if study.get("question"):
        return " ".join(str(study["question"]).split())
    comments = [line.lstrip("# ") for line in text.splitlines() if line.startswith("# ")]
    return next((c for c in comments if not c.startswith("@package")), "")


def studies(here: Path | None = None) -> dict[str, str]:
    """Each study's name and question: the user's own first, then the runner's."""
    found: dict[str, str] = {}
    for folder in (Path(here or Path.cwd()) / "experiments", EXPERIMENTS_DIR):
        for path in sorted(folder.glob("*.yaml")) if folder.is_dir() else []:
            found.setdefault(path.stem, question(path))
    return found


def listed() -> str:
    """One entry a study, its question wrapped under its name, for --help."""
    lines = []
    for name, asked in studies().items():
        lines += textwrap.wrap(
            f"{name}: {asked}", WIDTH, initial_indent=INDENT, subsequent_indent=INDENT * 2
        )
    return "\n".join(lines)
