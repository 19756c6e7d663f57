"""Pipeline parallelism: same results as the sequential program for every schedule, stage count
and microbatch count (uneven too); activation memory on stage 0 is K (GPipe) or min(p, K) (1F1B)."""

from __future__ import annotations

import numpy as np
import pytest
from _parallel_programs import MODELS, assert_same, inputs_for, mlp, model, transformer_block
from hypothesis import given, settings
from hypothesis import strategies as st

import ir
import ir.models
from ir.transforms._rewrite import TransformError
from ir.transforms.pipeline import live_microbatches, pipeline_parallel, stage_assignment
from ir.transforms.setup import setup_program


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(
    ("stages", "microbatches"), [(1, 1), (1, 3), (2, 2), (2, 3), (3, 5), (4, 8)]
)
def test_training_mlp_matches_sequential(schedule: str, stages: int, microbatches: int) -> None:
    f = mlp(8, 4, 6, 5, layers=4, training=True)
    assert_same(f, pipeline_parallel(f, stages, microbatches, schedule))


def test_adam_forward_and_transformer_block() -> None:
    f = mlp(6, 3, 5, 4, layers=3, training=True, optimizer="adam", activation="Gelu")
    assert_same(f, pipeline_parallel(f, 3, 4, "1f1b"))
    assert_same(mlp(6, 3, 5, 4, layers=2), pipeline_parallel(mlp(6, 3, 5, 4, layers=2), 2, 3))
    block = transformer_block(4, 3, 8, 2)
    assert_same(block, pipeline_parallel(block, 2, 2))


@pytest.mark.parametrize(("stages", "microbatches"), [(2, 2), (2, 6), (3, 2), (3, 6), (4, 8)])
def test_live_activations_on_stage_zero(stages: int, microbatches: int) -> None:
    f = mlp(8, 4, 6, 5, layers=4, training=True)
    gpipe = pipeline_parallel(f, stages, microbatches, "gpipe")
    one_f_one_b = pipeline_parallel(f, stages, microbatches, "1f1b")
    assert live_microbatches(gpipe, 0) == microbatches
    assert live_microbatches(one_f_one_b, 0) == min(stages, microbatches)


@pytest.mark.parametrize(("resident", "sends"), [(True, 2 + 2), (False, 2 + 2 + 2 + 1)])
def test_program_has_the_seed_shape(resident: bool, sends: int) -> None:
    """Seed 000: split, per-microbatch forward with sends, backward, sum, one optimizer step."""
    g = pipeline_parallel(mlp(8, 4, 6, 5, training=True), 2, 2, resident=resident)
    kinds = [op.op_type for op in g.ops]
    assert kinds[:2] == ["Split", "Split"]
    assert kinds.count("SGDOptimizer") == 2 and kinds.count("Loss") == 2
    # activations and gradients; moved every step unless resident: the labels, wB
    assert kinds.count("Send") == sends
    opt = [op for op in g.ops if op.op_type == "SGDOptimizer"]
    assert [op.device for op in opt] == [0, 1]
    adds = [op for op in g.ops if op.op_type == "Add"]
    assert len(adds) == 3  # the loss and two weight gradients, summed over 2 microbatches
    assert all(op.attributes["denominator"] == 8 for op in g.ops if op.op_type == "Loss")


def test_stages_follow_the_weights() -> None:
    f = mlp(8, 4, 6, 5, layers=2, training=True)
    stage = stage_assignment(f, 2)
    by_name = {op.outputs[0].name: s for op, s in stage.items()}
    assert by_name["a0"] == 0 and by_name["a1"] == 1 and by_name["l"] == 1
    assert by_name["dh0"] == 0 and by_name["w0_1"] == 0 and by_name["w1_1"] == 1


def test_errors() -> None:
    f = mlp(4, 3, 5, 4, layers=2, training=True)
    with pytest.raises(TransformError, match="stages more than layers"):
        pipeline_parallel(f, 3, 2)
    with pytest.raises(TransformError, match="microbatches must be a positive integer"):
        pipeline_parallel(f, 2, 0)
    with pytest.raises(TransformError, match="larger than the batch size"):
        pipeline_parallel(f, 2, 5)
    with pytest.raises(TransformError, match="schedule"):
        pipeline_parallel(f, 2, 2, "zigzag")
    with pytest.raises(TransformError, match="not in the topology"):
        pipeline_parallel(f, 2, 2, devices=[0, 9], topology=ir.Topology.uniform(2))


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_models_match_sequential(name: str, schedule: str) -> None:
    f = model(name)
    assert_same(f, pipeline_parallel(f, 2, 3, schedule))


def test_gpt_live_activations() -> None:
    f = model("gpt_sgd")
    assert live_microbatches(pipeline_parallel(f, 2, 4, "gpipe"), 0) == 4
    assert live_microbatches(pipeline_parallel(f, 2, 4, "1f1b"), 0) == 2


def test_simulated_stage_zero_memory_grows_with_k_under_gpipe_only() -> None:
    """Fixed microbatch size (16 rows): GPipe keeps K activation sets on stage 0, 1F1B keeps p."""
    import ir.models
    from ir.sim import simulate

    topo = ir.Topology.uniform(2)
    peak = {}
    for k in (4, 8):
        f = ir.models.mlp(16 * k, 64, 256, 64, layers=4, training=True)
        for schedule in ("gpipe", "1f1b"):
            result = simulate(pipeline_parallel(f, 2, k, schedule), topo)
            peak[(schedule, k)] = result.peak_memory_bytes[0]
    assert all(peak[("1f1b", k)] <= peak[("gpipe", k)] for k in (4, 8))
    gpipe_growth = peak[("gpipe", 8)] - peak[("gpipe", 4)]
    one_f_one_b_growth = peak[("1f1b", 8)] - peak[("1f1b", 4)]  # only the larger input x
    assert gpipe_growth > 3 * one_f_one_b_growth


