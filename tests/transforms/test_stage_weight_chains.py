"""A weight read through a computation of its own, pipelined (issue 29's Gemma and ResNet).

Gemma's RMSNorm scales by ``1 + w``, an imported eval-mode BatchNorm by its weight
reshaped to a column: the scale's gradient ``sum(dy * x)`` is made from the weight's
*derived* value's partner ``x``. Where the pipeline cut falls between ``x`` (the
normalised activation, made on the earlier stage) and the scaling (on the weight's
stage), the gradient's product used to run on the earlier stage and its last reshape on
the weight's: a later stage's backward reading an earlier stage's, "the pipeline schedule
deadlocks". The chain now runs on the weight's stage (``stage_cut._weight_derived``).
Proven by execution in float64.
"""

from __future__ import annotations

import numpy as np
import pytest

import ir
from ir.transforms.stage_cut import gradient_ops

T = ir.transforms

F64 = ir.DType.float64


def scaled_norm(scale: str) -> ir.Function:
    """``MatMul -> RMS normalise -> times a scale made from weight g -> MatMul``: the scale
    is ``g + 1`` (Gemma) or ``g`` reshaped to a row (an imported batch norm's)."""
    b = ir.FunctionBuilder("scaled_norm")
    w1 = b.input("w1", ir.TensorType((4, 6), F64, 0))
    g = b.input("g", ir.TensorType((6,), F64, 0))
    w2 = b.input("w2", ir.TensorType((6, 3), F64, 0))
    x = b.input("x", ir.TensorType((8, 4), F64, 0))
    h = b.call("MatMul", x, w1, name="h")
    ms = b.call("ReduceMean", b.call("Mul", h, h), axes=(1,), keepdims=True, name="ms")
    eps = b.call("Constant", value=1e-6, dtype="float64", shape=(), device=0)
    n = b.call("Mul", h, b.call("Rsqrt", b.call("Add", ms, eps)), name="n")
    if scale == "one_plus":
        one = b.call("Constant", value=1.0, dtype="float64", shape=(), device=0)
        s = b.call("Add", g, one, name="s")
    else:
        s = b.call("Reshape", g, shape=(1, 6), name="s")
    y = b.call("Mul", n, s, name="y")
    return b.finish(b.call("MatMul", y, w2, name="z"))


def _step(scale: str) -> ir.Function:
    return T.training(ir.models.with_loss(scaled_norm(scale), kind="mse"))


def _assert_equal(g: ir.Function, t: ir.Function) -> None:
    xs = ir.random_inputs(t, 3)
    want = ir.execute(t, xs)
    got = ir.execute_step(g, xs, source=t)
    assert len(got) == len(want)
    for v, a, w in zip(t.outputs, got, want, strict=True):
        np.testing.assert_allclose(a, w, rtol=1e-12, atol=1e-14, err_msg=v.name)


@pytest.mark.parametrize("scale", ["one_plus", "row"])
def test_the_cut_falls_between_the_normalised_value_and_its_scale(scale: str) -> None:
    cut = T.pipeline_cut(_step(scale), 2)
    assert cut.stages[0].weights == ("w1",)
    assert cut.stages[1].weights == ("g", "w2")
    assert cut.stages[1].receives == ("n",)  # the normalised activation crosses


@pytest.mark.parametrize("scale", ["one_plus", "row"])
@pytest.mark.parametrize(
    "build",
    [
        lambda t: T.pipeline_parallel(t, 2, 2),
        lambda t: T.pipeline_parallel(t, 2, 4, "1f1b"),
        lambda t: T.megatron(t, 1, 1, 2, 2),
        lambda t: T.megatron(t, 2, 1, 2, 2, "1f1b"),
    ],
    ids=["gpipe", "1f1b", "megatron_pp2", "megatron_dp2_pp2"],
)
def test_a_weight_scaled_through_a_computation_pipelines(scale: str, build) -> None:
    t = _step(scale)
    _assert_equal(build(t), t)


@pytest.mark.parametrize("scale", ["one_plus", "row"])
def test_the_scales_gradient_runs_on_the_scales_stage(scale: str) -> None:
    t = _step(scale)
    stage = T.stage_assignment(t, 2)
    producer = t.producers
    sgd = next(op for op in t.ops if op.op_type == "SGDOptimizer" and op.inputs[0].name == "g")
    # the ops that make g's gradient from the received n (its product, sum, reshape)
    chain, todo = set(), [sgd.inputs[1]]
    gradients = gradient_ops(t)
    while todo:
        op = producer.get(todo.pop())
        if op is None or op not in gradients or op in chain:
            continue
        chain.add(op)
        if not any(v.name == "n" for v in op.inputs):
            todo.extend(op.inputs)
    assert any(any(v.name == "n" for v in op.inputs) for op in chain)
    assert {stage[op] for op in chain} == {1}
    assert stage[sgd] == 1
