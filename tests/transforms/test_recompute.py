"""ir.transforms.recompute: same outputs by execution, lower peak live bytes, the seed's form."""

from __future__ import annotations

import numpy as np
import pytest

import ir
import ir.models
import ir.transforms as xf
from ir.transforms import RecomputeError


def _same_outputs(f: ir.Function, g: ir.Function) -> None:
    args = ir.random_inputs(f, seed=3)
    # Adam's second moments v_* must not be negative
    args = [np.abs(a) if v.name.startswith("v_") else a for v, a in zip(f.inputs, args)]
    for a, b in zip(ir.execute(f, args), ir.execute(g, args), strict=True):
        np.testing.assert_array_equal(a, b)


def test_seed_variant_recomputes_a_before_its_backward_reader():
    t = xf.training(ir.models.mlp(8, 4, 6, 4, activation=None))
    r = xf.recompute(t)
    assert [op.op_type for op in r.ops] == [
        "MatMul",
        "MatMul",
        "Loss",
        "LossGrad",
        "MatMul",
        "MatMulGrad",
        "MatMulGrad",
        "SGDOptimizer",
        "SGDOptimizer",
    ]
    first_a, again = r.ops[0].outputs[0], r.ops[4].outputs[0]
    assert r.ops[4].inputs == r.ops[0].inputs  # MatMul(x, wA) again
    assert r.ops[5].inputs[0] is again
    assert [op for op in r.ops if first_a in op.inputs] == [r.ops[1]]  # dies in the forward
    _same_outputs(t, r)


@pytest.mark.parametrize(
    "model",
    [
        lambda: ir.models.mlp(64, 32, 128, 10, layers=4),
        lambda: ir.models.mlp(16, 8, 32, 4, layers=3, activation="gelu"),
        lambda: ir.models.gpt(batch=4, seq=16, hidden=32, heads=4, vocab=50, layers=2),
    ],
)
def test_recompute_keeps_outputs_and_lowers_peak_memory(model):
    t = xf.training(model())
    r = xf.recompute(t)
    _same_outputs(t, r)
    assert xf.peak_live_bytes(r) < xf.peak_live_bytes(t)
    # With Adam the outputs agree too (on these small models the peak is the update of
    # weights plus two moments, which recomputation does not touch).
    t = xf.training(model(), "adam")
    _same_outputs(t, xf.recompute(t))


def test_simulator_memory_agrees_that_the_peak_drops():
    t = xf.training(ir.models.gpt(batch=4, seq=16, hidden=32, heads=4, vocab=50, layers=2))
    r = xf.recompute(t)
    topology = ir.Topology.uniform(1)
    before = ir.simulate(t, topology).peak_memory_bytes[0]
    after = ir.simulate(r, topology).peak_memory_bytes[0]
    assert after < before
    assert before - after == pytest.approx(xf.peak_live_bytes(t) - xf.peak_live_bytes(r))


def test_default_choice_and_chosen_values():
    t = xf.training(ir.models.gpt(batch=2, seq=4, hidden=8, heads=2, vocab=7, layers=1))
    # the fused attention's result is replayed from q, k, v, which its gradient reads anyway
    assert [v.name for v in xf.recomputable(t)] == [
        "h0_ln1_y",
        "h0_ctx",
        "h0_ln2_y",
        "h0_gelu",
        "lnf_y",
    ]
    gpt = ir.models.gpt(batch=2, seq=4, hidden=8, heads=2, vocab=7, layers=1, attention="unfused")
    t = xf.training(gpt)
    assert [v.name for v in xf.recomputable(t)] == ["h0_ln1_y", "h0_ln2_y", "h0_gelu", "lnf_y"]
    # a chain: the probabilities need the scores, which need q and k: all replayed
    r = xf.recompute(t, ["h0_probs", "h0_scaled", "h0_masked"])
    _same_outputs(t, r)
    n_softmax = [op.op_type for op in r.ops].count("Softmax")
    assert n_softmax == 2


def test_peak_live_bytes_counts_a_chain():
    b = ir.FunctionBuilder("chain")
    x = b.input("x", ir.TensorType((4,), ir.DType.float32, 0))  # 16 bytes
    y = b.call("Relu", x)
    z = b.call("Relu", y)
    f = b.finish([z])
    assert xf.peak_live_bytes(f) == 32  # two of x, y, z at once


def test_errors_name_the_problem():
    f = ir.models.mlp(8, 4, 6, 3)
    with pytest.raises(RecomputeError, match="no backward pass"):
        xf.recompute(f)
    t = xf.training(f)
    with pytest.raises(RecomputeError, match="no forward value named 'nope'"):
        xf.recompute(t, ["nope"])
    with pytest.raises(RecomputeError, match="'y' is a program output"):
        xf.recompute(t, ["y"])
    g = xf.training(ir.models.gpt(batch=2, seq=4, hidden=8, heads=2, vocab=7, layers=1))
    with pytest.raises(RecomputeError, match=r"does not read 'h0_q', nor"):
        xf.recompute(g, ["h0_q"])
    _same_outputs(g, xf.recompute(g, ["h0_q", "h0_q_r", "h0_q_h"]))  # a chain the backward reads


def test_recompute_inside_the_pmap_body_of_a_data_parallel_program():
    t = xf.training(ir.models.mlp(256, 32, 128, 10, layers=4))
    g = xf.data_parallel(t, 2)
    r = xf.recompute(g)
    _same_outputs(g, r)
    assert xf.peak_live_bytes(r) < xf.peak_live_bytes(g)
    topology = ir.Topology.uniform(2)
    before, after = ir.simulate(g, topology), ir.simulate(r, topology)
    assert all(after.peak_memory_bytes[d] < before.peak_memory_bytes[d] for d in (0, 1))


@pytest.mark.parametrize("parallel", ["data_parallel", "horizontal_parallel"])
def test_recompute_then_parallelize_matches(parallel):
    t = xf.training(ir.models.mlp(16, 8, 32, 4, layers=3))
    g = getattr(xf, parallel)(xf.recompute(t), 2)
    args = ir.random_inputs(t, seed=1)
    got = ir.collect(g, ir.execute(g, ir.distribute(g, args, source=t)), rtol=1e-6)
    for a, b in zip(got, ir.execute(t, args), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_recompute_keeps_a_steady_state_steps_layouts():
    g = xf.data_parallel(xf.training(ir.models.mlp(8, 4, 6, 4, layers=3)), 2)
    r = xf.recompute(g)
    assert r.input_layouts == g.input_layouts and r.output_layouts == g.output_layouts
