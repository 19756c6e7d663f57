"""Mixture-of-experts routing ops and the MoE GPT: equal to a loop-by-loop reference,
gradients equal to central differences, capacity and priority as GShard defines them."""

from __future__ import annotations

import math

import numpy as np
import pytest

import ir
from ir import models
from ir.models_moe import MoEConfig
from ir.ops.moe import moe_slots
from tests.transforms._gradcheck import check_gradients, float64_inputs

F64 = ir.DType.float64


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def _reference_moe(x, router, w1, w2, k, capacity):
    """Token by token: softmax router, top-k, GShard's priority (all first choices, then
    all second ones) with ``capacity`` places per expert and sequence, renormalised gates."""
    b, s, _ = x.shape
    e = router.shape[1]
    logits = x @ router
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    out = np.zeros_like(x)
    for row in range(b):
        chosen = [np.argsort(-probs[row, pos], kind="stable")[:k] for pos in range(s)]
        count = [0] * e
        kept = np.zeros((s, k), dtype=bool)
        for j in range(k):
            for pos in range(s):
                expert = chosen[pos][j]
                if count[expert] < capacity:
                    count[expert] += 1
                    kept[pos, j] = True
        for pos in range(s):
            gates = probs[row, pos, chosen[pos]]
            if k > 1:
                gates = gates / gates.sum()
            for j, expert in enumerate(chosen[pos]):
                if kept[pos, j]:
                    h = _gelu(x[row, pos] @ w1[expert]) @ w2[expert]
                    out[row, pos] += gates[j] * h
    return out, probs


@pytest.mark.parametrize(("experts", "k", "factor"), [(4, 2, 1.0), (4, 1, 1.25), (3, 3, 0.5)])
def test_the_moe_layer_equals_a_token_by_token_reference(experts, k, factor) -> None:
    b, s, h, f = 3, 6, 8, 12
    config = MoEConfig(experts, k, factor, expert_hidden=f, aux_loss=0.0)
    builder = ir.FunctionBuilder("moe")
    shapes = config.weight_shapes("h0", h, 4 * h)
    w = {name: builder.input(name, ir.TensorType(shape, F64)) for name, shape in shapes.items()}
    x = builder.input("x", ir.TensorType((b, s, h), F64))
    from ir.models_moe import moe_mlp

    out, aux = moe_mlp(builder, w, x, "h0", config)
    assert aux is None
    fn = builder.finish([out])
    rng = np.random.default_rng(0)
    args = {v.name: rng.standard_normal(v.type.shape) for v in fn.inputs}
    (got,) = ir.execute(fn, args)
    want, _ = _reference_moe(
        args["x"],
        args["h0_moe_router"],
        args["h0_moe_w1"],
        args["h0_moe_w2"],
        k,
        config.capacity(s),
    )
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    assert config.capacity(s) == math.ceil(factor * s * k / experts)


def test_slots_give_first_choices_priority_and_drop_past_capacity() -> None:
    # one sequence of 4 tokens, 2 choices each, 2 experts, 2 places per expert
    expert = np.array([[[0, 1], [0, 1], [0, 1], [1, 0]]])
    slots = moe_slots(expert, experts=2, capacity=2)
    # first choices: tokens 0, 1 take expert 0's places; token 2's is full; token 3 takes
    # expert 1's first place; second choices: token 0 takes expert 1's last, others drop
    assert slots.tolist() == [[[0, 3], [1, -1], [-1, -1], [2, -1]]]


def test_dispatch_then_combine_returns_each_kept_token_once_per_choice() -> None:
    rng = np.random.default_rng(1)
    b = ir.FunctionBuilder("round_trip")
    x = b.input("x", ir.TensorType((2, 5, 3), F64))
    expert = b.input("expert", ir.TensorType((2, 5, 2), ir.DType.int64))
    slot = b.call("MoESlots", expert, experts=3, capacity=2)
    buffer = b.call("MoEDispatch", x, slot, experts=3, capacity=2)
    y = b.call("MoECombine", buffer, slot)
    fn = b.finish([y, slot])
    xs = rng.standard_normal((2, 5, 3))
    choices = np.stack([rng.permutation(3)[:2] for _ in range(10)]).reshape(2, 5, 2)
    got, slots = ir.execute(fn, [xs, choices])
    kept = (slots >= 0).sum(-1)
    np.testing.assert_allclose(got, xs * kept[..., None])
    assert fn.outputs[0].type.shape == (2, 5, 3)


@pytest.mark.parametrize("shared", [0, 1])
def test_moe_gpt_gradients_equal_central_differences(shared) -> None:
    f = models.gpt(
        2,
        4,
        8,
        2,
        11,
        1,
        dtype=F64,
        experts=3,
        top_k=2,
        capacity_factor=2.0,
        expert_hidden=6,
        shared_experts=shared,
        aux_loss=0.1,
    )
    args = float64_inputs(f, seed=3, classes=11)
    checked = check_gradients(f, args, elementwise=False)
    assert "h0_moe_router" in checked and "h0_moe_w1" in checked


def test_moe_gpt_weights_and_loss() -> None:
    f = models.gpt(
        2,
        8,
        16,
        4,
        32,
        3,
        dtype=F64,
        experts=4,
        top_k=2,
        dense_layers=1,
        shared_experts=1,
        expert_hidden=8,
    )
    names = {v.name: v.type.shape for v in f.inputs}
    assert "h0_mlp_w1" in names and "h0_moe_router" not in names  # a dense first layer
    assert names["h1_moe_w1"] == (4, 16, 8) and names["h1_moe_w2"] == (4, 8, 16)
    assert names["h2_moe_shared_w1"] == (16, 8) and names["h2_moe_router"] == (16, 4)
    ops = [op.op_type for op in f.ops]
    assert ops.count("MoEDispatch") == 2 and ops.count("MoEAuxLoss") == 2
    plain = models.gpt(
        2,
        8,
        16,
        4,
        32,
        3,
        dtype=F64,
        experts=4,
        top_k=2,
        dense_layers=1,
        shared_experts=1,
        expert_hidden=8,
        aux_loss=0.0,
    )
    args = ir.random_inputs(f, 0)
    loss, lm = ir.execute(f, args)[-1], ir.execute(plain, args)[-1]
    assert loss > lm  # the balance loss is positive and added


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"experts": 4, "top_k": 5}, "top_k=5 is more than the 4 experts"),
        ({"experts": -1}, "experts must be an integer >= 0"),
        ({"experts": 4, "capacity_factor": 0}, "capacity_factor must be > 0"),
        ({"experts": 4, "shared_experts": 1.5}, "shared_experts must be an integer"),
    ],
)
def test_bad_moe_options_are_model_errors(options, match) -> None:
    with pytest.raises(models.ModelError, match=match):
        models.gpt(2, 8, 16, 4, 32, 1, **options)
