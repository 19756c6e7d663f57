"""The tutorials' exercise checks (workbench.exercises) say wrong to wrong answers, and why."""

from __future__ import annotations

import numpy as np
import pytest

import ir
from ir.errors import DistIRError
from workbench.exercises import (
    NotAnsweredError,
    Verdict,
    WrongAnswerError,
    check_choice,
    check_formula,
    check_number,
)


def ring_s(n, size_bytes, bandwidth, latency):
    return 2 * (n - 1) / n * size_bytes / bandwidth + 2 * (n - 1) * latency


def simulated_allreduce_cases():
    """(arguments, simulated all-reduce seconds) over a few device counts and sizes."""
    topology = ir.Topology.preset("a100-hgx", 8, ideal=True)  # the course's alpha-beta ring
    cases = []
    for n in (2, 4, 8):
        for rows in (16, 1024):
            b = ir.FunctionBuilder("ar")
            xs = [b.input(f"x{d}", ir.TensorType((rows, 256), device=d)) for d in range(n)]
            b.call("AllReduce", b.call("MakeTuple", *xs))
            f = b.finish([])
            r = ir.simulate(f, topology)
            dur = sum(e.dur_s for e in r.events_on(0, "communication"))
            kwargs = dict(
                n=n,
                size_bytes=rows * 256 * 4,
                bandwidth=topology.bandwidth(0, 1),
                latency=topology.latency(0, 1),
            )
            cases.append((kwargs, dur))
    return cases


def test_a_right_number_returns_a_verdict_that_renders_as_right():
    v = check_number(8.0000001, 8, unit="GPUs", right="one per GPU.")
    assert v == Verdict(True, "Right: 8 GPUs — one per GPU.")
    assert "✓" in v._repr_html_() and "one per GPU." in v._repr_html_()


def test_a_wrong_number_raises_with_expected_value_and_hint():
    with pytest.raises(
        WrongAnswerError, match=r"you said 4, expected 8\. Count the stages"
    ) as info:
        check_number(4, 8, hint="count the stages.")
    assert isinstance(info.value, DistIRError) and not info.value.verdict.correct
    assert info.value._render_traceback_() == [f"✗ {info.value.verdict.message}"]
    assert "✗" in info.value.verdict._repr_html_()


def test_a_known_mistake_gets_its_own_explanation():
    mistakes = {3.0: "that is one half of the ring.", 12.0: "counted twice."}
    with pytest.raises(WrongAnswerError, match="That is one half of the ring"):
        check_number(3, 6, mistakes=mistakes, hint="other")
    with pytest.raises(WrongAnswerError, match="Counted twice"):
        check_number(12.05, 6, mistakes=mistakes, hint="other", rel_tol=0.01)
    with pytest.raises(WrongAnswerError, match="Other"):
        check_number(7, 6, mistakes=mistakes, hint="other")


def test_tolerance_is_relative():
    assert check_number(1.009e9, 1e9, rel_tol=0.01).correct
    with pytest.raises(WrongAnswerError):
        check_number(1.02e9, 1e9, rel_tol=0.01)


@pytest.mark.parametrize("bad", ["8", True, [8], float("nan"), float("inf")])
def test_a_number_that_is_not_a_number_is_refused(bad):
    with pytest.raises(WrongAnswerError, match="Not quite: your answer"):
        check_number(bad, 8)


def test_numpy_numbers_are_numbers():
    assert check_number(np.float32(0.5), 0.5).correct
    assert check_number(np.int64(3), 3).correct


@pytest.mark.parametrize(
    "check",
    [
        lambda: check_number(None, 1),
        lambda: check_choice(None, 1),
        lambda: check_formula(None, [({}, 1.0)]),
    ],
)
def test_an_unanswered_exercise_says_not_yet(check):
    with pytest.raises(NotAnsweredError, match="Not yet"):
        check()


def test_choice_right_wrong_and_outside_the_options():
    assert check_choice("S(0)", "S(0)", options=["R", "S(0)", "S(1)"]).correct
    with pytest.raises(WrongAnswerError, match=r"chose 'R', the answer is 'S\(0\)'\. R copies"):
        check_choice("R", "S(0)", options=["R", "S(0)", "S(1)"], mistakes={"R": "R copies."})
    with pytest.raises(WrongAnswerError, match="Fewer rows"):
        check_choice("S(1)", "S(0)", options=["R", "S(0)", "S(1)"], hint="fewer rows.")
    with pytest.raises(WrongAnswerError, match="not one of the options"):
        check_choice("S(2)", "S(0)", options=["R", "S(0)", "S(1)"])
    with pytest.raises(WrongAnswerError, match=r"chose \[1, 2\]"):  # unhashable answers work too
        check_choice([1, 2], (1, 3), hint="look again.")


