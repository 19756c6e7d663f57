"""The tutorials' exercises follow one pattern: an answer cell the reader completes (tagged
``exercise-answer``, committed blank, its reference solution hidden in the cell's metadata and
run by CI in its place), then a check cell (tagged ``exercise-check``) whose last statement is
a ``workbench.exercises`` check, so that the cell shows the verdict and a wrong solution fails
the notebook's run."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import ir
from workbench import exercises

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
WITH_EXERCISES = sorted(
    p for p in NOTEBOOKS.glob("*.ipynb") if "exercise-answer" in p.read_text(encoding="utf-8")
)
TUTORIALS = sorted(p for p in NOTEBOOKS.glob("*.ipynb") if not p.name.startswith("00_"))
CHECKS = {name for name in exercises.__all__ if name.startswith("check_")}


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _tags(cell: dict) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def _source(cell: dict) -> str:
    """A cell's code as CI runs it: an answer cell's hidden solution."""
    solution = cell.get("metadata", {}).get(exercises.SOLUTION_KEY)
    if solution is not None and "exercise-answer" in _tags(cell):
        return solution
    return "".join(cell["source"])


def _blank(cell: dict) -> str:
    return "".join(cell["source"])


def _markdown_index(cells: list[dict], heading: str) -> int:
    found = [
        i
        for i, c in enumerate(cells)
        if c["cell_type"] == "markdown" and f"\n{heading}\n" in f"\n{_source(c)}\n"
    ]
    assert found, f"no {heading!r} heading"
    return found[0]


def test_every_tutorial_has_exercises():
    assert [p.name[:2] for p in TUTORIALS] == [f"{n:02d}" for n in range(1, 15)]
    assert set(TUTORIALS) <= set(WITH_EXERCISES)


@pytest.mark.parametrize("path", TUTORIALS, ids=lambda p: p.name)
def test_tutorial_has_goals_a_summary_and_two_to_four_exercises(path: Path):
    cells = _cells(path)
    assert "**After this notebook you can**" in _source(cells[0]), path.name
    _markdown_index(cells, "## Summary")
    heading = _markdown_index(cells, "## Exercises")
    answers = [i for i, c in enumerate(cells) if "exercise-answer" in _tags(c)]
    assert 2 <= len(answers) <= 4, f"{path.name}: {len(answers)} exercises"
    assert heading < answers[0], f"{path.name}: an exercise before the Exercises heading"


@pytest.mark.parametrize("path", WITH_EXERCISES, ids=lambda p: p.name)
def test_each_answer_is_blank_its_solution_hidden_and_followed_by_its_check(path: Path):
    cells = _cells(path)
    source = "\n".join(_source(c) for c in cells if c["cell_type"] == "code")
    assert "from workbench.exercises import" in source, path.name
    for i, cell in enumerate(cells):
        if "exercise-answer" not in _tags(cell):
            assert "exercise-check" not in _tags(cell) or "exercise-answer" in _tags(cells[i - 1])
            continue
        solution = cell["metadata"].get(exercises.SOLUTION_KEY)
        assert solution, f"{path.name} cell {i}: no hidden solution for CI to run"
        tree = ast.parse(solution)
        assigned = [
            node
            for node in ast.walk(tree)
            if isinstance(node, ast.Assign | ast.FunctionDef | ast.AnnAssign)
        ]
        assert assigned, f"{path.name} cell {i}: the solution defines nothing"
        # the reader's cell: the solution blanked, nothing of how it was worked out
        blank = _blank(cell)
        assert blank == exercises.blank_answer(solution, _source(cells[i + 1]))
        assert blank != solution, f"{path.name} cell {i}: the answer is shown"
        check = cells[i + 1]
        assert "exercise-check" in _tags(check), f"{path.name} cell {i + 1} is not its check"
        last = ast.parse(_source(check)).body[-1]
        assert isinstance(last, ast.Expr) and isinstance(last.value, ast.Call), (
            f"{path.name} cell {i + 1}: the check must be the cell's last expression"
        )
        assert getattr(last.value.func, "id", None) in CHECKS, f"{path.name} cell {i + 1}"


def test_a_blank_answer_is_told_to_answer_not_marked_wrong(monkeypatch):
    """Notebook 2's blanks as a reader first runs them: each check says "Not yet"."""
    monkeypatch.chdir(NOTEBOOKS)
    cells = [c for c in _cells(NOTEBOOKS / "02_data_parallel.ipynb") if c["cell_type"] == "code"]
    namespace: dict = {}
    for cell in cells:
        if "exercise-answer" in _tags(cell):
            exec(compile(_blank(cell), "blank", "exec"), namespace)
        elif "exercise-check" in _tags(cell):
            with pytest.raises(exercises.NotAnsweredError, match="Not yet"):
                exec(compile(_source(cell), "check", "exec"), namespace)
        else:
            exec(compile(_source(cell), "notebook 2", "exec"), namespace)


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


