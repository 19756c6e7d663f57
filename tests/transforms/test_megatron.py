"""3D parallelism as Megatron-LM arranges it, proven by executing the steady-state step."""

from __future__ import annotations

import numpy as np
import pytest

import ir
from ir import models, transforms
from ir.transforms import TransformError, megatron, parallelize, unroll_pmap

F64 = ir.DType.float64


def _run(t: ir.Function, g: ir.Function, seed: int = 0) -> None:
    """``g`` given ``t``'s inputs laid out computes ``t``'s outputs (updated weights, loss)."""
    # Adam's second moments are non-negative (random ones would make NaN updates)
    xs = [
        np.abs(x) if v.name.startswith("v_") else x
        for v, x in zip(t.inputs, ir.random_inputs(t, seed))
    ]
    want = ir.execute(t, xs)
    assert all(np.isfinite(w).all() for w in want)
    got = ir.collect(g, ir.execute(g, ir.distribute(g, xs, source=t)), rtol=1e-9)
    assert len(got) == len(want)
    for v, w, o in zip(t.outputs, want, got):
        np.testing.assert_allclose(o, w, rtol=1e-7, atol=1e-10, err_msg=v.name)


def _computing_devices(g: ir.Function) -> set[int]:
    result = ir.simulate(g, ir.Topology.preset("a100-hgx", 16))
    return {e.device for e in result.events if e.stream == "compute" and e.dur_s > 0}


