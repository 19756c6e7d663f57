"""ONNX rules for arithmetic: elementwise ops, activations, comparisons and logic,
casts, reductions, softmax, matrix products (``MatMul``, ``Gemm``, ``Einsum``).

Activations without a registry op of their own are written with the pointwise ops
(``LeakyRelu`` as ``Where(x < 0, alpha * x, x)``, ``HardSigmoid`` as a clipped affine
map, ``Softplus`` as ``log(exp(x) + 1)`` as onnx's reference computes it), so their
gradients and sharding come from those ops.
"""

from __future__ import annotations

import math
from functools import reduce

import numpy as np

from ..types import DType
from ._onnx_export import dtype_of
from ._onnx_rules import (
    Refused,
    Rule,
    attr,
    axis_of,
    float32,
    ints,
    known_attributes,
    need_float,
    scalar,
)

# -- elementwise -------------------------------------------------------------------


def _same(op_type: str, floats: bool = False):
    def read(rd, node):
        xs = rd.inputs(node)
        if floats:
            for x in xs:
                need_float(x)
        return [rd.call(op_type, *xs)]

    return read


def _pow(rd, node):
    x = rd.input(node, 0)
    known = rd.constants.get(node.input[1])
    if x.type.dtype.is_float and known is not None and int(np.prod(known.shape)) == 1:
        exponent = float(np.asarray(rd.static(node, 1)).reshape(-1)[0])
        if np.isfinite(exponent):  # a constant exponent: the registry's Pow
            return [rd.call("Pow", x, exponent=exponent)]
    e = rd.input(node, 1)
    if x.type.dtype.is_float:
        if not e.type.dtype.is_float or e.type.dtype is not x.type.dtype:
            e = rd.b.call("Cast", e, dtype=x.type.dtype.value, name="exponent")
        return [rd.call("Power", x, e)]
    # whole-number bases: in float64, then back (what onnx's reference computes)
    wide = [rd.b.call("Cast", v, dtype="float64", name="wide") for v in (x, e)]
    return [rd.call("Cast", rd.b.call("Power", *wide, name="power"), dtype=x.type.dtype.value)]


def _reciprocal(rd, node):
    (x,) = rd.inputs(node)
    return [rd.call("Div", scalar(rd, 1.0, x), x)]


def _variadic(op_type: str, mean: bool = False):
    def read(rd, node):
        xs = rd.inputs(node)
        if len(xs) == 1 and not mean:
            return [rd.call("Identity", xs[0])]
        if not mean:
            head = reduce(lambda a, c: rd.b.call(op_type, a, c, name="part"), xs[1:-1], xs[0])
            return [rd.call(op_type, head, xs[-1])]
        out = reduce(lambda a, c: rd.b.call(op_type, a, c, name="part"), xs[1:], xs[0])
        return [rd.call("Div", out, scalar(rd, float(len(xs)), xs[0]))]

    return read


def _where(rd, node):
    return [rd.call("Where", *rd.inputs(node))]


def _compare(kind: str):
    return lambda rd, node: [rd.call("Compare", *rd.inputs(node), kind=kind)]


def _logical(kind: str):
    return lambda rd, node: [rd.call("Logical", *rd.inputs(node), kind=kind)]


def _cast(rd, node):
    known_attributes(node, "to", "saturate", "round_mode")
    (x,) = rd.inputs(node)
    return [rd.call("Cast", x, dtype=dtype_of(rd.onnx, attr(rd, node, "to")).value)]


def _cast_like(rd, node):
    known_attributes(node, "saturate", "round_mode")
    x = rd.input(node, 0)
    like = node.input[1]
    target = rd.constants[like].dtype if like in rd.constants else rd.tensor(like).type.dtype
    target = target if isinstance(target, DType) else DType.from_numpy(target)
    return [rd.call("Cast", x, dtype=target.value)]


def _clip(rd, node):
    x = rd.input(node, 0)
    low, high = rd.input(node, 1), rd.input(node, 2)
    if low is None and high is None:
        return [rd.call("Identity", x)]
    if high is None:
        return [rd.call("Maximum", x, low)]
    y = x if low is None else rd.b.call("Maximum", x, low, name="above")
    return [rd.call("Minimum", y, high)]


def _is_inf(rd, node):
    (x,) = rd.inputs(node)
    need_float(x)
    up, down = attr(rd, node, "detect_positive", 1), attr(rd, node, "detect_negative", 1)
    if up and down:
        return [rd.call("Compare", rd.b.call("Abs", x), scalar(rd, math.inf, x), kind="eq")]
    if not up and not down:  # nothing is detected: all False
        same = rd.b.call("Compare", x, x, kind="eq", name="same")
        return [rd.call("Logical", same, same, kind="xor")]
    return [rd.call("Compare", x, scalar(rd, math.inf if up else -math.inf, x), kind="eq")]


