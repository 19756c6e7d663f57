"""Checked exercises for the tutorials: say right or wrong, and why.

An exercise in a notebook is two cells. The reader completes the first (a number, a choice,
a placement, a formula written as a Python function); the second calls one of the checks
below with the reader's answer and what the workbench itself computes (a simulation, a
transformed program), never a copied number:

>>> check_number(6.0, 6.0, right="the ring moves 2(n-1)/n of the tensor.")
Right: 6 — the ring moves 2(n-1)/n of the tensor.

A right answer returns a :class:`Verdict`, which a notebook shows as a green line. A wrong or
missing one raises :class:`WrongAnswerError` (a :class:`~ir.errors.DistIRError`): the message says
what was expected and why, IPython shows only that message, not a traceback, and a notebook
run in CI, where the cells hold the reference answers, fails if a check does.

>>> check_number(3.0, 6.0, mistakes={3.0: "half the ring."})
Traceback (most recent call last):
...
workbench.exercises.WrongAnswerError: Not quite: you said 3, expected 6. Half the ring.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ir.errors import DistIRError
from ir.function import Function

__all__ = [
    "SOLUTION_KEY",
    "NotAnsweredError",
    "Verdict",
    "WrongAnswerError",
    "blank_answer",
    "check_choice",
    "check_formula",
    "check_number",
    "check_program",
]


@dataclass(frozen=True)
class Verdict:
    """The outcome of a check: ``correct`` and the sentence that says why."""

    correct: bool
    message: str

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return self.message

    def _repr_html_(self) -> str:
        colour, mark = ("#1a7f37", "✓") if self.correct else ("#b42318", "✗")
        return (
            f'<div class="exercise-verdict" style="border-left: 4px solid {colour}; '
            f'padding: 4px 8px; color: {colour}"><b>{mark}</b> {html.escape(self.message)}</div>'
        )


class WrongAnswerError(DistIRError):
    """A checked exercise's answer is wrong; ``verdict`` holds the explanation."""

    def __init__(self, verdict: Verdict) -> None:
        self.verdict = verdict
        super().__init__(verdict.message)

    def _render_traceback_(self) -> list[str]:
        # IPython shows these lines instead of a traceback: the reader needs the reason only.
        return [f"✗ {self.verdict.message}"]


class NotAnsweredError(WrongAnswerError):
    """The answer cell still holds ``None``."""


_NOT_YET = "Not yet: replace None in the cell above with your answer, run it, then run this cell."
_NOT_YET_FORMULA = (
    "Not yet: write your formula in the function above (instead of return None), run it, "
    "then run this cell."
)


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def _show(x: object) -> str:
    """A choice as the reader wrote it: strings quoted, objects by their printed form (S(0))."""
    return repr(x) if isinstance(x, str) else str(x)


def _sentence(text: str) -> str:
    # Capitalise a word ("that is ..."), not code or a label ("hp=8 peaks ...").
    text = text.strip()
    if not text or not text.split()[0].rstrip(":,;.").isalpha():
        return text
    return text[:1].upper() + text[1:]


def _fail(message: str, hint: str = "") -> WrongAnswerError:
    tail = _sentence(hint)
    return WrongAnswerError(Verdict(False, f"{message} {tail}".rstrip()))


def _close(a: float, b: float, rel_tol: float) -> bool:
    return math.isclose(a, b, rel_tol=rel_tol)


def _as_number(answer: object, what: str) -> float:
    if isinstance(answer, (bool, np.bool_)) or not isinstance(answer, (int, float, np.number)):
        raise _fail(f"Not quite: {what} should be a number, not {answer!r}.")
    value = float(answer)
    if not math.isfinite(value):
        raise _fail(f"Not quite: {what} is {value}, not a finite number.")
    return value


