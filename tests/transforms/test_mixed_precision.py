"""The optimizer in mixed precision (float16/bfloat16 weights and gradients, float32 master
weights and Adam moments), as Megatron-LM trains: 2 + 2 + 12 = 16 bytes a parameter, the
12 split over the data-parallel replicas by ZeRO-1 (Megatron-LM's distributed optimizer).
Executed equal to the sequential step; the bytes read from the step's inputs and from the
simulator's memory curve."""

from __future__ import annotations

import numpy as np
import pytest

import ir
from ir import models, transforms
from ir.transforms import AutodiffError, TransformError, megatron
from ir.types import TupleType


def _gpt(dtype: str) -> ir.Function:
    return models.gpt(batch=8, seq=8, hidden=16, heads=4, vocab=32, layers=2, dtype=dtype)


def _inputs(t: ir.Function) -> list:
    return [
        np.abs(x) if v.name.startswith("v_") else x for v, x in zip(t.inputs, ir.random_inputs(t))
    ]


def _leaves(t: ir.Type) -> list[ir.TensorType]:
    return [x for e in t.elements for x in _leaves(e)] if isinstance(t, TupleType) else [t]


def _params(t: ir.Function) -> list[ir.Value]:
    return [op.inputs[0] for op in t.ops if ir.get_op(op.op_type).extra.get("optimizer")]


def test_the_step_keeps_float32_masters_and_moments_of_half_precision_weights() -> None:
    t = transforms.training(_gpt("bfloat16"), optimizer="adam", master_weights=True)
    kinds = {op.op_type for op in t.ops if ir.get_op(op.op_type).extra.get("optimizer")}
    assert kinds == {"MasterAdam"}
    by_name = {v.name: v for v in t.inputs}
    assert by_name["wte"].type.dtype == ir.DType.bfloat16
    for state in ("master_wte", "m_wte", "v_wte"):
        assert by_name[state].type.dtype == ir.DType.float32
    names = [v.name for v in t.outputs]
    assert names[names.index("wte1") + len(_params(t))] == "master_wte1"
    # 2 bytes of weight, 12 of float32 state, 2 of gradient: 16 a parameter
    n = sum(p.type.num_elements for p in _params(t))
    state = sum(v.type.size_bytes for v in t.inputs if v.name.split("_")[0] in ("master", "m", "v"))
    assert sum(p.type.size_bytes for p in _params(t)) == 2 * n and state == 12 * n
    grads = [op.inputs[1] for op in t.ops if ir.get_op(op.op_type).extra.get("optimizer")]
    assert sum(g.type.size_bytes for g in grads) == 2 * n


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize(
    ("args", "options"),
    [
        ((1, 1, 1, 1), {}),
        ((2, 2, 2, 2), {}),
        ((2, 2, 1, 2), {"zero": 1}),
        ((2, 1, 1, 2), {"zero": 2}),
    ],
    ids=str,
)
def test_mixed_precision_steps_equal_the_sequential_step(optimizer, args, options) -> None:
    # float32 weights with float64 masters: the same arithmetic, checked to float32's digits
    t = transforms.training(_gpt("float32"), optimizer, master_weights=True, master_dtype="float64")
    g = megatron(t, *args, **options)
    xs = _inputs(t)
    got = ir.collect(g, ir.execute(g, ir.distribute(g, xs, source=t)), rtol=1e-9)
    for v, w, o in zip(t.outputs, ir.execute(t, xs), got):
        np.testing.assert_allclose(o, w, rtol=1e-5, atol=1e-5, err_msg=v.name)


def test_a_bfloat16_step_updates_its_masters_like_the_sequential_one() -> None:
    t = transforms.training(_gpt("bfloat16"), optimizer="adam", master_weights=True)
    g = megatron(t, 2, 2, 1, 2, zero=1)
    xs = _inputs(t)
    got = ir.collect(g, ir.execute(g, ir.distribute(g, xs, source=t)), rtol=1e-2)
    for v, w, o in zip(t.outputs, ir.execute(t, xs), got):
        if v.name.startswith("master_") or v.name in {p.name + "1" for p in _params(t)}:
            # bfloat16 gradients summed in another order move a master by ~lr * 1e-2
            np.testing.assert_allclose(o, w, rtol=1e-4, atol=1e-4, err_msg=v.name)


@pytest.mark.parametrize(("dp", "zero"), [(1, 0), (4, 0), (4, 1), (4, 2)])
def test_a_replica_holds_2_bytes_of_weight_and_12_over_dp_of_state_a_parameter(dp, zero) -> None:
    f = models.mlp(64, 64, 64, 8, layers=4, dtype="bfloat16")
    t = transforms.training(f, optimizer="adam", master_weights=True)
    g = megatron(t, dp, 1, 1, 2, zero=zero)
    n = sum(p.type.num_elements for p in _params(t))
    on_zero = {
        v.name: sum(x.size_bytes for x in _leaves(v.type) if x.device == 0) for v in g.inputs
    }
    weights = sum(on_zero[p.name] for p in _params(t))
    state = sum(b for name, b in on_zero.items() if name.split("_")[0] in ("master", "m", "v"))
    assert weights == 2 * n
    assert state == 12 * n // (dp if zero else 1)

    # the simulator's memory curve ends with the step's inputs and outputs (the state and
    # its update): ZeRO takes 12 (1 - 1/dp) bytes a parameter off each of them
    def end_bytes(step: ir.Function) -> float:
        return ir.simulate(step, ir.Topology.preset("a100-hgx", dp)).memory_timeline(0)[1][-1]

    saved = end_bytes(megatron(t, dp, 1, 1, 2)) - end_bytes(g)
    assert saved == (2 * (12 * n - 12 * n // dp) if zero else 0)


def test_distributed_optimizer_is_zero_stage_1() -> None:
    t = transforms.training(_gpt("bfloat16"), optimizer="adam", master_weights=True)
    assert ir.format(megatron(t, 2, 1, 1, 2, distributed_optimizer=True)) == ir.format(
        megatron(t, 2, 1, 1, 2, zero=1)
    )
    with pytest.raises(TransformError, match=r"distributed optimizer.*zero=2"):
        megatron(t, 2, 1, 1, 2, distributed_optimizer=True, zero=2)


def test_master_weights_need_narrower_weights() -> None:
    with pytest.raises(AutodiffError, match="build the model in bfloat16 or float16"):
        transforms.training(_gpt("float32"), "adam", master_weights=True)
    with pytest.raises(AutodiffError, match="master_dtype must be a float dtype name"):
        transforms.training(_gpt("bfloat16"), "adam", master_weights=True, master_dtype="f32")
