"""Propagation: the distributed Function computes what the original does; the report says why."""

from __future__ import annotations

import numpy as np
import pytest
from _sharding_programs import mlp

import ir
import ir.models
from ir import FunctionBuilder, TensorType, Topology
from ir.sharding import (
    AnnotationError,
    ConflictingAnnotationError,
    Mesh,
    MeshError,
    P,
    R,
    S,
    ShardingSpec,
    annotate,
    fuse_pmaps,
    propagate,
)

M2, M3, M22, M24 = Mesh((2,)), Mesh((3,)), Mesh((2, 2)), Mesh((2, 4))


def assert_same(f: ir.Function, g: ir.Function, seed: int = 0) -> None:
    inputs = ir.random_inputs(f, seed)
    for want, got in zip(ir.execute(f, inputs), ir.execute_step(g, inputs, rtol=1e-5), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


MLP_CASES = [
    ("megatron column", mlp(), {"w1": (M2, [S(1)])}),
    ("data parallel", mlp(), {"x": (M2, [S(0)])}),
    ("contraction", mlp(), {"w1": (M2, [S(0)])}),
    ("2x2 data x tensor", mlp(), {"x": (M22, [S(0), R]), "w1": (M22, [R, S(1)])}),
    ("2x4 data x tensor", mlp(), {"x": (M24, [S(0), R]), "w1": (M24, [R, S(1)])}),
    ("uneven 3-way", mlp(7, 5, 9, 4), {"x": (M3, [S(0)]), "w1": (M3, [S(1)])}),
    ("onnx spec", mlp(), {"x": ShardingSpec([0, 1], [(0, 2)])}),
    ("training 2x2", mlp(training=True), {"x": (M22, [S(0), R]), "w1": (M22, [R, S(1)])}),
    (
        "training uneven 2x4",
        mlp(9, 6, 10, 4, True),
        {"x": (M24, [S(0), R]), "w2": (M24, [R, S(0)])},
    ),
    ("training contraction", mlp(training=True), {"w1": (M2, [S(0)])}),
]


@pytest.mark.parametrize(("case", "f", "annotations"), MLP_CASES, ids=[c[0] for c in MLP_CASES])
def test_mlp_distributed_execution_equals_the_original(case, f, annotations):
    g, _ = propagate(f, annotations)
    assert_same(f, g)


def _small_gpt(training: bool = False, batch: int = 2, seq: int = 4) -> ir.Function:
    return ir.models.gpt(
        batch=batch, seq=seq, hidden=8, heads=2, vocab=11, layers=1, training=training
    )


HEADS = {f"h0_attn_w{k}": (M2, [S(1)]) for k in "qkv"}
GPT_CASES = [
    ("data parallel", _small_gpt(), {"tokens": (M2, [S(0)])}),
    ("megatron heads + mlp", _small_gpt(), {**HEADS, "h0_mlp_w1": (M2, [S(1)])}),
    ("2x2", _small_gpt(), {"tokens": (M22, [S(0), R]), "h0_mlp_w1": (M22, [R, S(1)])}),
    ("2x4", _small_gpt(), {"tokens": (M24, [S(0), R]), "h0_mlp_w1": (M24, [R, S(1)])}),
    ("uneven 2x2", _small_gpt(batch=3, seq=5), {"tokens": (M22, [S(0), S(1)])}),
    ("training data parallel", _small_gpt(True), {"tokens": (M2, [S(0)])}),
]


@pytest.mark.parametrize(("case", "f", "annotations"), GPT_CASES, ids=[c[0] for c in GPT_CASES])
def test_gpt_distributed_execution_equals_the_original(case, f, annotations):
    g, _ = propagate(f, annotations)
    assert_same(f, g)


# -- what propagation decides ---------------------------------------------------------


def test_one_column_sharded_weight_gives_megatron_with_no_collective_inside():
    g, report = propagate(mlp(), {"w1": (M2, [S(1)])})
    assert report.layouts["w1"] == ("S(1)",)
    assert report.layouts["h"] == ("S(1)",)  # forward through MatMul and Relu
    assert report.layouts["w2"] == ("S(0)",)  # backward: the row-parallel weight
    assert report.layouts["y"] == ("P(sum)",)  # contraction sharded -> Partial
    assert report.collectives == []
    # each op is one Pmap over the mesh (both devices run the same local op); fused, one
    # Pmap runs the layer, as Megatron writes it
    bodies = [op.subfunctions[0] for op in g.ops if op.op_type == "Pmap"]
    assert [body.ops[0].op_type for body in bodies] == ["MatMul", "Relu", "MatMul"]
    fused = [op.subfunctions[0] for op in fuse_pmaps(g).ops if op.op_type == "Pmap"]
    assert [op.op_type for op in fused[0].ops] == ["MatMul", "Relu", "MatMul"]
    assert g.rank_classes == ((0, 1),)
    # a steady-state step: the weights arrive split, the partial output stays partial
    assert dict(zip([v.name for v in g.inputs], g.input_layouts))["w1"] == ("S(1)",)
    assert g.output_layouts == (("P",),)
    assert not {"Scatter", "Broadcast", "Reduce", "Gather"} & {op.op_type for op in g.ops}
    seed_form, _ = propagate(mlp(), {"w1": (M2, [S(1)])}, inputs="distribute")
    assert "Scatter" in {op.op_type for op in seed_form.ops}  # distributed every step
    assert seed_form.ops[-1].op_type == "Reduce"  # and reduces the partial output once


def test_inserted_collectives_are_reported_with_kind_bytes_time_and_reason():
    _, report = propagate(mlp(training=True), {"w1": (M2, [S(1)])})
    (entry,) = [c for c in report.collectives if c.value == "y"]
    assert entry.kind == "allreduce"
    assert (entry.src, entry.dst) == (("P(sum)",), ("R",))
    assert entry.size_bytes == 8 * 4 * 4
    assert entry.time_s > 0
    assert "Loss" in entry.reason and "needing it as [R]" in entry.reason
    assert "allreduce" in str(report)


def _chain(first, second) -> tuple[ir.Function, dict]:
    b = FunctionBuilder("chain")
    x = b.input("x", TensorType((8, 8), device=0))
    a = b.call("Relu", x, name="a")
    c = b.call("Tanh", a, name="c")
    return b.finish([c]), {"a": (M2, [first]), "c": (M2, [second])}


@pytest.mark.parametrize(
    ("first", "second", "kind"),
    [(S(0), S(1), "alltoall"), (S(0), R, "allgather")],
)
def test_redistribution_between_user_annotations(first, second, kind):
    f, annotations = _chain(first, second)
    g, report = propagate(f, annotations)
    assert [c.kind for c in report.collectives] == [kind]
    assert "user annotation" in report.collectives[0].reason
    assert_same(f, g)


def test_partial_to_shard_uses_reduce_scatter():
    b = FunctionBuilder("rs")
    x = b.input("x", TensorType((8, 6), device=0))
    w = b.input("w", TensorType((6, 4), device=0))
    y = b.call("MatMul", x, w, name="y")
    r = b.call("Relu", y, name="r")
    f = b.finish([r])
    g, report = propagate(f, {"w": (M2, [S(0)]), "r": (M2, [S(0)])})
    assert report.layouts["y"] == ("P(sum)",)
    assert [c.kind for c in report.collectives] == ["reducescatter"]
    assert_same(f, g)


def test_user_annotations_win_over_what_propagation_would_choose():
    f = mlp()
    g, report = propagate(f, {"w1": (M2, [S(1)]), "h": (M2, [R])})
    assert report.layouts["h"] == ("R",)
    # Gathering w1 (240 B) is cheaper than gathering h (320 B): the planner picks it.
    assert [(c.value, c.kind) for c in report.collectives] == [("w1", "allgather")]
    assert_same(f, g)


def test_predicted_time_follows_the_topology():
    f = mlp(training=True)
    fast = Topology.uniform(2, link_bandwidth_bytes_per_s=1e11)
    slow = Topology.uniform(2, link_bandwidth_bytes_per_s=1e8)
    _, r_fast = propagate(f, {"w1": (M2, [S(1)])}, fast)
    _, r_slow = propagate(f, {"w1": (M2, [S(1)])}, slow)
    assert r_slow.communication_time_s > r_fast.communication_time_s > 0


# -- annotations in the text format ---------------------------------------------------


def test_annotations_print_parse_and_propagate_like_the_dict():
    f = mlp()
    annotated = annotate(f, {"w1": (M22, [R, S(1)]), "x": (M22, [S(0), R])})
    text = str(annotated)
    assert 'ShardAnnotate(w1, mesh=[2, 2], devices=[0, 1, 2, 3], placements=["R", "S(1)"])' in text
    if hasattr(ir, "parse"):
        assert ir.parse(text).is_equivalent(annotated)
    from_text, _ = propagate(annotated)
    from_dict, _ = propagate(f, {"w1": (M22, [R, S(1)]), "x": (M22, [S(0), R])})
    assert_same(f, from_text)
    assert len(from_text.ops) == len(from_dict.ops)


# -- impossible annotations ---------------------------------------------------------------


def test_conflicting_user_annotations_name_the_value():
    annotated = annotate(mlp(), {"w1": (M2, [S(1)])})
    with pytest.raises(ConflictingAnnotationError, match=r"'w1' is annotated twice.*one layout"):
        propagate(annotated, {"w1": (M2, [S(0)])})


def test_devices_not_in_the_mesh_name_the_value():
    with pytest.raises(MeshError, match=r"'w2'.*device\(s\) \[4, 5\].*not in the mesh"):
        propagate(mlp(), {"w1": (M2, [S(1)]), "w2": (Mesh((2,), (4, 5)), [S(0)])})
    with pytest.raises(MeshError, match="not in the topology"):
        propagate(mlp(), {"w1": (M2, [S(1)])}, Topology.uniform(1))


def test_axis_out_of_range_and_too_many_shards_name_the_value():
    with pytest.raises(AnnotationError, match=r"'w1'.*axis 2 is out of range"):
        propagate(mlp(), {"w1": (M2, [S(2)])})
    with pytest.raises(AnnotationError, match=r"'y'.*more shards than elements"):
        propagate(mlp(out=4), {"y": (Mesh((8,)), [S(1)])})
    with pytest.raises(AnnotationError, match="no value named 'nope'"):
        propagate(mlp(), {"nope": (M2, [R])})
    with pytest.raises(AnnotationError, match="reduction must be"):
        propagate(mlp(), {"w1": (M2, [P("avg")])})


def test_per_device_inputs_and_ops_without_rules_are_refused_with_a_reason():
    from ir.sharding import PropagationError
    from ir.types import TupleType

    b = FunctionBuilder("tuple_in")
    xs = b.input("xs", TupleType((TensorType((2,), device=0), TensorType((2,), device=1))))
    f = b.finish([b.call("Identity", xs, name="ys")])
    with pytest.raises(PropagationError, match=r"'xs' is .* already per-device"):
        propagate(f, mesh=M2)
    b = FunctionBuilder("send")
    x = b.input("x", TensorType((4,), device=0))
    f = b.finish([b.call("Send", x, to_device=1, name="y")])
    with pytest.raises(PropagationError, match=r"Send has no sharding rule(.|\n)*in: y: "):
        propagate(f, {"x": (M2, [S(0)])})
