"""Gradient ops against central finite differences (float64).

For a forward op ``y = F(x)`` and an upstream gradient ``u``, the gradient op
must equal the numerical gradient of ``sum(u * F(x))`` with respect to ``x``.
Every op runs through a one-op Function and ``ir.execute``, so the type rules
are exercised too.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

import ir
from ir import DType, TensorType

F64 = DType.float64


def run(op_type: str, *arrays: np.ndarray, **attrs) -> list[np.ndarray]:
    """Execute one op on ``arrays`` (float64 stays float64) and return its results."""
    b = ir.FunctionBuilder(op_type.lower())
    inputs = [
        b.input(f"x{i}", TensorType(a.shape, DType.from_numpy(a.dtype), 0))
        for i, a in enumerate(arrays)
    ]
    op = b.add_op(op_type, inputs, attrs)
    return list(ir.execute(b.finish(list(op.outputs)), list(arrays)))


def numerical_grad(f: Callable[[np.ndarray], float], x: np.ndarray, h: float = 1e-6):
    """Central differences of the scalar function ``f`` at ``x``."""
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        plus, minus = x.copy(), x.copy()
        plus[i] += h
        minus[i] -= h
        grad[i] = (f(plus) - f(minus)) / (2 * h)
    return grad


def assert_grad(analytic: np.ndarray, f: Callable[[np.ndarray], float], x: np.ndarray) -> None:
    np.testing.assert_allclose(analytic, numerical_grad(f, x), rtol=1e-5, atol=1e-7)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(42)


@pytest.mark.parametrize(
    ("a_shape", "b_shape"),
    [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((2, 3, 4), (2, 4, 5))],
    ids=["2d", "batched-shared-weight", "batched"],
)
def test_matmul_grad(rng, a_shape, b_shape):
    a, b = rng.standard_normal(a_shape), rng.standard_normal(b_shape)
    (c,) = run("MatMul", a, b)
    u = rng.standard_normal(c.shape)
    db, da = run("MatMulGrad", a, b, u)
    assert_grad(da, lambda x: np.sum(u * run("MatMul", x, b)[0]), a)
    assert_grad(db, lambda w: np.sum(u * run("MatMul", a, w)[0]), b)


@pytest.mark.parametrize(("forward", "grad"), [("Relu", "ReluGrad"), ("Gelu", "GeluGrad")])
def test_activation_grads(rng, forward, grad):
    x = rng.standard_normal((3, 5))
    x[np.abs(x) < 1e-3] = 0.5  # keep Relu's kink out of the finite differences
    u = rng.standard_normal(x.shape)
    (dx,) = run(grad, x, u)
    assert_grad(dx, lambda v: np.sum(u * run(forward, v)[0]), x)


def test_tanh_grad_takes_the_output(rng):
    x = rng.standard_normal((4, 3))
    u = rng.standard_normal(x.shape)
    (y,) = run("Tanh", x)
    (dx,) = run("TanhGrad", y, u)
    assert_grad(dx, lambda v: np.sum(u * run("Tanh", v)[0]), x)


@pytest.mark.parametrize("axis", [-1, 0])
def test_softmax_grad(rng, axis):
    x = rng.standard_normal((3, 4))
    u = rng.standard_normal(x.shape)
    (y,) = run("Softmax", x, axis=axis)
    np.testing.assert_allclose(np.sum(y, axis=axis), 1.0)
    (dx,) = run("SoftmaxGrad", y, u, axis=axis)
    assert_grad(dx, lambda v: np.sum(u * run("Softmax", v, axis=axis)[0]), x)


@pytest.mark.parametrize("shape", [(3, 5), (2, 3, 4)])
def test_layer_norm_grad(rng, shape):
    x = rng.standard_normal(shape)
    gamma, beta = rng.standard_normal(shape[-1:]), rng.standard_normal(shape[-1:])
    u = rng.standard_normal(shape)
    eps = 1e-3
    (y,) = run("LayerNorm", x, gamma, beta, epsilon=eps)
    xhat = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + eps)
    np.testing.assert_allclose(y, xhat * gamma + beta, rtol=1e-12)
    dx, dgamma, dbeta = run("LayerNormGrad", x, gamma, u, epsilon=eps)

    def forward(x=x, gamma=gamma, beta=beta) -> float:
        return float(np.sum(u * run("LayerNorm", x, gamma, beta, epsilon=eps)[0]))

    assert_grad(dx, lambda v: forward(x=v), x)
    assert_grad(dgamma, lambda v: forward(gamma=v), gamma)
    assert_grad(dbeta, lambda v: forward(beta=v), beta)


@pytest.mark.parametrize("kind", ["cross_entropy", "mse"])
@pytest.mark.parametrize("denominator", [0, 10])
def test_loss_grad(rng, kind, denominator):
    y = rng.standard_normal((2, 3, 4))
    if kind == "cross_entropy":
        z = rng.integers(0, 4, (2, 3)).astype(np.float64)  # float labels are cast to int
    else:
        z = rng.standard_normal(y.shape)
    scale = 0.7
    (dy,) = run("LossGrad", y, z, scale=scale, kind=kind, denominator=denominator)
    assert_grad(
        dy, lambda v: scale * float(run("Loss", v, z, kind=kind, denominator=denominator)[0]), y
    )


def test_loss_values_match_numpy(rng):
    y = rng.standard_normal((6, 4))
    z = rng.integers(0, 4, 6)
    logp = y - np.log(np.sum(np.exp(y), axis=1, keepdims=True))
    (ce,) = run("Loss", y, z)
    assert ce.shape == () and ce.dtype == np.float64
    np.testing.assert_allclose(ce, -np.mean(logp[np.arange(6), z]))
    (ce_global,) = run("Loss", y, z, denominator=12)  # a data-parallel shard of a batch of 12
    np.testing.assert_allclose(ce_global, -np.sum(logp[np.arange(6), z]) / 12)
    t = rng.standard_normal(y.shape)
    (mse,) = run("Loss", y, t, kind="mse")
    np.testing.assert_allclose(mse, np.sum((y - t) ** 2) / 6)


def test_loss_shards_sum_to_the_global_loss_with_a_denominator(rng):
    y, z = rng.standard_normal((8, 5)), rng.integers(0, 5, 8)
    (whole,) = run("Loss", y, z)
    (dwhole,) = run("LossGrad", y, z)
    parts = [run("Loss", y[i : i + 4], z[i : i + 4], denominator=8)[0] for i in (0, 4)]
    grads = [run("LossGrad", y[i : i + 4], z[i : i + 4], denominator=8)[0] for i in (0, 4)]
    np.testing.assert_allclose(sum(parts), whole)
    np.testing.assert_allclose(np.concatenate(grads), dwhole)


def test_embedding_grad_adds_repeated_ids(rng):
    table = rng.standard_normal((5, 3))
    ids = np.array([[0, 2, 2], [4, 0, 2]], dtype=np.int64)
    (y,) = run("Embedding", table, ids)
    np.testing.assert_array_equal(y, table[ids])
    u = rng.standard_normal(y.shape)
    (dtable,) = run("EmbeddingGrad", ids, u, num_embeddings=5)
    np.testing.assert_array_equal(dtable[[1, 3]], 0.0)  # rows never looked up
    assert_grad(dtable, lambda w: np.sum(u * run("Embedding", w, ids)[0]), table)


def test_causal_mask_gradient_is_the_mask_with_fill_zero(rng):
    x = rng.standard_normal((2, 4, 4))
    u = rng.standard_normal(x.shape)
    (y,) = run("CausalMask", x)
    assert np.all(y[:, 0, 1:] == -1e9) and np.all(y[:, 3, :] == x[:, 3, :])
    (dx,) = run("CausalMask", u, fill=0.0)
    # any fill is a constant; a small one keeps the finite differences exact
    assert_grad(dx, lambda v: np.sum(u * run("CausalMask", v, fill=-5.0)[0]), x)


def test_scale_and_reduce_sum_gradients(rng):
    x = rng.standard_normal((3, 4))
    u = rng.standard_normal(x.shape)
    (dx,) = run("Scale", u, factor=2.5)
    assert_grad(dx, lambda v: np.sum(u * run("Scale", v, factor=2.5)[0]), x)
    (s,) = run("ReduceSum", x, axes=(1,), keepdims=True)
    us = rng.standard_normal(s.shape)
    (dx,) = run("BroadcastTo", us, shape=x.shape)
    assert_grad(dx, lambda v: np.sum(us * run("ReduceSum", v, axes=(1,), keepdims=True)[0]), x)


@pytest.mark.parametrize(
    ("hq", "hkv", "sq", "sk", "causal", "mask"),
    [
        (2, 2, 3, 3, True, None),
        (4, 2, 3, 3, True, None),  # GQA: dk, dv sum over each kv head's query heads
        (2, 1, 1, 4, True, None),  # MQA decode on a cache
        (2, 2, 4, 2, True, None),  # more queries than keys: two rows attend nothing
        (2, 2, 3, 4, False, "keep"),
        (2, 2, 3, 4, False, "bias"),
    ],
)
def test_attention_grad(rng, hq, hkv, sq, sk, causal, mask):
    q = rng.standard_normal((2, hq, sq, 3))
    k = rng.standard_normal((2, hkv, sk, 3))
    v = rng.standard_normal((2, hkv, sk, 2))
    extra = []
    if mask == "keep":
        keep = rng.random((2, 1, sq, sk)) < 0.6
        keep[..., 0, :] = False  # one query attends nothing
        extra = [keep]
    elif mask == "bias":
        extra = [rng.standard_normal((sq, sk))]
    attrs = {"causal": causal, "scale": 0.7}
    (out,) = run("Attention", q, k, v, *extra, **attrs)
    u = rng.standard_normal(out.shape)
    dq, dk, dv = run("AttentionGrad", q, k, v, out, u, *extra, **attrs)

    def forward(q=q, k=k, v=v) -> float:
        return float(np.sum(u * run("Attention", q, k, v, *extra, **attrs)[0]))

    assert_grad(dq, lambda x: forward(q=x), q)
    assert_grad(dk, lambda x: forward(k=x), k)
    assert_grad(dv, lambda x: forward(v=x), v)
