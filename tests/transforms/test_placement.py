"""Model-parallel placement (seed 000): ops on devices, sends between them, same results."""

from __future__ import annotations

import pytest
from _parallel_programs import assert_same, model

import ir
import ir.models
from ir.transforms import TransformError, place


def test_seed_model_parallel_mlp() -> None:
    f = ir.models.mlp(8, 4, 6, 5, training=True, activation=None, dtype=ir.DType.float64)
    g = place(f, {"wB": 1})
    got = [(op.op_type, op.device, [v.name for v in op.outputs]) for op in g.ops]
    assert got == [
        ("MatMul", 0, ["a"]),
        ("Send", 1, ["a_at1"]),
        ("Send", 1, ["wB_at1"]),
        ("MatMul", 1, ["y"]),
        ("Send", 1, ["z_at1"]),
        ("Loss", 1, ["l"]),
        ("LossGrad", 1, ["dl"]),
        ("MatMulGrad", 1, ["dwB", "da"]),
        ("Send", 0, ["da_at0"]),
        ("MatMulGrad", 0, ["dwA", "dx"]),
        ("SGDOptimizer", 1, ["wB1"]),
        ("SGDOptimizer", 0, ["wA1"]),
    ]
    assert_same(f, g)


def test_gpt_on_two_devices_by_block() -> None:
    f = model("gpt_sgd")
    second = [v.name for v in f.inputs if v.name.startswith("h1_") or v.name == "w_head"]
    g = place(f, dict.fromkeys(second, 1))
    assert {op.device for op in g.ops} - {None} == {0, 1}
    assert_same(f, g)


def test_naming_a_result_places_its_op() -> None:
    f = model("mlp_sgd")
    g = place(f, {"y": 2})
    assert next(op for op in g.ops if op.outputs[0].name == "y").device == 2
    assert_same(f, g)


def test_errors() -> None:
    f = model("mlp_sgd")
    with pytest.raises(TransformError, match="no value"):
        place(f, {"nope": 1})
    with pytest.raises(TransformError, match="not in the topology"):
        place(f, {"wB": 5}, topology=ir.Topology.uniform(2))
