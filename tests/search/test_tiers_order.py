"""The order the two tiers simulate in: by estimate, except that a strategy whose floor
(the longest chain no simulation goes below) is above its estimate waits for its floor's
place, so that a known-short estimate does not take a simulation the floor then spares
(:func:`ir.search.tiers.decide`)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

import ir
from ir.search.estimate import Estimates
from ir.search.result import Row
from ir.search.space import Strategy
from ir.search.tiers import decide

# three strategies: (estimated step, floor, simulated step); estimate = busy compute, so
# the margin leaves each estimate as it is (optimistic_step_s)
A = Strategy(1, 1, 8, 8, "interleaved", chunks=2)  # estimated 10 s, but its floor is 13 s
B = Strategy(1, 2, 4, 8)  # estimated 11 s, floor 9 s, simulated 11.5 s
C = Strategy(1, 4, 2, 8)  # estimated 11.2 s, floor 11.8 s (above B's 11.5)
FIGURES = {A: (10.0, 13.0, 14.0), B: (11.0, 9.0, 11.5), C: (11.2, 11.8, 12.5)}
GIB = 2.0**30


class _Estimator:
    """An estimator of fixed figures (what ``decide`` reads of one)."""

    topology = ir.Topology.preset("a100-hgx", 8)

    def __init__(self) -> None:
        self.floors_made: list[Strategy] = []

    def estimate(self, todo):
        steps = np.array([FIGURES[s][0] for s in todo])
        n = len(todo)
        return Estimates(
            steps, np.full(n, GIB), np.zeros(n), np.zeros(n), steps.copy(), np.ones(n, bool)
        )

    def bound_s(self, s: Strategy) -> float:
        self.floors_made.append(s)
        return FIGURES[s][1]

    def peak_floor_bytes(self, s: Strategy) -> float:
        return 0.0


def _simulated(s: Strategy) -> Row:
    return Row(s, "ok", step_time_s=FIGURES[s][2], peak_memory_bytes=GIB)


class _Executor:
    """Runs each job at once and keeps what was submitted."""

    def __init__(self) -> None:
        self.submitted: list[Strategy] = []

    def submit(self, batch):
        self.submitted += batch
        return SimpleNamespace(result=lambda: [_simulated(s) for s in batch], done=lambda: True,
                               cancel=lambda: True)  # fmt: skip


@pytest.mark.parametrize("mode", ["fastest", "front"])
def test_a_strategy_whose_floor_is_above_its_estimate_waits_for_its_floors_place(mode) -> None:
    todo = [A, B, C]
    ran: list[Strategy] = []

    def simulate_one(s: Strategy) -> Row:
        ran.append(s)
        return _simulated(s)

    model = _Estimator()
    rows = list(decide(todo, simulate_one, lambda: model, 80 * GIB, mode))
    # A, first by its estimate, has a floor (13 s) above it: it goes after C (11.2 s); B is
    # simulated first. Asked for the fastest, B's 11.5 s spares both C (floor 11.8 s) and
    # A (13 s); the front wants them (each might need less memory than B), A last
    assert [r.strategy for r in rows] == [B, C, A]
    if mode == "fastest":
        assert ran == [B]
        assert [r.status for r in rows] == ["ok", "estimated", "estimated"]
        assert all("longest chain" in r.error for r in rows[1:])
    else:
        assert ran == [B, C, A]
    assert rows[0].estimated_step_time_s == 11.0  # the rows keep the estimate, not the key
    # on an executor: the same rows; B sent to a worker first, A only from its new place
    # (after C, like any strategy there: the window's two jobs a worker), C, kept back by
    # its floor, only when its turn comes, if at all
    executor = _Executor()
    spread = list(
        decide(todo, _simulated, lambda: _Estimator(), 80 * GIB, mode, executor.submit, 2)
    )
    assert [r.as_record() for r in spread] == [r.as_record() for r in rows]
    assert executor.submitted == ([B, A] if mode == "fastest" else [B, A, C])


def test_a_floor_below_the_estimate_leaves_the_order_as_estimated() -> None:
    """B's floor (9 s) is below its estimate: it keeps its place, and a strategy's floor
    is made once however often its place is looked at."""
    ran: list[Strategy] = []
    model = _Estimator()
    rows = list(decide([B, C], lambda s: ran.append(s) or _simulated(s), lambda: model,
                       80 * GIB, "fastest"))  # fmt: skip
    assert ran == [B] and [r.strategy for r in rows] == [B, C]
    assert sorted(map(str, model.floors_made)) == sorted(map(str, set(model.floors_made)))
