"""nbval runs each notebook in a fresh kernel started from this folder: let it import the
project from the checkout even when it is not pip-installed, and run each exercise's hidden
solution in place of the blank answer the reader sees (the check cell after it then has
an answer to check: a wrong solution fails CI)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = str(Path(__file__).resolve().parents[1])
_paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
if ROOT not in _paths:
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, *_paths) if p)

SOLUTION_KEY = "solution"  # workbench.exercises.SOLUTION_KEY (imported lazily there)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """nbval's cell items run ``item.cell.source``: an answer cell runs its solution."""
    for item in items:
        cell = getattr(item, "cell", None)
        metadata = getattr(cell, "metadata", None) or {}
        if "exercise-answer" in metadata.get("tags", []) and SOLUTION_KEY in metadata:
            cell.source = metadata[SOLUTION_KEY]