def check_number(
    answer: object,
    expected: float,
    *,
    rel_tol: float = 0.01,
    unit: str = "",
    right: str = "",
    hint: str = "",
    mistakes: Mapping[float, str] | None = None,
) -> Verdict:
    """Check a numeric ``answer`` against ``expected`` to a relative tolerance.

    ``mistakes`` maps the values that common wrong reasonings give to what went wrong; an
    answer within ``rel_tol`` of one gets that explanation, any other wrong answer ``hint``.
    Raises :class:`NotAnsweredError` for ``None``, :class:`WrongAnswerError` when wrong.
    """
    if answer is None:
        raise NotAnsweredError(Verdict(False, _NOT_YET))
    expected = _as_number(expected, "the expected value")
    value = _as_number(answer, "your answer")
    suffix = f" {unit}" if unit else ""
    if _close(value, expected, rel_tol):
        return Verdict(True, f"Right: {_fmt(value)}{suffix}" + (f" — {right}" if right else "."))
    said = f"Not quite: you said {_fmt(value)}{suffix}, expected {_fmt(expected)}{suffix}."
    for wrong_value, why in (mistakes or {}).items():
        if _close(value, float(wrong_value), rel_tol):
            raise _fail(said, why)
    raise _fail(said, hint)


def check_choice(
    answer: object,
    expected: Hashable,
    *,
    options: Sequence[Hashable] | None = None,
    right: str = "",
    hint: str = "",
    mistakes: Mapping[Hashable, str] | None = None,
) -> Verdict:
    """Check that ``answer`` is the ``expected`` one among ``options`` (compared with ``==``).

    ``options``, when given, lists the valid answers: anything else is refused with the list.
    ``mistakes`` maps a wrong option to why it is wrong; other wrong options get ``hint``.
    """
    if answer is None:
        raise NotAnsweredError(Verdict(False, _NOT_YET))
    if options is not None and answer not in options:
        listed = ", ".join(_show(o) for o in options)
        raise _fail(f"Not quite: {_show(answer)} is not one of the options ({listed}).")
    if answer == expected:
        return Verdict(True, f"Right: {_show(answer)}" + (f" — {right}" if right else "."))
    said = f"Not quite: you chose {_show(answer)}, the answer is {_show(expected)}."
    reasons = dict(mistakes or {})
    raise _fail(said, reasons.get(answer, hint) if _hashable(answer) else hint)


def _hashable(x: object) -> bool:
    try:
        hash(x)
    except TypeError:
        return False
    return True


def check_formula(
    formula: Callable[..., Any] | None,
    cases: Sequence[tuple[Mapping[str, Any], float]],
    *,
    rel_tol: float = 0.01,
    right: str = "",
    hint: str = "",
    mistakes: Mapping[str, Callable[..., Any]] | None = None,
) -> Verdict:
    """Check a formula the reader wrote as a Python function against measured ``cases``.

    Each case is ``(keyword arguments, measured value)``: the measured values come from the
    workbench (a simulation, a program), so the formula is compared with what it predicts.
    ``mistakes`` maps an explanation to a wrong formula: if the reader's formula agrees with
    one on every case, that explanation is given. The first case off by more than
    ``rel_tol`` is named, with its arguments.
    """
    if formula is None:
        raise NotAnsweredError(Verdict(False, _NOT_YET))
    if not callable(formula):
        raise _fail(f"Not quite: your answer should be a function, not {formula!r}.")
    if not cases:
        raise ValueError("check_formula needs at least one (arguments, measured value) case")
    got: list[float] = []
    for kwargs, _ in cases:
        args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        try:
            value = formula(**kwargs)
        except Exception as exc:  # the reader's code: any failure is their answer's fault
            raise _fail(
                f"Not quite: your formula({args}) raised {type(exc).__name__}: {exc}."
            ) from exc
        if value is None:  # the blank's "return None" still there
            raise NotAnsweredError(Verdict(False, _NOT_YET_FORMULA))
        got.append(_as_number(value, f"your formula({args})"))
    misses = [i for i, (g, (_, want)) in enumerate(zip(got, cases)) if not _close(g, want, rel_tol)]
    if not misses:
        return Verdict(True, f"Right on all {len(cases)} cases" + (f" — {right}" if right else "."))
    kwargs, want = cases[misses[0]]
    args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    said = (
        f"Not quite: {len(misses)} of {len(cases)} cases are off; for {args} your formula "
        f"gives {_fmt(got[misses[0]])}, the workbench measures {_fmt(want)}."
    )
    for why, wrong in (mistakes or {}).items():
        try:
            theirs = [float(wrong(**kw)) for kw, _ in cases]
        except Exception:  # a mistake formula that fails matches nothing
            continue
        if all(_close(g, t, rel_tol) for g, t in zip(got, theirs)):
            raise _fail(said, why)
    raise _fail(said, hint)


