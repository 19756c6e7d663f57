"""The tutorials' exercises follow one pattern: an answer cell the reader completes (tagged
``exercise-answer``, committed with a reference answer so that CI checks it), then a check cell
(tagged ``exercise-check``) whose last statement is a ``workbench.exercises`` check, so that the
cell shows the verdict and a wrong answer fails the notebook's run."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from workbench import exercises

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
WITH_EXERCISES = sorted(
    p for p in NOTEBOOKS.glob("*.ipynb") if "exercise-answer" in p.read_text(encoding="utf-8")
)
CHECKS = {name for name in exercises.__all__ if name.startswith("check_")}


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _tags(cell: dict) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def _source(cell: dict) -> str:
    return "".join(cell["source"])


def test_tutorials_2_to_7_end_with_two_to_four_exercises():
    for number in range(2, 8):
        (path,) = NOTEBOOKS.glob(f"{number:02d}_*.ipynb")
        answers = [c for c in _cells(path) if "exercise-answer" in _tags(c)]
        assert 2 <= len(answers) <= 4, f"{path.name}: {len(answers)} exercises"
    assert {p.name[:2] for p in WITH_EXERCISES} >= {"02", "03", "04", "05", "06", "07", "08"}


@pytest.mark.parametrize("path", WITH_EXERCISES, ids=lambda p: p.name)
def test_each_answer_is_filled_in_and_followed_by_its_check(path: Path):
    cells = _cells(path)
    source = "\n".join(_source(c) for c in cells if c["cell_type"] == "code")
    assert "from workbench.exercises import" in source, path.name
    for i, cell in enumerate(cells):
        if "exercise-answer" not in _tags(cell):
            assert "exercise-check" not in _tags(cell) or "exercise-answer" in _tags(cells[i - 1])
            continue
        tree = ast.parse(_source(cell))
        assigned = [
            node
            for node in ast.walk(tree)
            if isinstance(node, ast.Assign | ast.FunctionDef | ast.AnnAssign)
        ]
        assert assigned, f"{path.name} cell {i}: the answer cell defines nothing"
        for node in assigned:
            value = getattr(node, "value", ...)
            assert not (isinstance(value, ast.Constant) and value.value is None), (
                f"{path.name} cell {i}: CI must run the reference answer, not None"
            )
        check = cells[i + 1]
        assert "exercise-check" in _tags(check), f"{path.name} cell {i + 1} is not its check"
        last = ast.parse(_source(check)).body[-1]
        assert isinstance(last, ast.Expr) and isinstance(last.value, ast.Call), (
            f"{path.name} cell {i + 1}: the check must be the cell's last expression"
        )
        assert getattr(last.value.func, "id", None) in CHECKS, f"{path.name} cell {i + 1}"


def test_notebook_5s_checks_refuse_wrong_answers_and_accept_the_reference(monkeypatch):
    """Run notebook 5's code in this process, then its checks after wrong answers."""
    monkeypatch.chdir(NOTEBOOKS)
    cells = [c for c in _cells(NOTEBOOKS / "05_composing_dhp.ipynb") if c["cell_type"] == "code"]
    namespace: dict = {}
    for cell in cells:  # the reference answers pass their checks
        exec(compile(_source(cell), "notebook 5", "exec"), namespace)
    checks = [c for c in cells if "exercise-check" in _tags(c)]
    wrong = [  # (exercise, wrong answer, what the check must say)
        (0, "def rank(s, i, j, dp, tp):\n    return s * dp * tp + j * dp + i", "replicas next"),
        (1, "answer_partner = 0", "tensor-parallel peer"),
        (1, "answer_partner = 6", "other replica"),
        (1, "answer_partner = None", "Not yet"),
    ]
    for exercise, answer, says in wrong:
        exec(compile(answer, "answer", "exec"), namespace)
        with pytest.raises(exercises.WrongAnswerError, match=says):
            exec(compile(_source(checks[exercise]), "check", "exec"), namespace)
