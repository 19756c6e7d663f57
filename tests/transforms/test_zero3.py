"""ZeRO stage 3 (fully sharded data parallelism) in the 3D step: executed equal to the
sequential step, its state split over the replicas, its traffic and memory as the ZeRO
paper's closed forms say."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import ir
from ir import models, transforms
from ir.sim.traffic import traffic_bytes
from ir.transforms import megatron

F64 = ir.DType.float64
MLP = models.mlp(16, 8, 8, 4, layers=4, dtype=F64)
GPT = models.gpt(batch=4, seq=8, hidden=16, heads=4, vocab=32, layers=2, dtype=F64)
MOE = models.gpt(4, 8, 16, 4, 32, 2, dtype=F64, experts=4, top_k=2, shared_experts=1)


def _inputs(t: ir.Function, seed: int = 0) -> list:
    return [
        np.abs(x) if v.name.startswith("v_") else x
        for v, x in zip(t.inputs, ir.random_inputs(t, seed))
    ]


def _run(t: ir.Function, g: ir.Function, seed: int = 0) -> None:
    xs = _inputs(t, seed)
    want = ir.execute(t, xs)
    got = ir.collect(g, ir.execute(g, ir.distribute(g, xs, source=t)), rtol=1e-9)
    for v, w, o in zip(t.outputs, want, got):
        np.testing.assert_allclose(o, w, rtol=1e-7, atol=1e-10, err_msg=v.name)


@pytest.mark.parametrize("model", [MLP, GPT, MOE], ids=["mlp", "gpt", "moe"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize(("dp", "tp", "pp", "m"), [(2, 1, 1, 1), (2, 2, 1, 2), (2, 2, 2, 2)])
def test_zero3_steps_equal_the_sequential_step(model, optimizer, dp, tp, pp, m) -> None:
    t = transforms.training(model, optimizer=optimizer)
    g = megatron(t, dp, tp, pp, m, zero=3)
    _run(t, g)
    ops = Counter(op.op_type for op in g.ops)
    # no replica rebuilds a whole weight after the update: every gather serves a task
    assert ops["AllGather"] >= 2 * m and ops["ReduceScatter"] >= m


def test_zero3_splits_the_weights_and_the_next_step_takes_them_as_they_are() -> None:
    t = transforms.training(MLP, optimizer="adam")
    g = megatron(t, 4, 1, 1, 2, zero=3)
    layouts = dict(zip((v.name for v in g.inputs), g.input_layouts))
    out_layouts = dict(zip((v.name for v in g.outputs), g.output_layouts))
    for name in ("wA", "wB", "wC", "wD"):
        assert layouts[name][0].startswith("S(") and layouts[name][0].endswith("@4")
        assert layouts[f"m_{name}"] == layouts[f"v_{name}"] == layouts[name]
        assert out_layouts[f"{name}1"] == layouts[name]
    # two steps in a row: the second reads the first's outputs where they are
    xs = _inputs(t, 1)
    updated = {
        op.inputs[j].name: op.outputs[i]
        for op in t.ops
        if op.op_type == "Adam"
        for i, j in enumerate((0, 2, 3))
    }
    out_index = {v: i for i, v in enumerate(t.outputs)}
    first = ir.execute(t, xs)
    again = [
        first[out_index[updated[v.name]]] if v.name in updated else x for v, x in zip(t.inputs, xs)
    ]
    want = ir.execute(t, again)
    step = dict(zip((v.name for v in g.outputs), ir.execute(g, ir.distribute(g, xs, source=t))))
    fed = [
        step[updated[v.name].name] if v.name in updated else x
        for v, x in zip(g.inputs, ir.distribute(g, again, source=t))
    ]
    got = ir.collect(g, ir.execute(g, fed), rtol=1e-9)
    for v, w, o in zip(t.outputs, want, got):
        np.testing.assert_allclose(o, w, rtol=1e-7, atol=1e-10, err_msg=v.name)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_zero3_moves_one_and_a_half_times_data_parallelism(n) -> None:
    """Rajbhandari et al. 2020, section 7.2.2: data parallelism's all-reduce moves 2 Psi
    per rank, ZeRO-3 an all-gather in the forward, one in the backward and a
    reduce-scatter: 3 Psi, 1.5x (each times (n - 1) / n of the ring)."""
    f = models.mlp(8 * n, 64, 64, 64, layers=4)
    t = transforms.training(f, optimizer="adam")
    psi = sum(v.type.size_bytes for v in t.inputs if v.name in ("wA", "wB", "wC", "wD"))
    ring = (n - 1) / n
    dp = traffic_bytes(megatron(t, n))
    z3 = traffic_bytes(megatron(t, n, zero=3))
    assert set(dp) == {"allreduce"} and set(z3) == {"allgather", "reducescatter"}
    for d in range(n):
        assert dp["allreduce"][d] == pytest.approx(2 * psi * ring)
        assert z3["allgather"][d] == pytest.approx(2 * psi * ring)
        assert z3["reducescatter"][d] == pytest.approx(psi * ring)
        total = z3["allgather"][d] + z3["reducescatter"][d]
        assert total / dp["allreduce"][d] == pytest.approx(1.5)


def test_zero3_state_is_16_psi_over_n_and_gathers_one_unit_at_a_time() -> None:
    """Mixed-precision Adam (bf16 weights and gradients, fp32 master weights and moments):
    (2 + 2 + 12) Psi / N bytes per device (ZeRO paper, Figure 1), and the memory curve
    of the forward and backward passes holds about two gathered layers whatever the
    depth (FSDP: the unit computing and the one prefetched), and one layer's gradient
    before its reduce-scatter."""
    n, width = 8, 1024
    layer_bytes = width * width * 2
    transient = {}
    for layers in (8, 16):
        f = models.mlp(8, width, width, width, layers=layers, dtype="bfloat16")
        t = transforms.training(f, optimizer="adam", master_weights=True)
        g = megatron(t, n, zero=3)
        psi = layers * width * width  # parameters
        state = sum(v.type.elements[0].size_bytes for v in g.inputs if v.name not in "xz")
        assert state == (2 + 12) * psi / n
        scattered = [op for op in g.ops if op.op_type == "ReduceScatter"]
        grads = sum(op.outputs[0].type.elements[0].size_bytes for op in scattered)
        assert grads == 2 * psi / n
        result = ir.simulate(g, ir.Topology.preset("h100-hgx", n))
        update = min(e.start_s for e in result.events_on(0) if e.op.op_type == "MasterAdam")
        times, live = result.memory_timeline(0)
        during = live[times < update]
        transient[layers] = (during.max() - state - grads) / layer_bytes
        assert 1 <= transient[layers] <= 3, transient  # two gathered, one gradient
    assert transient[16] == pytest.approx(transient[8], abs=0.25)  # not the depth


def test_zero3_on_one_replica_is_the_plain_step() -> None:
    t = transforms.training(MLP, optimizer="adam")
    assert ir.format(megatron(t, 1, 2, 1, 1, zero=3)) == ir.format(megatron(t, 1, 2, 1, 1))