def test_the_right_ring_formula_matches_the_simulator():
    v = check_formula(ring_s, simulated_allreduce_cases(), rel_tol=1e-6)
    assert v.correct and "6 cases" in v.message


def test_wrong_ring_formulas_are_caught_and_explained():
    cases = simulated_allreduce_cases()
    no_latency = "leaves out the 2(n-1) link latencies."
    half = "counts one half of the ring."
    mistakes = {
        no_latency: lambda n, size_bytes, bandwidth, latency: (
            2 * (n - 1) / n * size_bytes / bandwidth
        ),
        half: lambda n, size_bytes, bandwidth, latency: (
            ring_s(n, size_bytes, bandwidth, latency) / 2
        ),
    }
    for wrong, why in ((mistakes[no_latency], no_latency), (mistakes[half], half)):
        with pytest.raises(WrongAnswerError, match=r"Leaves out|Counts one half") as info:
            check_formula(wrong, cases, mistakes=mistakes, hint="fallback")
        assert why.capitalize()[:12] in info.value.verdict.message
        assert "the workbench measures" in info.value.verdict.message

    def naive(n, size_bytes, bandwidth, latency):
        return size_bytes / bandwidth

    with pytest.raises(WrongAnswerError, match=r"6 of 6 cases are off; for n=2.*Fallback"):
        check_formula(naive, cases, mistakes=mistakes, hint="fallback")


def test_a_formula_that_fails_or_returns_nonsense_is_wrong_not_a_crash():
    with pytest.raises(WrongAnswerError, match="raised ZeroDivisionError"):
        check_formula(lambda n: 1 / (n - 2), [({"n": 2}, 1.0)])
    with pytest.raises(WrongAnswerError, match="should be a number"):
        check_formula(lambda n: "fast", [({"n": 2}, 1.0)])
    with pytest.raises(WrongAnswerError, match="should be a function"):
        check_formula(3.0, [({"n": 2}, 1.0)])


def test_placements_are_shown_as_written():
    from ir.sharding import R, S

    assert check_choice(S(0), S(0), options=(R, S(0), S(1))).message == "Right: S(0)."
    with pytest.raises(WrongAnswerError, match=r"you chose R, the answer is S\(0\)\."):
        check_choice(R, S(0), options=(R, S(0), S(1)))


def test_an_explanation_that_starts_with_code_keeps_its_case():
    with pytest.raises(WrongAnswerError, match=r"'hp=8'\. hp=8 peaks higher\.$"):
        check_choice("dp=8", "hp=8", hint="hp=8 peaks higher.")


def test_an_explanation_that_starts_with_a_word_is_capitalised():
    with pytest.raises(WrongAnswerError, match=r"expected 4\.5\. Close: count the all-gather\.$"):
        check_number(8, 4.5, mistakes={8: "close: count the all-gather."})


def test_a_program_is_checked_by_equivalence_not_by_how_it_was_built():
    from ir import models
    from ir.sharding import Mesh, S, propagate
    from workbench.exercises import check_program

    topology = ir.Topology.preset("a100-hgx", 4)
    f = models.mlp(batch=8, features=16, hidden=32, classes=4)
    mesh = Mesh((4,))
    megatron, _ = propagate(f, {"wA": (mesh, [S(1)])}, topology=topology)
    from_wb, _ = propagate(f, {"wB": (mesh, [S(0)])}, topology=topology)  # same program
    data_parallel, _ = propagate(f, {"x": (mesh, [S(0)])}, topology=topology)
    assert check_program(from_wb, megatron, right="column then row.").correct
    with pytest.raises(WrongAnswerError, match="That splits the batch"):
        check_program(data_parallel, megatron, mistakes={"that splits the batch.": data_parallel})
    with pytest.raises(WrongAnswerError, match=r"not the expected one\. Split wA"):
        check_program(f, megatron, hint="split wA.")
    with pytest.raises(WrongAnswerError, match="should be a program"):
        check_program("wA: S(1)", megatron)
    with pytest.raises(NotAnsweredError):
        check_program(None, megatron)
