"""Every op's sharding rule, walked: sharded execution equals unsharded execution.

For each op with a sharding rule, on its registry examples, each tensor operand
is annotated ``S(d)`` for each axis ``d`` over 2 devices (and one 2x2 case);
propagation must produce a program whose numpy execution equals the op's.
"""

from __future__ import annotations

import numpy as np
import pytest
from _sharding_programs import flat

import ir
from ir.execute import input_value_ranges
from ir.registry import TypeContext
from ir.sharding import Mesh, S, propagate
from ir.types import TensorType, TupleType

RULED = [op for op in ir.all_ops() if op.sharding_rule is not None]


def _random(t, rng, value_range=None):
    if isinstance(t, TupleType):
        return tuple(_random(e, rng) for e in t.elements)
    if value_range is not None and value_range[1] is not None:  # class labels, say
        return rng.integers(value_range[0], value_range[1], t.shape).astype(t.dtype.numpy)
    if t.dtype.is_float:
        return rng.uniform(0.1, 1.0, t.shape).astype(t.dtype.numpy)
    return rng.integers(0, 2, t.shape).astype(t.dtype.numpy)


def _function(name: str, example: TypeContext) -> ir.Function:
    b = ir.FunctionBuilder(f"walk_{name.lower()}")
    inputs = [b.input(f"x{i}", t) for i, t in enumerate(example.input_types)]
    node = b.add_op(name, inputs, example.attributes, subfunctions=example.subfunctions)
    return b.finish(list(node.outputs))


def _annotations(f: ir.Function):
    if not f.inputs:
        yield {}  # nothing to annotate (Constant): everything replicated
    for v in f.inputs:
        if not isinstance(v.type, TensorType):
            continue
        for d, n in enumerate(v.type.shape):
            if n >= 2:
                yield {v.name: (Mesh((2,)), [S(d)])}


def test_every_family_has_sharding_rules():
    names = {op.name for op in RULED}
    for wanted in ("Add", "MatMul", "ReduceSum", "Softmax", "LayerNorm", "Reshape", "Transpose"):
        assert wanted in names
    for wanted in ("Concat", "Split", "Embedding", "Loss", "Conv2D", "MatMulGrad", "Adam"):
        assert wanted in names


@pytest.mark.parametrize("name", [op.name for op in RULED])
def test_sharded_execution_equals_unsharded(name: str):
    op = ir.get_op(name)
    rng = np.random.default_rng(0)
    checked = 0
    for example in op.extra["examples"](2):
        example = TypeContext(example.input_types, op.complete_attributes(example.attributes))
        if any(isinstance(t, TupleType) for t in example.input_types):
            continue  # tuple operands are per-device values already
        f = _function(name, example)
        ranges = input_value_ranges(f)
        inputs = [_random(v.type, rng, ranges.get(i)) for i, v in enumerate(f.inputs)]
        want = ir.execute(f, inputs)
        for given in _annotations(f):
            g, _ = propagate(f, given, mesh=Mesh((2,)))
            for w, got in zip(flat(want), flat(ir.execute_step(g, inputs, rtol=1e-5)), strict=True):
                np.testing.assert_allclose(
                    got, w, rtol=1e-5, atol=1e-6, err_msg=f"{name} with {given}"
                )
            checked += 1
    # TupleGet's operand is always a tuple; Split -> TupleGet is walked with Split.
    assert checked or name == "TupleGet", f"{name}: no example was sharded"


def test_a_2x2_mesh_shards_matmul_in_both_operands():
    b = ir.FunctionBuilder("mm")
    a = b.input("a", TensorType((5, 6), device=0))
    w = b.input("w", TensorType((6, 7), device=0))
    f = b.finish([b.call("MatMul", a, w, name="c")])
    mesh = Mesh((2, 2))
    g, report = propagate(f, {"a": (mesh, [S(0), S(1)]), "w": (mesh, [S(1), S(0)])})
    inputs = ir.random_inputs(f, 0)
    np.testing.assert_allclose(
        ir.execute_step(g, inputs, rtol=1e-5)[0], ir.execute(f, inputs)[0], rtol=1e-5
    )
    assert report.layouts["c"][1] == "P(sum)"  # the contraction split on mesh axis 1
