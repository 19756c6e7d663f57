"""The tutorials are committed as sources: no outputs, no execution counts, no widget state."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("*.ipynb"))


def test_the_tutorials_and_the_workbench_notebook_exist():
    names = [p.name for p in NOTEBOOKS]
    assert names[0] == "00_workbench.ipynb" and len(names) == 15


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_committed_clean(path: Path):
    nb = json.loads(path.read_text())
    assert "widgets" not in nb["metadata"], "widget state is stored"
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":
            assert cell["outputs"] == [], f"cell {i} has outputs"
            assert cell["execution_count"] is None, f"cell {i} has an execution count"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_the_text_names_colours_as_the_views_draw_them(path: Path):
    """Communication is near-black in every view (widgets.palette): red is device 3's."""
    import re

    nb = json.loads(path.read_text())
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        text = "".join(cell["source"]).lower()
        said = re.findall(r"[^.]*\b(?:red|blue|green|orange)\b[^.]*", text)
        wrong = [s for s in said if re.search(r"communicat|all-reduce|allreduce|send", s)]
        assert not wrong, f"cell {i} gives communication a device's colour: {wrong}"
