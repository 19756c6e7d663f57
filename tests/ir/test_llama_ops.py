"""The Llama layer ops and the KV cache's append: every gradient against central differences
(float64), Rotary against Hugging Face's rotate-half formula, and a Llama training step under
3D parallelism equal to the sequential one."""

from __future__ import annotations

import numpy as np
import pytest

import ir
from ir import DType, TensorType
from ir import transforms as T  # noqa: N812

F64 = DType.float64


def _loss(op_type: str, shapes: list[tuple[int, ...]], **attrs) -> ir.Function:
    """``sum(op(w0, w1, ...) * u)`` with every operand an input to differentiate."""
    b = ir.FunctionBuilder(f"{op_type.lower()}_loss")
    ws = [b.input(f"w{i}", TensorType(s, F64, 0)) for i, s in enumerate(shapes)]
    y = b.call(op_type, *ws, **attrs)
    u = b.input("u", y.type)
    return b.finish([b.call("ReduceSum", b.call("Mul", y, u))])


def _numerical(f: ir.Function, args: list[np.ndarray], i: int, h: float = 1e-6) -> np.ndarray:
    grad = np.zeros_like(args[i])
    for idx in np.ndindex(args[i].shape):
        plus, minus = [a.copy() for a in args], [a.copy() for a in args]
        plus[i][idx] += h
        minus[i][idx] -= h
        grad[idx] = (ir.execute(f, plus)[0] - ir.execute(f, minus)[0]) / (2 * h)
    return grad


@pytest.mark.parametrize(
    ("op_type", "shapes", "attrs"),
    [
        ("RMSNorm", [(3, 6), (6,)], {"epsilon": 1e-5}),
        ("Rotary", [(2, 3, 5, 4)], {"offset": 3}),
        ("Rotary", [(2, 5, 6)], {"theta": 500000.0, "inverse": True}),
        ("SwiGLU", [(3, 4), (3, 4)], {}),
        ("CacheAppend", [(2, 2, 3, 4), (2, 2, 1, 4)], {"axis": 2}),
    ],
    ids=["rmsnorm", "rotary", "rotary-inverse", "swiglu", "cache-append"],
)
def test_gradients_equal_central_differences(op_type, shapes, attrs):
    f = _loss(op_type, shapes, **attrs)
    rng = np.random.default_rng(0)
    args = [rng.standard_normal(s) for s in shapes]
    args.append(rng.standard_normal(f.inputs[-1].type.shape))
    names = [f"w{i}" for i in range(len(shapes))]
    got = ir.execute(ir.transforms.gradients(f, params=names), args)[1:]
    for i, g in enumerate(got):
        np.testing.assert_allclose(g, _numerical(f, args, i), rtol=1e-5, atol=1e-7)


def test_rotary_is_the_rotate_half_formula_and_its_inverse_undoes_it():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((1, 2, 5, 8))
    b = ir.FunctionBuilder("rot")
    xi = b.input("x", TensorType(x.shape, F64, 0))
    y = b.call("Rotary", xi, offset=4)
    back = b.call("Rotary", y, offset=4, inverse=True)
    got, undone = ir.execute(b.finish([y, back]), [x])
    pos = np.arange(4, 9)[:, None]
    angles = pos * 10000.0 ** (-np.arange(0, 8, 2) / 8)
    cos, sin = np.cos(np.concatenate([angles] * 2, -1)), np.sin(np.concatenate([angles] * 2, -1))
    want = x * cos + np.concatenate([-x[..., 4:], x[..., :4]], -1) * sin
    np.testing.assert_allclose(got, want, rtol=1e-12)
    np.testing.assert_allclose(undone, x, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize(("dp", "tp", "pp"), [(2, 2, 1), (1, 2, 2)], ids=str)
def test_a_llama_training_step_under_3d_parallelism_equals_the_sequential_one(dp, tp, pp):
    f = ir.models.llama(4, 8, 32, 4, 40, 2, kv_heads=2, ffn=48, dtype=F64)
    t = T.training(f, "adam")
    g = T.megatron(t, dp, tp, pp, 2 if pp > 1 else 1)
    xs = ir.random_inputs(t, seed=3)
    for a, b in zip(ir.execute_step(g, xs, source=t), ir.execute(t, xs), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12)