# -- activations ---------------------------------------------------------------------


def _negative(rd, x):
    return rd.b.call("Compare", x, scalar(rd, 0.0, x), kind="lt", name="negative")


def _leaky_relu(rd, node):
    (x,) = rd.inputs(node)
    alpha = float32(attr(rd, node, "alpha", 0.01))
    return [rd.call("Where", _negative(rd, x), rd.b.call("Scale", x, factor=alpha), x)]


def _prelu(rd, node):
    x, slope = rd.inputs(node)
    return [rd.call("Where", _negative(rd, x), rd.b.call("Mul", x, slope), x)]


def _elu(rd, node, alpha: float, gamma: float = 1.0):
    (x,) = rd.inputs(node)
    need_float(x)
    below = rd.b.call("Sub", rd.b.call("Exp", x), scalar(rd, 1.0, x))
    scaled = rd.b.call("Scale", below, factor=alpha)
    if gamma == 1.0:
        return rd.call("Where", _negative(rd, x), scaled, x)
    y = rd.b.call("Where", _negative(rd, x), scaled, x)
    return rd.call("Scale", y, factor=gamma)


def _celu(rd, node):
    (x,) = rd.inputs(node)
    need_float(x)
    alpha = float32(attr(rd, node, "alpha", 1.0))
    inner = rd.b.call("Exp", rd.b.call("Scale", x, factor=1.0 / alpha))
    inner = rd.b.call("Scale", rd.b.call("Sub", inner, scalar(rd, 1.0, x)), factor=alpha)
    zero = scalar(rd, 0.0, x)
    return [rd.call("Add", rd.b.call("Maximum", x, zero), rd.b.call("Minimum", inner, zero))]


def _hard_sigmoid_of(rd, x, alpha: float, beta: float, last: bool = False):
    y = rd.b.call("Add", rd.b.call("Scale", x, factor=alpha), scalar(rd, beta, x))
    y = rd.b.call("Maximum", y, scalar(rd, 0.0, x))
    if last:
        return rd.call("Minimum", y, scalar(rd, 1.0, x))
    return rd.b.call("Minimum", y, scalar(rd, 1.0, x), name="hard_sigmoid")


def _hard_sigmoid(rd, node):
    (x,) = rd.inputs(node)
    alpha, beta = float32(attr(rd, node, "alpha", 0.2)), float32(attr(rd, node, "beta", 0.5))
    return [_hard_sigmoid_of(rd, x, alpha, beta, last=True)]


def _hard_swish(rd, node):
    (x,) = rd.inputs(node)
    return [rd.call("Mul", x, _hard_sigmoid_of(rd, x, 1.0 / 6.0, 0.5))]


def _softplus_of(rd, x, last: bool = False):
    inner = rd.b.call("Add", rd.b.call("Exp", x), scalar(rd, 1.0, x))
    return rd.call("Log", inner) if last else rd.b.call("Log", inner, name="softplus")


def _softplus(rd, node):
    (x,) = rd.inputs(node)
    need_float(x)
    return [_softplus_of(rd, x, last=True)]


def _softsign(rd, node):
    (x,) = rd.inputs(node)
    need_float(x)
    return [rd.call("Div", x, rd.b.call("Add", rd.b.call("Abs", x), scalar(rd, 1.0, x)))]


def _mish(rd, node):
    (x,) = rd.inputs(node)
    need_float(x)
    return [rd.call("Mul", x, rd.b.call("Tanh", _softplus_of(rd, x)))]


def _swish(rd, node):
    (x,) = rd.inputs(node)
    alpha = float32(attr(rd, node, "alpha", 1.0))
    gate = rd.b.call("Sigmoid", rd.b.call("Scale", x, factor=alpha) if alpha != 1 else x)
    return [rd.call("Mul", x, gate)]


def _thresholded_relu(rd, node):
    (x,) = rd.inputs(node)
    alpha = float32(attr(rd, node, "alpha", 1.0))
    above = rd.b.call("Compare", x, scalar(rd, alpha, x), kind="gt", name="above")
    return [rd.call("Where", above, x, scalar(rd, 0.0, x))]


def _gelu(rd, node):
    (x,) = rd.inputs(node)
    need_float(x)
    if attr(rd, node, "approximate", "none") == "tanh":
        return [rd.call("Gelu", x)]
    erf = rd.b.call("Erf", rd.b.call("Scale", x, factor=1 / math.sqrt(2.0)), name="erf")
    half = rd.b.call("Scale", rd.b.call("Add", erf, scalar(rd, 1.0, x)), factor=0.5)
    return [rd.call("Mul", x, half)]