@settings(max_examples=15, deadline=None)
@given(
    batch=st.integers(1, 8),
    layers=st.integers(1, 4),
    stages=st.integers(1, 4),
    k=st.integers(1, 8),
    schedule=st.sampled_from(["gpipe", "1f1b"]),
)
def test_any_stages_and_microbatches(batch, layers, stages, k, schedule) -> None:
    f = ir.models.mlp(batch, 3, 5, 4, layers=layers, training=True, dtype=ir.DType.float64)
    if stages > layers or k > batch:
        with pytest.raises(TransformError, match=r"stages more than layers|larger than the batch"):
            pipeline_parallel(f, stages, k, schedule)
    else:
        g = pipeline_parallel(f, stages, k, schedule)
        assert_same(f, g)
        if layers >= 2:  # a one-layer MLP keeps no activation besides its output
            want = k if schedule == "gpipe" else min(stages, k)
            assert live_microbatches(g, 0) == want


@pytest.mark.parametrize(("stages", "chunks", "microbatches"), [(2, 2, 2), (2, 2, 6), (3, 2, 3)])
def test_interleaved_stages_match_sequential(stages: int, chunks: int, microbatches: int) -> None:
    f = ir.models.mlp(6, 3, 5, 4, layers=stages * chunks, training=True, dtype=ir.DType.float64)
    g = pipeline_parallel(f, stages, microbatches, "interleaved", chunks=chunks)
    assert_same(f, g)
    # layer i's forward MatMul runs on device i % stages: every device holds `chunks` layers
    layer_devices = [
        op.device for op in g.ops if op.op_type == "MatMul" and "_mb0" in op.outputs[0].name
    ]
    assert layer_devices == [i % stages for i in range(stages * chunks)]


def test_interleaved_errors() -> None:
    f = ir.models.mlp(8, 3, 5, 4, layers=4, training=True, dtype=ir.DType.float64)
    with pytest.raises(TransformError, match="multiple of 2"):
        pipeline_parallel(f, 2, 3, "interleaved", chunks=2)
    with pytest.raises(TransformError, match="needs schedule='interleaved'"):
        pipeline_parallel(f, 2, 2, "1f1b", chunks=2)
    with pytest.raises(TransformError, match="stages more than layers"):
        pipeline_parallel(f, 2, 2, "interleaved", chunks=3)


def test_recomputed_activations_stay_in_the_backward_pass() -> None:
    from ir.transforms import recompute, training

    t = training(ir.models.mlp(8, 4, 6, 5, layers=4, dtype=ir.DType.float64))
    r = recompute(t)
    g = pipeline_parallel(r, 2, 2, "1f1b")
    assert_same(r, g)
    order = [v.name for op in g.ops for v in op.outputs]
    # microbatch 0's recomputed first-layer activation comes after its loss gradient
    recomputed = [i for i, n in enumerate(order) if n == "a0_mb0"]
    assert len(recomputed) == 2 and recomputed[1] > order.index("dl_mb0")


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved"])
def test_a_resident_step_takes_each_input_on_its_stage_and_returns_weights_there(
    schedule: str,
) -> None:
    f = mlp(8, 4, 6, 5, layers=4, training=True, optimizer="adam")
    g = pipeline_parallel(f, 2, 2, schedule, chunks=2 if schedule == "interleaved" else 1)
    stages = [0, 1, 0, 1] if schedule == "interleaved" else [0, 0, 1, 1]
    device = {v.name: v.type.device for v in g.inputs}
    assert [device[f"w{i}"] for i in range(4)] == stages
    assert [device[f"m{i}"] for i in range(4)] == stages  # Adam's state lives with its weight
    assert [device[f"v{i}"] for i in range(4)] == stages
    assert device["x"] == 0 and device["z"] == 1  # the batch on the first stage, labels last
    sent = {op.inputs[0] for op in g.ops if op.op_type == "Send"}
    assert not sent & set(g.inputs)  # no per-step weight (or batch) sends
    outputs = {v.name: v.type for v in g.outputs}
    for v in g.inputs:  # step N+1 takes step N's updated weights and state as they are
        if v.name not in ("x", "z"):
            assert outputs[f"{v.name}_1"] == v.type, v.name
    assert_same(f, g)


def test_setup_then_a_resident_step_computes_the_source_program() -> None:
    f = mlp(8, 4, 6, 5, layers=4, training=True, optimizer="adam")
    g = pipeline_parallel(f, 4, 2, "1f1b")
    setup = setup_program(f, g)
    assert [v.name for v in setup.inputs] == [v.name for v in f.inputs]
    assert [v.type for v in setup.outputs] == [v.type for v in g.inputs]
    assert {op.op_type for op in setup.ops} == {"Send"}
    args = inputs_for(f, 3)
    want = ir.execute(f, args)
    got = ir.execute(g, ir.execute(setup, args))
    for w, o in zip(want, got, strict=True):
        np.testing.assert_allclose(o, w, rtol=1e-5, atol=1e-10)
    unmoved = setup_program(f, pipeline_parallel(f, 4, 2, resident=False))
    assert unmoved.ops == () and unmoved.outputs == unmoved.inputs


def test_setup_program_refuses_what_it_cannot_move() -> None:
    f = mlp(8, 4, 6, 5, layers=2, training=True)
    other = mlp(8, 4, 7, 5, layers=2, training=True)
    with pytest.raises(TransformError, match=r"a piece of shape \(4, 7\)"):
        setup_program(other, pipeline_parallel(f, 2, 2))