MLP16 = models.mlp(64, 16, 16, 4, layers=16, training=True, dtype=F64)
POW2_16 = [
    (dp, tp, 16 // (dp * tp))
    for dp in (1, 2, 4, 8, 16)
    for tp in (1, 2, 4, 8, 16)
    if 16 % (dp * tp) == 0
]


@pytest.mark.parametrize(("dp", "tp", "pp"), POW2_16, ids=lambda x: str(x))
def test_every_power_of_two_split_of_16_devices_computes_on_all_and_equals_sequential(
    dp, tp, pp
) -> None:
    m = 4 if pp > 1 and 64 % (dp * 4) == 0 else 1
    g = megatron(MLP16, dp, tp, pp, m)
    _run(MLP16, g)
    assert _computing_devices(g) == set(range(16))


def test_gpt_3d_with_each_schedule_and_adam() -> None:
    f = models.gpt(batch=8, seq=8, hidden=16, heads=4, vocab=32, layers=4, dtype=F64)
    for opt in ("sgd", "adam"):
        t = transforms.training(f, optimizer=opt)
        _run(t, megatron(t, 2, 2, 2, 2, "1f1b"))
    t = transforms.training(f)
    _run(t, megatron(t, 1, 2, 2, 4, "gpipe"))
    _run(t, megatron(t, 2, 1, 2, 4, "interleaved", chunks=2))


def test_two_steps_in_a_row_take_the_outputs_of_the_first() -> None:
    f = models.mlp(16, 8, 8, 4, layers=4, dtype=F64)
    t = transforms.training(f)
    g = megatron(t, 2, 2, 2, 2)
    xs = ir.random_inputs(t, 3)
    # output i of an optimizer step is the update of weight ``updates[i]``
    producers = t.producers
    updates = {
        i: producers[v].inputs[0].name
        for i, v in enumerate(t.outputs)
        if v in producers and producers[v].op_type == "SGDOptimizer"
    }
    assert updates
    names = [v.name for v in t.inputs]
    first = ir.execute(t, xs)
    xs2 = list(xs)
    for i, w in updates.items():
        xs2[names.index(w)] = first[i]
    second = ir.execute(t, xs2)
    # the parallel step twice, the second taking the first's output shards as they are
    step_in = ir.distribute(g, xs, source=t)
    out1 = ir.execute(g, step_in)
    step2 = list(step_in)
    step_names = [v.name for v in g.inputs]
    for i, w in updates.items():
        step2[step_names.index(w)] = out1[i]
    got = ir.collect(g, ir.execute(g, step2))
    for w, o in zip(second, got):
        np.testing.assert_allclose(o, w, rtol=1e-7, atol=1e-10)


def test_op_count_grows_with_layers_and_microbatches_not_devices() -> None:
    def count(layers: int, dp: int, tp: int, pp: int, m: int) -> int:
        f = models.mlp(64, 16, 16, 4, layers=layers, training=True, dtype=F64)
        return megatron(f, dp, tp, pp, m).num_ops()

    assert count(8, 2, 2, 2, 4) == count(8, 4, 4, 2, 4) == count(8, 8, 2, 2, 4)
    assert count(16, 2, 2, 2, 4) > count(8, 2, 2, 2, 4)
    assert count(8, 2, 2, 2, 8) > count(8, 2, 2, 2, 4)


def test_steady_state_step_moves_no_weights_and_overlaps_the_gradient_all_reduce() -> None:
    f = models.mlp(512, 1024, 1024, 16, layers=8, training=True)
    g = megatron(f, 8, 1, 1, 1)
    kinds = [op.op_type for op in g.ops]
    assert not {"Broadcast", "Scatter", "Send", "SendEach"} & set(kinds)
    grouped = [op for op in g.ops if op.op_type == "AllReduce"]
    assert len(grouped) == 8  # one all-reduce per weight gradient
    result = ir.simulate(g, ir.Topology.preset("a100-hgx", 8))
    comm = [e for e in result.events if e.device == 0 and e.stream == "communication"]
    backward_end = max(
        e.start_s + e.dur_s for e in result.events if e.device == 0 and e.stream == "compute"
    )
    # the first gradient's all-reduce starts while the backward pass still computes
    assert min(e.start_s for e in comm) < backward_end - 0.25 * result.step_time_s


def test_tensor_and_data_groups_follow_megatron_rank_order() -> None:
    f = models.mlp(16, 8, 8, 4, layers=2, training=True, dtype=F64)
    g = megatron(f, 2, 2, 1, 1)
    groups = {
        tuple(map(tuple, op.attributes["groups"]))
        for op in g.ops
        if op.op_type == "AllReduce" and op.attributes["groups"] is not None
    }
    assert ((0, 1), (2, 3)) in groups  # tensor-parallel peers are adjacent
    assert ((0, 2), (1, 3)) in groups  # data-parallel replicas of the same shard


def test_unrolled_program_equals_the_logical_one() -> None:
    f = models.mlp(16, 8, 8, 4, layers=4, training=True, dtype=F64)
    g = megatron(f, 2, 2, 2, 2)
    u = unroll_pmap(g)
    xs = ir.distribute(g, ir.random_inputs(f), source=f)
    for a, b in zip(ir.execute(g, xs), ir.execute(u, xs)):
        for x, y in zip(np.asarray(a, dtype=object).ravel(), np.asarray(b, dtype=object).ravel()):
            np.testing.assert_allclose(np.asarray(x, float), np.asarray(y, float))


def test_parallelize_is_the_3d_step() -> None:
    f = models.mlp(16, 8, 8, 4, layers=4, training=True, dtype=F64)
    g = parallelize(f, dp=2, hp=2, pp=2, microbatches=2)
    assert g.is_equivalent(megatron(f, 2, 2, 2, 2))
    _run(f, g)


def test_degrees_that_cannot_be_honoured_name_their_level() -> None:
    f = models.mlp(16, 8, 8, 4, layers=2, training=True, dtype=F64)
    with pytest.raises(TransformError, match="data level"):
        megatron(f, 3, 1, 1, 1)
    with pytest.raises(TransformError, match="data level"):
        megatron(f, 2, 1, 2, 3)
    with pytest.raises(TransformError, match="stages more than layers"):
        megatron(f, 1, 1, 4, 4)
    with pytest.raises(TransformError, match="tensor level"):
        megatron(f, 1, 3, 1, 1)
    with pytest.raises(TransformError, match="positive integer"):
        megatron(f, 0)
    with pytest.raises(TransformError, match="interleaved"):
        megatron(f, 1, 1, 2, 3, "interleaved", chunks=1)
    with pytest.raises(TransformError, match="topology has only 2 devices"):
        megatron(f, 2, 2, 1, 1, topology=ir.Topology.uniform(2))


@pytest.mark.parametrize(("layers", "pp"), [(2, 8), (4, 3), (4, 5), (4, 8), (8, 8), (16, 8)])
def test_a_gpt_pipeline_cuts_between_sublayers_and_runs_any_degree(layers, pp) -> None:
    """The cost cut falls where one activation crosses (the residual stream), never inside
    an attention block: every degree up to two stages per layer builds and executes."""
    f = models.gpt(batch=pp, seq=4, hidden=8, heads=2, vocab=16, layers=layers, dtype=F64)
    t = transforms.training(f)
    g = megatron(t, 1, 1, pp, pp, "1f1b")
    stage = transforms.stage_assignment(t, pp)
    by_layer: dict[str, set[int]] = {}
    for op in t.ops:
        for v in op.inputs:
            if v.name.startswith("h") and "_attn_w" in v.name:
                by_layer.setdefault(v.name.split("_")[0], set()).add(stage[op])
    assert all(len(stages) == 1 for stages in by_layer.values()), by_layer
    if layers <= 4:
        _run(t, g)


def test_a_pipeline_of_layers_recomputed_whole_runs_each_replay_on_its_layers_stage() -> None:
    """Per-layer checkpointing (every activation inside a block replayed from the block's
    input): a replay runs where its forward op ran, so no weight is read by two stages."""
    f = models.gpt(batch=4, seq=4, hidden=8, heads=2, vocab=16, layers=2, dtype=F64)
    t = transforms.training(f, optimizer="adam")
    r = transforms.recompute(t, models.gpt_layer_activations(t))
    _run(r, megatron(r, 1, 2, 2, 4))
    _run(r, megatron(r, 2, 1, 2, 2, "gpipe"))


def test_each_microbatch_repeats_the_first_ones_typed_ops() -> None:
    # A stage runs the same pmaps, collectives and sends for every microbatch: the builder
    # types each once (add_like), and a full re-verification agrees with every reuse.
    t = transforms.training(models.mlp(32, 16, 16, 4, layers=4, dtype=F64))
    g = megatron(t, 2, 2, 2, 4)
    ir.verify(g)
    by_body: dict[ir.Function, list[ir.Op]] = {}
    for op in g.ops:
        if op.op_type == "Pmap":
            by_body.setdefault(op.subfunctions[0], []).append(op)
    repeated = [ops for ops in by_body.values() if len(ops) > 1]
    assert repeated and max(len(ops) for ops in repeated) >= 4
    for first, *others in repeated:
        for op in others:
            assert op.attributes is first.attributes
            assert [v.type for v in op.outputs] == [v.type for v in first.outputs]
            assert all(v.type is u.type for v, u in zip(op.outputs, first.outputs))
    _run(t, g)