# -- reductions and softmax ----------------------------------------------------------


def _reduce_axes(rd, node, x, in_input: bool) -> tuple[int, ...] | None:
    """The reduced axes (None: all), from the axes operand or attribute."""
    axes = ints(rd.static(node, 1)) if in_input else attr(rd, node, "axes")
    if not axes:
        return () if attr(rd, node, "noop_with_empty_axes", 0) else None
    return tuple(sorted({axis_of(a, x.type.rank) for a in axes}))


def _reduce(kind: str, input_since: int = 18):
    def read(rd, node):
        known_attributes(node, "axes", "keepdims", "noop_with_empty_axes")
        x = rd.input(node, 0)
        axes = _reduce_axes(rd, node, x, rd.version(node) >= input_since)
        keep = bool(attr(rd, node, "keepdims", 1))
        if axes == ():
            if kind in ("L1", "L2", "SumSquare", "LogSum", "LogSumExp"):
                raise Refused("an empty axes list with noop_with_empty_axes (nothing reduced)")
            return [rd.call("Identity", x)]
        every = tuple(range(x.type.rank)) if axes is None else axes
        if any(x.type.shape[a] == 0 for a in every) and kind not in ("Sum", "SumSquare", "L1"):
            raise Refused(f"Reduce{kind} over an empty axis")
        if kind in ("Mean", "LogSum", "L2") and not x.type.dtype.is_float:
            raise Refused(f"Reduce{kind} of a {x.type.dtype.value} tensor")
        op = {"Sum": "ReduceSum", "Mean": "ReduceMean", "Max": "ReduceMax", "Min": "ReduceMin"}
        if kind in op:
            return [rd.call(op[kind], x, axes=axes, keepdims=keep)]
        if kind == "LogSumExp":
            need_float(x)
            top = rd.b.call("ReduceMax", x, axes=axes, keepdims=True, name="top")
            e = rd.b.call("Exp", rd.b.call("Sub", x, top))
            y = rd.b.call(
                "Add", rd.b.call("Log", rd.b.call("ReduceSum", e, axes=axes, keepdims=True)), top
            )
            kept = tuple(1 if i in every else d for i, d in enumerate(x.type.shape))
            shape = kept if keep else tuple(d for i, d in enumerate(x.type.shape) if i not in every)
            return [rd.call("Reshape", y, shape=shape)]
        inner = {
            "L1": lambda: rd.b.call("Abs", x) if x.type.dtype.is_float else None,
            "L2": lambda: rd.b.call("Mul", x, x),
            "SumSquare": lambda: rd.b.call("Mul", x, x),
            "LogSum": lambda: x,
        }[kind]()
        if inner is None:
            raise Refused(f"Reduce{kind} of a {x.type.dtype.value} tensor")
        if kind in ("L1", "SumSquare"):
            return [rd.call("ReduceSum", inner, axes=axes, keepdims=keep)]
        total = rd.b.call("ReduceSum", inner, axes=axes, keepdims=keep, name="total")
        return [rd.call("Sqrt" if kind == "L2" else "Log", total)]

    return read


def _softmax(log: bool):
    def read(rd, node):
        (x,) = rd.inputs(node)
        need_float(x)
        axis = axis_of(attr(rd, node, "axis", -1), x.type.rank)
        if not log:
            return [rd.call("Softmax", x, axis=axis)]
        top = rd.b.call("ReduceMax", x, axes=(axis,), keepdims=True, name="top")
        shifted = rd.b.call("Sub", x, top, name="shifted")
        total = rd.b.call("ReduceSum", rd.b.call("Exp", shifted), axes=(axis,), keepdims=True)
        return [rd.call("Sub", shifted, rd.b.call("Log", total))]

    return read


# -- matrix products -----------------------------------------------------------------


def matmul(rd, a, b):
    """numpy's ``matmul`` of two values of rank >= 1, batch axes broadcast (the last op
    named after the node's result)."""
    squeeze = []
    if a.type.rank == 1:
        a = rd.b.call("Reshape", a, shape=(1, a.type.shape[0]), name="row")
        squeeze.append(-2)
    if b.type.rank == 1:
        b = rd.b.call("Reshape", b, shape=(b.type.shape[0], 1), name="column")
        squeeze.append(-1)
    if b.type.rank > 2:
        batch = tuple(np.broadcast_shapes(a.type.shape[:-2], b.type.shape[:-2]))
        if a.type.shape[:-2] != batch:
            a = rd.b.call("BroadcastTo", a, shape=(*batch, *a.type.shape[-2:]), name="a_batch")
        if b.type.shape[:-2] != batch:
            b = rd.b.call("BroadcastTo", b, shape=(*batch, *b.type.shape[-2:]), name="b_batch")
    if not squeeze:
        return rd.call("MatMul", a, b)
    y = rd.b.call("MatMul", a, b, name="mm")
    shape = list(y.type.shape)
    for axis in sorted(squeeze):
        shape.pop(len(shape) + axis if axis == -1 else len(shape) - 2)
    return rd.call("Reshape", y, shape=tuple(shape))


