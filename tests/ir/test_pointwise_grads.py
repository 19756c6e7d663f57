"""The pointwise ops the importers added: their gradient rules against central differences.

Each op ``F`` is differentiated inside ``loss = ReduceSum(F(x) * u)`` by
``ir.transforms.gradients`` (float64) and compared with the numerical gradient.
"""

from __future__ import annotations

import numpy as np
import pytest

import ir
from ir import DType, TensorType

F64 = DType.float64


def _loss_program(op_type: str, shape: tuple[int, ...], **attrs) -> ir.Function:
    b = ir.FunctionBuilder(f"{op_type.lower()}_loss")
    w = b.input("w", TensorType(shape, F64, 0))
    u = b.input("u", TensorType(shape, F64, 0))
    y = b.call(op_type, w, **attrs)
    loss = b.call("ReduceSum", b.call("Mul", y, u))
    return b.finish([loss])


def _numerical(f: ir.Function, w: np.ndarray, u: np.ndarray, h: float = 1e-6) -> np.ndarray:
    grad = np.zeros_like(w)
    for i in np.ndindex(w.shape):
        plus, minus = w.copy(), w.copy()
        plus[i] += h
        minus[i] -= h
        grad[i] = (ir.execute(f, [plus, u])[0] - ir.execute(f, [minus, u])[0]) / (2 * h)
    return grad


@pytest.mark.parametrize(
    ("op_type", "attrs"),
    [
        ("Pow", {"exponent": 3.0}),
        ("Pow", {"exponent": -0.5}),
        ("Sqrt", {}),
        ("Rsqrt", {}),
        ("Exp", {}),
        ("Sigmoid", {}),
        ("Sin", {}),
        ("Cos", {}),
        ("Erf", {}),
    ],
)
def test_gradient_equals_central_differences(op_type: str, attrs: dict):
    rng = np.random.default_rng(0)
    shape = (3, 4)
    w, u = rng.uniform(0.2, 1.5, shape), rng.standard_normal(shape)
    f = _loss_program(op_type, shape, **attrs)
    g = ir.transforms.gradients(f, params=["w"])
    (dw,) = ir.execute(g, [w, u])[1:]
    np.testing.assert_allclose(dw, _numerical(f, w, u), rtol=1e-5, atol=1e-7)


def test_reduce_mean_gradient_equals_central_differences():
    b = ir.FunctionBuilder("mean_loss")
    w = b.input("w", TensorType((3, 4), F64, 0))
    u = b.input("u", TensorType((3, 1), F64, 0))
    y = b.call("ReduceMean", w, axes=(-1,), keepdims=True)
    f = b.finish([b.call("ReduceSum", b.call("Mul", y, u))])
    rng = np.random.default_rng(1)
    wv, uv = rng.standard_normal((3, 4)), rng.standard_normal((3, 1))
    (dw,) = ir.execute(ir.transforms.gradients(f, params=["w"]), [wv, uv])[1:]
    np.testing.assert_allclose(dw, _numerical(f, wv, uv), rtol=1e-5, atol=1e-7)


def test_where_sends_the_gradient_to_the_chosen_operand():
    b = ir.FunctionBuilder("where_loss")
    c = b.input("c", TensorType((2, 3), DType.bool, 0))
    wa = b.input("wa", TensorType((2, 3), F64, 0))
    wb = b.input("wb", TensorType((), F64, 0))
    f = b.finish([b.call("ReduceSum", b.call("Where", c, wa, wb))])
    g = ir.transforms.gradients(f, params=["wa", "wb"])
    mask = np.array([[True, False, True], [False, False, True]])
    _, dwa, dwb = ir.execute(g, [mask, np.ones((2, 3)), np.array(2.0)])
    np.testing.assert_array_equal(dwa, mask.astype(float))
    assert dwb == pytest.approx(3.0)  # three entries took the broadcast scalar