def _refuses(namespace: dict, check: dict, answer: str, says: str) -> None:
    exec(compile(answer, "answer", "exec"), namespace)
    with pytest.raises(exercises.WrongAnswerError, match=says):
        exec(compile(_source(check), "check", "exec"), namespace)


def test_notebook_1s_checks_refuse_wrong_answers_and_accept_the_reference(monkeypatch):
    monkeypatch.chdir(NOTEBOOKS)
    cells = [c for c in _cells(NOTEBOOKS / "01_ir.ipynb") if c["cell_type"] == "code"]
    namespace: dict = {}
    for cell in cells:  # the reference answers pass their checks
        exec(compile(_source(cell), "notebook 1", "exec"), namespace)
    checks = [c for c in cells if "exercise-check" in _tags(c)]
    residual = """answer_program = ir.parse('''
def residual(x: Tensor[(B, F), 0], w: Tensor[(F, F), 0]):
    h: Tensor[(B, F), 0] = MatMul(x, w)
    {rest}
    return y
''', sizes={{"B": 8, "F": 4}})"""
    wrong = [  # (exercise, wrong answer, what the check must say)
        (0, "answer_shape = (4, 6)", "the other order"),
        (0, "answer_shape = [6, 4]", "the answer is \\(6, 4\\)"),
        (0, "answer_shape = None", "Not yet"),
        (1, "answer_peak_bytes = 4 * (F * H + H * C + B * F)", "the inputs alone"),
        (1, "answer_peak_bytes = F * H + H * C + B * F + B * H + B * C", "counts elements"),
        (1, "answer_peak_bytes = 4 * (F * H + H * C + B * F + B * H)", "output y is live too"),
        (2, residual.format(rest="y: Tensor[(B, F), 0] = Add(x, h)"), "Relu is missing"),
        (
            2,
            residual.format(
                rest="s: Tensor[(B, F), 0] = Add(x, h)\n    y: Tensor[(B, F), 0] = Relu(s)"
            ),
            "Relu comes before the Add",
        ),
    ]
    for exercise, answer, says in wrong:
        _refuses(namespace, checks[exercise], answer, says)


def test_notebook_9s_megatron_check_refuses_the_transposed_placements(monkeypatch):
    """Exercise 1 of notebook 9 on its own (the Llama above it is not needed): each wrong
    placement builds a program of its own, explained, and the reference one is accepted."""
    monkeypatch.chdir(NOTEBOOKS)
    cells = _cells(NOTEBOOKS / "09_your_model.ipynb")
    start = next(i for i, c in enumerate(cells) if "exercise-answer" in _tags(c))
    setup = "import numpy as np\nimport torch\nimport ir\nfrom ir.sharding import Mesh, S\n"
    setup += "from workbench import Workbench\nmesh = Mesh((2,))\n"
    namespace: dict = {}
    exec(compile(setup, "setup", "exec"), namespace)
    for cell in cells[start - 3 : start + 2]:  # the imports, the torch MLP, answer and check
        if cell["cell_type"] == "code":
            exec(compile(_source(cell), "notebook 9", "exec"), namespace)
    check = cells[start + 1]
    wrong = [
        ('answer_placements = {"_0_weight": S(1), "_2_weight": S(0)}', "notebook 6's placements"),
        ('answer_placements = {"_0_weight": S(0), "_2_weight": S(0)}', "all-gathered"),
        ('answer_placements = {"_0_weight": S(1), "_2_weight": S(1)}', "before the ReLU"),
        ("answer_placements = {}", "stays on one GPU"),
        ("answer_placements = None", "Not yet"),
    ]
    for answer, says in wrong:
        _refuses(namespace, check, answer, says)