def _matmul(rd, node):
    a, b = rd.inputs(node)
    return [matmul(rd, a, b)]


def _gemm(rd, node):
    a, b, *c = rd.inputs(node)
    alpha, beta = float32(attr(rd, node, "alpha", 1.0)), float32(attr(rd, node, "beta", 1.0))
    if attr(rd, node, "transA", 0):
        a = rd.b.call("Transpose", a, perm=(1, 0), name="a_t")
    if attr(rd, node, "transB", 0):
        b = rd.b.call("Transpose", b, perm=(1, 0), name="b_t")
    biased = bool(c) and beta != 0.0
    if alpha == 1.0 and not biased:
        return [rd.call("MatMul", a, b)]
    y = rd.b.call("MatMul", a, b, name="gemm_mm")
    if not biased:
        return [rd.call("Scale", y, factor=alpha)]
    if alpha != 1.0:
        y = rd.b.call("Scale", y, factor=alpha, name="gemm_alpha")
    bias = c[0] if beta == 1.0 else rd.b.call("Scale", c[0], factor=beta, name="gemm_beta")
    return [rd.call("Add", y, bias)]


RULES: dict[str, Rule] = {
    **{op: Rule(_same(op)) for op in ("Add", "Sub", "Mul", "Div", "Neg", "Relu", "Identity")},
    **{
        op: Rule(_same(op, floats=True))
        for op in (
            *("Abs", "Sqrt", "Exp", "Log", "Erf", "Sin", "Cos", "Tanh", "Sigmoid"),
            *("Floor", "Ceil", "Round", "Sign"),
        )
    },
    "Pow": Rule(_pow),
    "Reciprocal": Rule(_reciprocal),
    "Max": Rule(_variadic("Maximum")),
    "Min": Rule(_variadic("Minimum")),
    "Sum": Rule(_variadic("Add")),
    "Mean": Rule(_variadic("Add", mean=True)),
    "Where": Rule(_where),
    "Equal": Rule(_compare("eq")),
    "Less": Rule(_compare("lt")),
    "LessOrEqual": Rule(_compare("le")),
    "Greater": Rule(_compare("gt")),
    "GreaterOrEqual": Rule(_compare("ge")),
    "And": Rule(_logical("and")),
    "Or": Rule(_logical("or")),
    "Xor": Rule(_logical("xor")),
    "Not": Rule(_same("Not")),
    "Cast": Rule(_cast),
    "CastLike": Rule(_cast_like),
    "Clip": Rule(_clip),
    "LeakyRelu": Rule(_leaky_relu),
    "PRelu": Rule(_prelu),
    "Elu": Rule(
        lambda rd, node: [_elu(rd, node, float32(attr(rd, node, "alpha", 1.0)))], wide=True
    ),
    "Selu": Rule(
        lambda rd, node: [
            _elu(
                rd,
                node,
                float32(attr(rd, node, "alpha", 1.67326319217681884765625)),
                float32(attr(rd, node, "gamma", 1.05070102214813232421875)),
            )
        ],
        wide=True,
    ),
    "Celu": Rule(_celu, wide=True),
    "HardSigmoid": Rule(_hard_sigmoid, wide=True),
    "HardSwish": Rule(_hard_swish, wide=True),
    "Softplus": Rule(_softplus, wide=True),
    "Softsign": Rule(_softsign, wide=True),
    "Mish": Rule(_mish, wide=True),
    "Swish": Rule(_swish, wide=True),
    "ThresholdedRelu": Rule(_thresholded_relu),
    "Gelu": Rule(_gelu, wide=True),
    "ReduceSum": Rule(_reduce("Sum", input_since=13), static=(1,)),
    **{f"Reduce{k}": Rule(_reduce(k), static=(1,)) for k in ("Mean", "Max", "Min", "L1")},
    **{
        f"Reduce{k}": Rule(_reduce(k), static=(1,), wide=True)
        for k in ("L2", "SumSquare", "LogSum", "LogSumExp")
    },
    "Softmax": Rule(_softmax(log=False)),
    "LogSoftmax": Rule(_softmax(log=True), wide=True),
    "IsNaN": Rule(lambda rd, node: [rd.call("Compare", *rd.inputs(node) * 2, kind="ne")]),
    "IsInf": Rule(_is_inf),
    "MatMul": Rule(_matmul),
    "Gemm": Rule(_gemm),
}
