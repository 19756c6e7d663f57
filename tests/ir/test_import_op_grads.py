"""The ops that issue 29's importers added (logarithm, absolute value, tensor powers,
maxima and minima, reductions to extremes, padding with a value, grouped and dilated
convolutions, transposed convolutions): gradients against central differences in
float64, and the convolutions against torch's."""

from __future__ import annotations

import numpy as np
import pytest

import ir
from ir import DType, TensorType

F64 = DType.float64


def _loss_program(shapes: list[tuple[int, ...]], build) -> ir.Function:
    """``loss = ReduceSum(build(w0, w1, ...) * u)`` over float64 inputs."""
    b = ir.FunctionBuilder("loss")
    ws = [b.input(f"w{i}", TensorType(s, F64, 0)) for i, s in enumerate(shapes)]
    y = build(b, *ws)
    u = b.input("u", TensorType(y.type.shape, F64, 0))
    return b.finish([b.call("ReduceSum", b.call("Mul", y, u))])


def _numerical(f: ir.Function, args: list[np.ndarray], k: int, h: float = 1e-6) -> np.ndarray:
    grad = np.zeros_like(args[k])
    for i in np.ndindex(args[k].shape):
        plus = [a.copy() for a in args]
        minus = [a.copy() for a in args]
        plus[k][i] += h
        minus[k][i] -= h
        grad[i] = (ir.execute(f, plus)[0] - ir.execute(f, minus)[0]) / (2 * h)
    return grad


def _away_from_zero(rng, shape):
    return rng.uniform(0.3, 1.5, shape) * rng.choice([-1.0, 1.0], shape)