def test_notebook_10s_checks_follow_the_calibration_and_the_measurement(monkeypatch):
    """Notebook 10's checks on a calibration and a measurement made up here (no processes):
    the all-reduce formula is checked against this topology's simulation, and the op type
    the simulator misses most is read from the measured totals, whatever they are."""
    from ir import models, transforms
    from ir.calibration import AlphaBeta, Calibration

    monkeypatch.chdir(NOTEBOOKS)
    flops, nbytes = "flops", "bytes"
    fits = {
        "matmul/torch/float32": AlphaBeta(2e-6, 1e11, flops),
        "vector/numpy/float32": AlphaBeta(5e-7, 1e10, flops),
        "copy/numpy/uint8": AlphaBeta(1e-6, 2e10, nbytes),
        "send/gloo/float32": AlphaBeta(1.3e-4, 3.5e9, nbytes),
        "allreduce/gloo/float32": AlphaBeta(3.8e-4, 1.3e9, nbytes),
    }
    calibration = Calibration((), fits, (), 16e9)
    source = transforms.training(models.mlp(128, 128, 512, 32, layers=4), "sgd")
    simulated = ir.simulate(transforms.megatron(source, dp=2), calibration.topology(2))
    totals = {"MatMul": [2.0, 1.5], "AllReduce": [20.0, 3.0], "Loss": [0.3, 0.003]}
    cells = _cells(NOTEBOOKS / "10_measured_vs_simulated.ipynb")
    start = next(i for i, c in enumerate(cells) if "exercise-answer" in _tags(c))
    namespace: dict = {"ir": ir, "calibration": calibration, "simulated": simulated}
    namespace["totals"] = totals
    for cell in cells[start - 2 :]:  # the import, then each answer and its check
        if cell["cell_type"] == "code":
            exec(compile(_source(cell), "notebook 10", "exec"), namespace)
    formula, op_type = [c for c in cells if "exercise-check" in _tags(c)]
    one_send = "def allreduce_s(size_bytes, alpha_s, rate_per_s):\n"
    _refuses(
        namespace, formula, one_send + "    return alpha_s + size_bytes / rate_per_s", "one send"
    )
    _refuses(namespace, op_type, 'answer_op_type = "MatMul"', "estimated best")
    totals["MatMul"] = [20.0, 0.01]  # a measurement where the matmuls are missed most
    _refuses(namespace, op_type, 'answer_op_type = "Loss"', "the answer is 'MatMul'")


def test_notebook_14s_checks_refuse_wrong_answers_and_accept_the_reference(monkeypatch):
    monkeypatch.chdir(NOTEBOOKS)
    path = NOTEBOOKS / "14_experts_and_context.ipynb"
    cells = [c for c in _cells(path) if c["cell_type"] == "code"]
    namespace: dict = {}
    for cell in cells:  # the reference answers pass their checks
        exec(compile(_source(cell), "notebook 14", "exec"), namespace)
    checks = [c for c in cells if "exercise-check" in _tags(c)]
    wrong = [  # (exercise, wrong answer, what the check must say)
        (0, "answer_bytes = 4 * 1024 * 2 * 1024 * 2", "stays on the rank"),
        (0, "answer_bytes = 1024 * 2 * 1024 * 2 * 0.75", "four"),
        (1, "answer_steps = 4", "own block"),
        (2, "answer_state = 16 / 8", "2 per parameter"),
        (2, "answer_state = None", "Not yet"),
    ]
    for exercise, answer, says in wrong:
        _refuses(namespace, checks[exercise], answer, says)
