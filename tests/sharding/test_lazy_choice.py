"""The lazy strategy choice (a heap of partial sums) picks what costing every strategy and
sorting by (time, index) picks, op by op, and fails the same way when nothing fits."""

from __future__ import annotations

import contextlib
import importlib

import pytest
from _sharding_programs import mlp

import ir
import ir.models
from ir import FunctionBuilder, TensorType
from ir.sharding import Mesh, R, S, halo, propagate
from ir.sharding.errors import PropagationError
from ir.sharding.rules import describe, placements_for, rule_for, strategies
from ir.transforms._emit import carried_inputs

choice = importlib.import_module("ir.sharding.choice")
propagate_impl = importlib.import_module("ir.sharding.propagate")


def reference_cost(self, op, rule, strategy, ins, outs) -> float:
    """A strategy's time as propagation costed it before the lazy choice (commit 06629b3),
    written out here so that the choice's own terms are not their own reference; an
    update of a steady-state step's carried state as the step runs it: its gradient's
    reduction overlapped (not counted), its results taken back to their state's layout."""
    carried = carried_inputs(self.f) if self.resident else {}
    states = {carried[v] for v in op.outputs if v in carried and carried[v] is not v}
    total = 0.0
    for v, ps in zip(op.inputs, ins):
        time_s = self._source(v, self._layout_of(ps))[0]
        if not states or v in states:
            total += time_s
    for v, ps in zip(op.outputs, outs):
        if v in carried and carried[v] is not v:
            want = self.dist[carried[v]].layout
        else:
            want = self._layout_of(self.desired.get(v, ps))
        with contextlib.suppress(PropagationError):
            total += self._plan_time_s(v.type, self._layout_of(ps), want)
    shards = 1
    for k, c in enumerate(strategy):
        if c[0] in ("shard", "halo"):
            shards *= self.mesh.shape[k]
    if any(c[0] == "halo" for c in strategy):
        total += halo.exchange_time_s(op, rule, self.mesh, strategy, self.topology)
    return total + self._compute_time_s(op, shards)


def eager_choose(self, op):
    """The reference: cost every strategy that fits, sort, take the first locally valid."""
    rule = rule_for(op)
    current = [self.dist[v].layout.placements for v in op.inputs]
    candidates = []
    for n, strategy in enumerate(strategies(rule, self.mesh, current)):
        pl = placements_for(rule, strategy)
        if pl is None or not self._fits(op, pl):
            continue
        try:
            cost = reference_cost(self, op, rule, strategy, *pl)
        except PropagationError:
            continue
        candidates.append((cost, n, strategy, pl))
    for _, _, strategy, (ins, outs) in sorted(candidates, key=lambda c: (c[0], c[1])):
        if self._locally_valid(op, rule, strategy, ins, outs):
            return rule, strategy, ins, outs
    raise PropagationError("no strategy (eager)")


def conv(height: int) -> ir.Function:
    b = FunctionBuilder("conv")
    a = b.input("a", TensorType((1, height, 5, 3), device=0))
    w = b.input("w", TensorType((3, 3, 3, 10), device=0))
    return b.finish([b.call("Conv2D", a, w, padding="same", name="r")])


CASES = [  # (program, annotated input, its tensor axis to shard)
    (lambda: ir.models.gpt(batch=4, seq=8, hidden=16, heads=2, vocab=32, layers=2), "tokens", 0),
    (
        lambda: ir.models.gpt(
            batch=6, seq=8, hidden=12, heads=2, vocab=30, layers=2, training=True
        ),
        "tokens",
        1,
    ),
    (lambda: mlp(training=True), "x", 0),
    (lambda: conv(11), "a", 1),
]
MESHES = [(2,), (3,), (2, 2), (2, 3)]


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("shape", MESHES, ids=str)
@pytest.mark.parametrize("last", [False, True], ids=["outer", "inner"])
def test_lazy_choice_picks_what_sorting_every_cost_picks(monkeypatch, case, shape, last):
    make, name, dim = CASES[case]
    f = make()
    placements = [R] * len(shape)
    placements[-1 if last else 0] = S(dim)
    annotations = {name: (Mesh(shape), placements)}
    want = propagate(f, annotations)
    picks = []
    real = choice.Chooser._choose

    def both(self, op):
        got = real(self, op)
        expected = eager_choose(self, op)
        picks.append(got[1])
        assert got[1] == expected[1], op
        assert [tuple(x) for x in got[2]] == [tuple(x) for x in expected[2]]
        assert [tuple(x) for x in got[3]] == [tuple(x) for x in expected[3]]
        return got

    monkeypatch.setattr(choice.Chooser, "_choose", both)
    monkeypatch.setattr(propagate_impl._Materialiser, "_choice_key", lambda self, op: None)
    got = propagate(f, annotations)
    assert len(picks) == sum(op.op_type != "ShardAnnotate" for op in f.ops)
    assert str(got[0]) == str(want[0])
    if case == 3:  # the conv splits its rows with a halo exchange
        assert any(c[0] == "halo" for s in picks for c in s)


def test_lazy_choice_orders_by_time_then_enumeration(monkeypatch):
    # With free compute and free redistribution every strategy of a lone Relu ties at 0:
    # the first enumerated wins, as a stable sort by (time, index) picks; with the first
    # made locally invalid, the second.
    b = FunctionBuilder("f")
    x = b.input("x", TensorType((4, 6), device=0))
    f = b.finish([b.call("Relu", x, name="y")])
    monkeypatch.setattr(choice.Chooser, "_compute_time_s", lambda self, op, shards: 0.0)
    monkeypatch.setattr(choice.Chooser, "_plan_time_s", lambda self, t, src, dst: 0.0)
    mesh = Mesh((2, 2))
    rule = rule_for(f.ops[0])
    enumerated = [describe(s, rule) for s in strategies(rule, mesh, [(R, R)])]
    _, report = propagate(f, {"x": (mesh, [R, R])})
    assert [how for _, how in report.strategies] == [enumerated[0]]
    real_valid = choice.Chooser._locally_valid

    def not_the_first(self, op, rule, strategy, ins, outs):
        return describe(strategy, rule) != enumerated[0] and real_valid(
            self, op, rule, strategy, ins, outs
        )

    monkeypatch.setattr(choice.Chooser, "_locally_valid", not_the_first)
    _, report = propagate(f, {"x": (mesh, [R, R])})
    assert [how for _, how in report.strategies] == [enumerated[1]]
    # Compute that grows with the shards: the last enumerated (replicate) is the cheapest.
    monkeypatch.setattr(choice.Chooser, "_locally_valid", real_valid)
    monkeypatch.setattr(choice.Chooser, "_compute_time_s", lambda self, op, shards: shards)
    _, report = propagate(f, {"x": (mesh, [R, R])})
    assert [how for _, how in report.strategies] == ["axis 0: replicate; axis 1: replicate"]
    assert enumerated[-1] == "axis 0: replicate; axis 1: replicate"


def test_no_strategy_error_names_the_op_and_operands(monkeypatch):
    f = mlp()
    monkeypatch.setattr(choice.Chooser, "_locally_valid", lambda self, *a: False)
    with pytest.raises(PropagationError, match=r"no sharding strategy places .* on mesh \[2\]"):
        propagate(f, {"x": (Mesh((2,)), [S(0)])})
