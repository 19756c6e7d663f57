"""Propagation's fast paths change no answer.

Repeated layers reuse the first layer's local ops (``FunctionBuilder.add_inferred``),
inputs are unpacked without the type rule (``FunctionBuilder.unpack``), and
redistribution costs are memoised (``RedistributionCosts``, cached layout hashes). The
program must equal, op for op, the one built when every op goes through the builder's
checking path.
"""

from __future__ import annotations

import importlib
import pickle

import numpy as np
import pytest

import ir
import ir.models
from ir import FunctionBuilder
from ir.collectives import collective_time_s
from ir.sharding import Mesh, P, R, S, propagate
from ir.sharding.mesh import Layout
from ir.sharding.redistribute import RedistributionCosts, plan, step_bytes

propagate_impl = importlib.import_module("ir.sharding.propagate")


def small_gpt(training: bool) -> ir.Function:
    return ir.models.gpt(batch=4, seq=8, hidden=16, heads=2, vocab=32, layers=3, training=training)


def checking_add_inferred(self, op_type, inputs, attributes, output_types, names, *, op_name=""):
    """``add_inferred`` through ``add_op``: the type rule must give the trusted answers."""
    op = FunctionBuilder.add_op(
        self,
        op_type,
        inputs,
        dict(attributes),
        names=names,
        output_types=output_types,
        op_name=op_name,
    )
    assert dict(op.attributes) == dict(attributes), op
    return op


def checking_add_inferred_rows(self, op_type, inputs, signatures, names):
    """``add_inferred_rows`` as one checked ``add_op`` per row."""
    return [
        checking_add_inferred(self, op_type, row, attrs, types, row_names).outputs
        for row, (attrs, types), row_names in zip(inputs, signatures, names, strict=True)
    ]


def checking_unpack(self, value, names):
    return tuple(self.call("TupleGet", value, index=i, name=name) for i, name in enumerate(names))


def op_facts(f: ir.Function) -> list[tuple]:
    return [
        (
            op.op_type,
            dict(op.attributes),
            [v.type for v in op.outputs],
            [v.name for v in op.outputs],
            [v.name for v in op.inputs],
            op.device,
        )
        for op in f.ops
    ]


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("shape", [(2,), (4,), (2, 2), (2, 4)])
def test_fast_path_program_equals_the_checked_one(monkeypatch, training, shape):
    f = small_gpt(training)
    annotations = {"tokens": (Mesh(shape), [S(0)] + [R] * (len(shape) - 1))}
    trusted = []
    real_add_inferred = FunctionBuilder.add_inferred
    real_add_inferred_rows = FunctionBuilder.add_inferred_rows

    def counting(self, *args, **kwargs):
        trusted.append(args[0])
        return real_add_inferred(self, *args, **kwargs)

    def counting_rows(self, op_type, inputs, *args):
        trusted.extend([op_type] * len(inputs))
        return real_add_inferred_rows(self, op_type, inputs, *args)

    monkeypatch.setattr(FunctionBuilder, "add_inferred", counting)
    monkeypatch.setattr(FunctionBuilder, "add_inferred_rows", counting_rows)
    g, report = propagate(f, annotations)
    # Layers after the first trust the first one's answers: a symmetric op (every device
    # runs the same local op) is a Pmap whose body the first such layer wrote; the others
    # take the fast per-device path.
    pmaps = [op.subfunctions[0] for op in g.ops if op.op_type == "Pmap"]
    shared = sum(any(body is other for other in pmaps[:i]) for i, body in enumerate(pmaps))
    assert shared + len(trusted) > len(g.ops) / 3

    monkeypatch.setattr(FunctionBuilder, "add_inferred", checking_add_inferred)
    monkeypatch.setattr(FunctionBuilder, "add_inferred_rows", checking_add_inferred_rows)
    monkeypatch.setattr(FunctionBuilder, "unpack", checking_unpack)
    h, checked = propagate(f, annotations)
    assert str(g) == str(h)
    assert op_facts(g) == op_facts(h)
    ir.verify(g)
    assert report.strategies == checked.strategies
    assert [str(c) for c in report.collectives] == [str(c) for c in checked.collectives]
    assert report.layouts == checked.layouts

    inputs = ir.random_inputs(f, 0)
    for want, got in zip(ir.execute(f, inputs), ir.execute_step(g, inputs, rtol=1e-5), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_fast_path_program_equals_the_unmemoised_one(monkeypatch):
    f = small_gpt(training=True)
    annotations = {"tokens": (Mesh((2, 2)), [S(0), R])}
    g, report = propagate(f, annotations)
    monkeypatch.setattr(propagate_impl._Materialiser, "_choice_key", lambda self, op: None)
    monkeypatch.setattr(FunctionBuilder, "unpack", checking_unpack)
    h, plain = propagate(f, annotations)
    assert op_facts(g) == op_facts(h)
    assert report.strategies == plain.strategies


def test_memoised_redistribution_costs_equal_the_direct_formula():
    # 16 devices on two 8-GPU nodes; a mesh whose axis-0 groups cross nodes unevenly.
    topology = ir.Topology.preset("a100-hgx", 16)
    mesh = Mesh((4, 4), (0, 8, 1, 9, 2, 10, 3, 11, 4, 5, 6, 7, 12, 13, 14, 15))
    t = ir.TensorType((64, 36), device=0)
    costs = RedistributionCosts(topology)
    pairs = [
        ([S(0), S(1)], [R, R]),
        ([P(), R], [R, S(1)]),
        ([R, P()], [S(0), R]),
        ([S(1), R], [S(0), R]),
        ([R, S(0)], [S(0), R]),
    ]
    for src_ps, dst_ps in pairs:
        src, dst = Layout(mesh, src_ps), Layout(mesh, dst_ps)
        want, layout = 0.0, src
        for step in plan(t.shape, src, dst):
            if step.kind != "slice":
                size = step_bytes(t, layout, step)
                want += max(
                    collective_time_s(step.kind, size, group, topology)
                    for group in mesh.groups(step.axis)
                )
            ps = list(layout.placements)
            ps[step.axis] = step.dst
            layout = Layout(mesh, ps)
        assert want > 0
        assert costs.plan_time_s(t, src, dst) == want
        assert costs.plan_time_s(t, src, dst) == want  # from the memo


def test_plan_answers_a_fresh_list_each_time():
    mesh = Mesh((2, 2))
    src, dst = Layout(mesh, [S(0), S(1)]), Layout(mesh, [R, R])
    steps = plan((8, 8), src, dst)
    steps.clear()
    assert [s.kind for s in plan((8, 8), src, dst)] == ["allgather", "allgather"]


def test_layout_hash_is_cached_but_equal_layouts_hash_alike():
    mesh = Mesh((2, 4))
    a = Layout(mesh, [S(0), P("max")])
    b = Layout(Mesh((2, 4)), ["S(0)", "P(max)"])
    assert a == b and hash(a) == hash(b) == hash(a)
    assert hash(mesh) == hash(Mesh((2, 4), range(8)))
    assert Layout(mesh, [S(1), R]) != a
    # A pickle carries no hash: a string's hash differs from one process to the next.
    again = pickle.loads(pickle.dumps(a))
    assert "_hash" not in again.__dict__
    assert again == a and hash(again) == hash(a)
    assert {a: 1}[again] == 1