def check_program(
    program: Function | None,
    expected: Function,
    *,
    right: str = "",
    hint: str = "",
    mistakes: Mapping[str, Function] | None = None,
) -> Verdict:
    """Check that the reader's ``program`` (what their clicks or annotations built) is
    equivalent to ``expected`` (``Function.is_equivalent``: the same ops on the same devices).

    Many answers can build one program (an annotation here or one that propagates from
    there), so the program is compared, not the clicks. ``mistakes`` maps an explanation to a
    program that a common wrong answer builds; a program equivalent to one gets it.
    """
    if program is None:
        raise NotAnsweredError(Verdict(False, _NOT_YET))
    if not isinstance(program, Function):
        raise _fail(f"Not quite: your answer should be a program (a Function), not {program!r}.")
    if program.is_equivalent(expected):
        return Verdict(True, "Right: the program you built" + (f" — {right}" if right else "."))
    said = "Not quite: the program you built is not the expected one."
    for why, wrong in (mistakes or {}).items():
        if program.is_equivalent(wrong):
            raise _fail(said, why)
    raise _fail(said, hint)


SOLUTION_KEY = "solution"
"""The answer cell's metadata key that holds its reference solution: hidden from the
reader (JupyterLab does not show cell metadata, the course pages do not print it), run in
CI in place of the blank (``notebooks/conftest.py``, ``scripts/build_course.py``)."""


def blank_answer(solution: str, check: str = "") -> str:
    """The answer cell a reader starts from, made from its reference ``solution``: the
    lines before the ``# your answer`` comment and the comment itself kept, each answer
    (a name starting with ``answer``) set to ``None``, each function kept as its signature
    returning ``None``, and other names the ``check`` cell reads kept as given; the rest of
    the solution (how the answer was worked out) left out.

    >>> print(blank_answer("# your answer: 1, 2 or 4\\nanswer_v = 4"))
    # your answer: 1, 2 or 4
    answer_v = None
    >>> print(blank_answer("# your formula\\ndef t(n, s):\\n    return 2 * (n - 1) / n * s"))
    # your formula
    def t(n, s):
        return None  # your formula, in place of None
    """
    import ast

    lines = solution.splitlines()
    tree = ast.parse(solution)
    read = {n.id for n in ast.walk(ast.parse(check or "")) if isinstance(n, ast.Name)}
    comment = next(
        (i for i, line in enumerate(lines) if line.lstrip().startswith("# your answer")), None
    )
    if comment is None:
        comment = next((i for i, line in enumerate(lines) if line.lstrip().startswith("#")), -1)
    out = lines[: comment + 1]
    for node in tree.body:
        if node.lineno - 1 <= comment:
            continue  # context given before the question
        if isinstance(node, ast.FunctionDef):
            signature = lines[node.lineno - 1]
            out += [signature, "    return None  # your formula, in place of None"]
            continue
        names = [
            t.id
            for target in getattr(node, "targets", [getattr(node, "target", None)])
            if target is not None
            for t in ast.walk(target)
            if isinstance(t, ast.Name)
        ]
        answers = [n for n in names if n.startswith("answer")]
        if answers:
            out += [f"{n} = None" for n in answers]
        elif names and set(names) & read:
            out += lines[node.lineno - 1 : node.end_lineno]  # a given the check reads
    return "\n".join(out)