CASES = {
    "Log": ([(3, 4)], lambda b, w: b.call("Log", w), "positive"),
    "Abs": ([(3, 4)], lambda b, w: b.call("Abs", w), "signed"),
    "Power": ([(3, 4), (4,)], lambda b, a, e: b.call("Power", a, e), "positive"),
    "Maximum": ([(3, 4), (4,)], lambda b, a, c: b.call("Maximum", a, c), "signed"),
    "Minimum": ([(3, 4), (3, 1)], lambda b, a, c: b.call("Minimum", a, c), "signed"),
    "ReduceMax": ([(3, 4)], lambda b, w: b.call("ReduceMax", w, axes=(1,)), "signed"),
    "ReduceMin": (
        [(2, 3, 4)],
        lambda b, w: b.call("ReduceMin", w, axes=(0, 2), keepdims=True),
        "signed",
    ),
    "Pad": ([(3, 4)], lambda b, w: b.call("Pad", w, axis=1, before=2, after=1, value=-3.0), "any"),
    "Conv2D": (
        [(2, 5, 6, 4), (3, 2, 2, 6)],
        lambda b, x, w: b.call(
            "Conv2D", x, w, groups=2, dilation=(2, 1), stride=(1, 2), padding=(1, 0, 1, 1)
        ),
        "any",
    ),
    "ConvTranspose2D": (
        [(2, 3, 4, 4), (3, 2, 3, 4)],
        lambda b, x, w: b.call(
            "ConvTranspose2D",
            x,
            w,
            groups=2,
            stride=(2, 1),
            dilation=(1, 2),
            padding=(1, 0, 0, 1),
            output_padding=(1, 0),
        ),
        "any",
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_gradient_equals_central_differences(name: str):
    shapes, build, values = CASES[name]
    rng = np.random.default_rng(0)
    f = _loss_program(shapes, build)
    draw = {
        "positive": lambda s: rng.uniform(0.3, 1.5, s),
        "signed": lambda s: _away_from_zero(rng, s),
        "any": lambda s: rng.standard_normal(s),
    }[values]
    args = [draw(s) for s in shapes] + [rng.standard_normal(f.inputs[-1].type.shape)]
    params = [v.name for v in f.inputs[:-1]]
    grads = ir.execute(ir.transforms.gradients(f, params=params), args)[1:]
    for k, g in enumerate(grads):
        np.testing.assert_allclose(g, _numerical(f, args, k), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("axis", [1, -1, 0])
def test_take_along_axis_gradient_adds_up_repeated_indices(axis: int):
    """torch's ``gather`` (a router's gates at its top-k experts): the gradient scatters
    ``dy`` back, adding where an index repeats."""
    rng = np.random.default_rng(3)
    b = ir.FunctionBuilder("take")
    x = b.input("x", TensorType((3, 4), F64, 0))
    shape = (3, 5) if axis else (6, 4)
    index = b.input("index", TensorType(shape, DType.int64, 0))
    u = b.input("u", TensorType(shape, F64, 0))
    y = b.call("TakeAlongAxis", x, index, axis=axis)
    f = b.finish([b.call("ReduceSum", b.call("Mul", y, u))])
    picks = rng.integers(0, 4 if axis else 3, shape)
    picks[0, :2] = 1  # a repeat
    args = [rng.standard_normal((3, 4)), picks, rng.standard_normal(shape)]
    (dx,) = ir.execute(ir.transforms.gradients(f, params=["x"]), args)[1:]
    np.testing.assert_allclose(dx, _numerical(f, args, 0), rtol=1e-6, atol=1e-9)


def test_ties_share_the_gradient_as_torch_does():
    b = ir.FunctionBuilder("ties")
    a = b.input("a", TensorType((3,), F64, 0))
    c = b.input("c", TensorType((3,), F64, 0))
    f = b.finish([b.call("ReduceSum", b.call("Maximum", a, c))])
    step = ir.transforms.gradients(f, params=["a", "c"])
    da, dc = ir.execute(step, [np.array([1.0, 2.0, 3.0]), np.array([0.0, 2.0, 4.0])])[1:]
    np.testing.assert_array_equal(da, [1.0, 0.5, 0.0])
    np.testing.assert_array_equal(dc, [0.0, 0.5, 1.0])


torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")


@pytest.mark.parametrize(
    ("groups", "stride", "dilation", "pads"),
    [(1, (1, 1), (1, 1), (1, 1)), (2, (2, 1), (1, 2), (0, 2)), (6, (1, 1), (2, 2), (2, 2))],
)
def test_grouped_and_dilated_convolutions_equal_torch(groups, stride, dilation, pads):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 6, 7, 8)).astype(np.float32)  # NCHW
    w = rng.standard_normal((12, 6 // groups, 3, 3)).astype(np.float32)
    want = torch.nn.functional.conv2d(
        torch.from_numpy(x), torch.from_numpy(w), None, stride, pads, dilation, groups
    ).numpy()
    b = ir.FunctionBuilder("conv")
    xv = b.input("x", TensorType((2, 7, 8, 6)))
    wv = b.input("w", TensorType((3, 3, 6 // groups, 12)))
    attrs = dict(stride=stride, dilation=dilation, groups=groups)
    y = b.call("Conv2D", xv, wv, padding=[pads[0], pads[0], pads[1], pads[1]], **attrs)
    (got,) = ir.execute(b.finish([y]), [x.transpose(0, 2, 3, 1), w.transpose(2, 3, 1, 0)])
    np.testing.assert_allclose(got.transpose(0, 3, 1, 2), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("groups", "stride", "dilation", "pads", "extra"),
    [(1, (2, 2), (1, 1), (1, 1), (1, 1)), (3, (3, 1), (1, 2), (0, 1), (2, 0))],
)
def test_transposed_convolutions_equal_torch(groups, stride, dilation, pads, extra):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 6, 4, 5)).astype(np.float32)  # NCHW
    w = rng.standard_normal((6, 9 // groups, 3, 2)).astype(np.float32)
    want = torch.nn.functional.conv_transpose2d(
        torch.from_numpy(x), torch.from_numpy(w), None, stride, pads, extra, groups, dilation
    ).numpy()
    b = ir.FunctionBuilder("deconv")
    xv = b.input("x", TensorType((2, 4, 5, 6)))
    wv = b.input("w", TensorType((3, 2, 9 // groups, 6)))
    attrs = dict(stride=stride, dilation=dilation, groups=groups, output_padding=extra)
    y = b.call("ConvTranspose2D", xv, wv, padding=[pads[0], pads[0], pads[1], pads[1]], **attrs)
    (got,) = ir.execute(b.finish([y]), [x.transpose(0, 2, 3, 1), w.transpose(2, 3, 1, 0)])
    np.testing.assert_allclose(got.transpose(0, 3, 1, 2), want, rtol=1e-5, atol=1e-5)
