"""Dropout (ir/ops/dropout.py): a fair mask, and one that every transform of a program draws
exactly as the sequential program does (data, tensor, pipeline, recomputation, torch)."""

from __future__ import annotations

import numpy as np
import pytest

import ir
from ir import DType, FunctionBuilder, TensorType, transforms
from ir.ops.dropout import keep_mask


def mlp_with_dropout(batch=8, features=6, hidden=8, classes=4, p=0.3, dtype=DType.float64):
    b = FunctionBuilder("mlp_dropout")
    w1 = b.input("w1", TensorType((features, hidden), dtype, 0))
    w2 = b.input("w2", TensorType((hidden, classes), dtype, 0))
    x = b.input("x", TensorType((batch, features), dtype, 0))
    z = b.input("z", TensorType((batch,), DType.int64, 0))
    a = b.call("MatMul", x, w1, name="a")
    h, _ = b.call("Dropout", b.call("Gelu", a, name="g"), p=p, seed=11, name=["h", "h_mask"])
    y = b.call("MatMul", h, w2, name="y")
    return b.finish([y, b.call("Loss", y, z, name="l")])


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_the_mask_keeps_one_minus_p_and_preserves_the_mean(p):
    x = np.random.default_rng(0).standard_normal(2_000_000)
    keep = keep_mask(x, p, seed=3)
    assert abs(keep.mean() - (1 - p)) < 0.002
    b = FunctionBuilder("d")
    v = b.input("x", TensorType(x.shape, DType.float64, 0))
    y, _ = b.call("Dropout", v, p=p, seed=3)
    (out,) = ir.execute(b.finish([y]), [x])
    assert abs(out.mean() - x.mean()) < 0.01
    assert np.array_equal(out != 0, keep)


def test_different_seeds_draw_different_masks():
    x = np.random.default_rng(1).standard_normal(10_000)
    a, c = keep_mask(x, 0.5, 1), keep_mask(x, 0.5, 2)
    assert 0.4 < (a != c).mean() < 0.6


def _equal_to_sequential(g, t):
    xs = ir.random_inputs(t)
    want = ir.execute(t, xs)
    got = ir.execute_step(g, xs, source=t) if hasattr(g, "input_layouts") else ir.execute(g, xs)
    for a, b in zip(want, got):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize(
    "make",
    [
        lambda t: transforms.data_parallel(t, 2),
        lambda t: transforms.horizontal_parallel(t, 2),
        lambda t: transforms.megatron(t, 2, 2),
        lambda t: transforms.megatron(t, 1, 1, 2, 4),
        lambda t: transforms.gradient_accumulation(t, 4),
    ],
    ids=["dp2", "hp2", "dp2xtp2", "pp2", "accumulate4"],
)
def test_transformed_training_steps_with_dropout_execute_equal(make):
    t = transforms.training(mlp_with_dropout(), "sgd")
    _equal_to_sequential(make(t), t)


def test_recomputed_dropout_draws_the_same_mask():
    t = transforms.training(mlp_with_dropout(), "sgd")
    r = transforms.recompute(t, [t.value("h"), t.value("h_mask"), t.value("g"), t.value("a")])
    xs = ir.random_inputs(t)
    for a, b in zip(ir.execute(t, xs), ir.execute(r, xs)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
def test_the_torch_kernel_draws_the_numpy_mask_bit_for_bit(dtype):
    torch = pytest.importorskip("torch")
    from ir.backends.torch_kernels import TORCH_KERNELS

    x = np.random.default_rng(2).standard_normal((64, 33)).astype(dtype)
    y, keep = TORCH_KERNELS["Dropout"]([torch.from_numpy(x)], {"p": 0.2, "seed": 9})
    assert np.array_equal(keep.numpy(), keep_mask(x, 0.2, 9))
    want = ir.get_op("Dropout").kernel([x], {"p": 0.2, "seed": 9})[0]
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-3)


def test_dropout_costs_one_fused_pass_and_keeps_a_one_byte_mask():
    t = transforms.training(mlp_with_dropout(batch=64, hidden=128, dtype=DType.float16), "sgd")
    (mask,) = [v for op in t.ops if op.op_type == "Dropout" for v in op.outputs[1:]]
    assert mask.type.dtype == DType.bool and mask.type.size_bytes == 64 * 128
    cost = ir.registry.ops_cost([op for op in t.ops if op.op_type == "Dropout"])
    assert cost.bytes_read == 64 * 128 * 2 and cost.bytes_written == 64 * 128 * 3


def test_bad_dropout_probabilities_are_refused_where_they_are_written():
    b = FunctionBuilder("d")
    x = b.input("x", TensorType((4,), DType.float32, 0))
    with pytest.raises(ir.DistIRError, match="p"):
        b.call("Dropout", x, p=1.0)
    ints = b.input("i", TensorType((4,), DType.int64, 0))
    with pytest.raises(ir.DistIRError, match="floating-point"):
        b.call("Dropout", ints, p=0.1)


@pytest.mark.parametrize("degrees", [(1, 2, 1, 1), (2, 2, 2, 2), (1, 4, 1, 1)])
def test_a_gpt_with_megatrons_dropouts_executes_equal_under_tensor_and_pipeline_parallelism(
    degrees,
):
    f = ir.models.gpt(
        4,
        16,
        32,
        4,
        64,
        2,
        dtype="float64",
        attention="unfused",
        dropout=0.1,
        attention_dropout=0.1,
    )
    t = transforms.training(f, "adam")
    assert sum(op.op_type == "Dropout" for op in t.ops) == 3 * 2  # probs, attention, MLP
    g = transforms.megatron(t, *degrees)
    _equal_to_sequential(g, t)
    r = transforms.recompute(t, ir.models.gpt_layer_activations(t))
    _equal_to_sequential(transforms.megatron(r, *degrees), r)


def test_the_fused_gpt_refuses_attention_dropout_and_bad_probabilities():
    with pytest.raises(ir.models.ModelError, match="unfused"):
        ir.models.gpt(2, 8, 16, 2, 32, 1, attention_dropout=0.1)
    with pytest.raises(ir.models.ModelError, match="probability"):
        ir.models.gpt(2, 8, 16, 2, 32, 1, dropout=1.0)
    fused = ir.models.gpt(2, 8, 16, 2, 32, 1, dropout=0.1)
    assert sum(op.op_type == "Dropout" for op in fused.ops) == 2


def test_megatrons_fused_scale_mask_softmax_computes_the_unfused_attention():
    kw = dict(dtype="float64", dropout=0.1, attention_dropout=0.1)
    unfused = ir.models.gpt(4, 16, 32, 4, 64, 2, attention="unfused", **kw)
    fused = ir.models.gpt(4, 16, 32, 4, 64, 2, attention="fused_softmax", **kw)
    assert not any(op.op_type in ("Scale", "CausalMask") for op in fused.ops)
    t_u, t_f = transforms.training(unfused, "adam"), transforms.training(fused, "adam")
    xs = ir.random_inputs(t_u)
    for a, b in zip(ir.execute(t_u, xs), ir.execute(t_f, xs)):
        np.testing.assert_allclose(b, a, rtol=1e-10, atol=1e-12)
    _equal_to_sequential(transforms.megatron(t_f, 2, 2, 2, 2), t_f)
    # one kernel instead of three passes over the (batch, heads, seq, seq) scores
    passes = {
        name: sum(op.op_type in ("Scale", "CausalMask", "Softmax") for op in f.ops)
        for name, f in (("unfused", unfused), ("fused", fused))
    }
    assert passes == {"unfused": 3 * 2, "fused": 1 * 2}
