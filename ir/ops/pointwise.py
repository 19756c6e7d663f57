"""Pointwise math that imported models need: powers, exponentials and logarithms,
trigonometry, sigmoid, erf, absolute values and rounding, and ``Where`` (select by a
boolean mask).

They are the ATen core ops that Llama (RMSNorm, rotary embeddings, SiLU) and
erf-GELU networks are built from (``ir.importers.torch_export`` maps them one to
one), and the ONNX ops that other activations are written with (``Log``, ``Abs``;
``ir.importers.onnx``). Gradients are made of these ops and the elementwise family's
(``Mul``, ``Scale``); only ``Sigmoid`` has a gradient op of its own. ``Power`` is
``Pow`` with a tensor exponent (ONNX's ``Pow``). ``Sign``, ``Floor``, ``Ceil`` and
``Round`` are piecewise constant: no gradient flows through them.
"""

from __future__ import annotations

import math

import numpy as np

from .. import attr_kinds as kinds
from ..errors import TypeRuleError
from ..registry import Attr, OpDef, TypeContext, register_op
from ..types import DType, TensorType
from . import _factors as fx
from ._common import broadcast_shapes, per_output_element, same_dtype, tensor
from ._examples import ctx, t


def _float_operand(c: TypeContext, i: int = 0, what: str = "x") -> TensorType:
    x = tensor(c, i, what)
    if not x.dtype.is_float:
        raise TypeRuleError(f"{what} must have a floating-point dtype, got {x.dtype.value}")
    return x


def _unary_examples(s: int):
    return [ctx(t(2 * s, 3)), ctx(t(s))]


def _same_float(c: TypeContext):
    return [_float_operand(c)]


def _unary(name: str, fn, flops: float, doc: str, attributes=(), examples=_unary_examples):
    def kernel(xs, a):
        x = xs[0]
        return [np.asarray(fn(x, a), dtype=x.dtype)]

    return register_op(
        OpDef(
            name=name,
            operands=("x",),
            results=("y",),
            type_rule=_same_float,
            kernel=kernel,
            cost_rule=per_output_element(flops),
            attributes=attributes,
            doc=doc,
            extra={"examples": examples},
        )
    )


_erf = np.vectorize(math.erf, otypes=[np.float64])  # numpy has no erf; models need few calls

_unary(
    "Pow",
    lambda x, a: np.power(x, a["exponent"]),
    2,
    "x ** exponent for a constant exponent.",
    attributes=(Attr("exponent", doc="the constant exponent (a number)", kind=kinds.FINITE),),
    examples=lambda s: [ctx(t(2 * s, 3), exponent=2.0), ctx(t(s), exponent=0.5)],
)
_unary("Sqrt", lambda x, a: np.sqrt(x), 2, "The square root of x.")
_unary("Rsqrt", lambda x, a: 1.0 / np.sqrt(x), 2, "1 / sqrt(x) (RMSNorm's scale).")
_unary("Exp", lambda x, a: np.exp(x), 4, "e ** x.")
_unary("Sigmoid", lambda x, a: 1.0 / (1.0 + np.exp(-x)), 4, "1 / (1 + exp(-x)).")
_unary("Sin", lambda x, a: np.sin(x), 4, "sin(x) (rotary embeddings).")
_unary("Cos", lambda x, a: np.cos(x), 4, "cos(x) (rotary embeddings).")
_unary("Erf", lambda x, a: _erf(x), 8, "The error function of x (exact GELU is built from it).")
_unary("Log", lambda x, a: np.log(x), 4, "The natural logarithm of x.")
_unary("Abs", lambda x, a: np.abs(x), 1, "|x|.")
_unary("Sign", lambda x, a: np.sign(x), 1, "-1, 0 or 1: the sign of x (no gradient).")
_unary("Floor", lambda x, a: np.floor(x), 1, "The largest whole number <= x (no gradient).")
_unary("Ceil", lambda x, a: np.ceil(x), 1, "The smallest whole number >= x (no gradient).")
_unary("Round", lambda x, a: np.round(x), 1, "x rounded to the nearest whole, halves to even.")

# -- Power ---------------------------------------------------------------------------


def _power_types(c: TypeContext):
    a, b = _float_operand(c, 0, "a"), _float_operand(c, 1, "b")
    same_dtype(a, b)
    return [a.with_shape(broadcast_shapes(a.shape, b.shape))]


register_op(
    OpDef(
        name="Power",
        operands=("a", "b"),
        results=("c",),
        type_rule=_power_types,
        kernel=lambda xs, attrs: [np.power(xs[0], xs[1])],
        cost_rule=per_output_element(8),
        doc="a ** b elementwise, with numpy broadcasting (Pow with a tensor exponent).",
        extra={
            "examples": lambda s: [ctx(t(2 * s, 3), t(2 * s, 3)), ctx(t(2, s, 4), t(4))],
            "broadcasting": True,
        },
    )
)


def _sigmoid_grad_types(c: TypeContext):
    y, dy = _float_operand(c, 0, "y"), _float_operand(c, 1, "dy")
    if y.shape != dy.shape:
        raise TypeRuleError(f"dy has shape {dy.shape}, y has {y.shape}")
    same_dtype(y, dy)
    return [y]


register_op(
    OpDef(
        name="SigmoidGrad",
        operands=("y", "dy"),
        results=("dx",),
        type_rule=_sigmoid_grad_types,
        kernel=lambda xs, a: [xs[1] * xs[0] * (1 - xs[0])],
        cost_rule=per_output_element(3),
        doc="dy * y * (1 - y), y = sigmoid(x): the gradient of Sigmoid.",
        extra={"examples": lambda s: [ctx(t(2 * s, 3), t(2 * s, 3)), ctx(t(s), t(s))]},
    )
)

# -- Where -------------------------------------------------------------------------


def _where_types(c: TypeContext):
    cond = tensor(c, 0, "condition")
    if cond.dtype is not DType.bool:
        raise TypeRuleError(f"condition must be bool, got {cond.dtype.value}; compare first")
    a, b = tensor(c, 1, "a"), tensor(c, 2, "b")
    same_dtype(a, b)
    shape = broadcast_shapes(cond.shape, broadcast_shapes(a.shape, b.shape))
    return [a.with_shape(shape)]


register_op(
    OpDef(
        name="Where",
        operands=("condition", "a", "b"),
        results=("c",),
        type_rule=_where_types,
        kernel=lambda xs, attrs: [np.where(xs[0], xs[1], xs[2])],
        cost_rule=per_output_element(1),
        doc="a where condition holds, else b, with numpy broadcasting (attention masks).",
        extra={
            "examples": lambda s: [
                ctx(t(2 * s, 3, dtype=DType.bool), t(2 * s, 3), t(2 * s, 3)),
                ctx(t(1, s, s, dtype=DType.bool), t(2, 1, s, s), t()),
            ],
            "broadcasting": True,
        },
    )
)


# the one-operand ops of this family
UNARY = ("Pow", "Sqrt", "Rsqrt", "Exp", "Sigmoid", "Sin", "Cos", "Erf", "Log", "Abs")
UNARY += ("Sign", "Floor", "Ceil", "Round")

# -- sharding rules ------------------------------------------------------------------
# Pointwise and nonlinear: any axis may be sharded, Partial values may not pass.

for _name in UNARY:
    fx.attach(_name, lambda c: fx.same_axes(c, linear=()))
fx.attach("Power", lambda c: fx.elementwise(c, linear=()))
fx.attach("SigmoidGrad", lambda c: fx.elementwise(c, linear=[(1,)]))
fx.attach("Where", lambda c: fx.elementwise(c, linear=()))


# -- gradient rules (autodiff) -------------------------------------------------------


def _attach_gradient_rules() -> None:
    from ..registry import attach_rule
    from ._grad import gname, unbroadcast

    def unary(fn):
        def rule(b, op, ins, outs, dys):
            (dy,) = dys
            return [None if dy is None else fn(b, op, ins[0], outs[0], dy, gname(ins[0]))]

        return rule

    def pow_(b, op, x, y, dy, name):
        e = op.attributes["exponent"]
        slope = b.call("Scale", b.call("Pow", x, exponent=e - 1, name=f"{name}_pow"), factor=e)
        return b.call("Mul", dy, slope, name=name)

    def sqrt(b, op, x, y, dy, name):  # d sqrt(x) = 0.5 / sqrt(x)
        return b.call("Scale", b.call("Div", dy, y, name=f"{name}_div"), factor=0.5, name=name)

    def rsqrt(b, op, x, y, dy, name):  # d x^-1/2 = -0.5 x^-3/2 = -0.5 y^3
        cube = b.call("Pow", y, exponent=3.0, name=f"{name}_cube")
        return b.call("Scale", b.call("Mul", dy, cube), factor=-0.5, name=name)

    def exp(b, op, x, y, dy, name):
        return b.call("Mul", dy, y, name=name)

    def sigmoid(b, op, x, y, dy, name):
        return b.call("SigmoidGrad", y, dy, name=name)

    def sin(b, op, x, y, dy, name):
        return b.call("Mul", dy, b.call("Cos", x, name=f"{name}_cos"), name=name)

    def cos(b, op, x, y, dy, name):
        minus = b.call("Mul", dy, b.call("Sin", x, name=f"{name}_sin"))
        return b.call("Neg", minus, name=name)

    def erf(b, op, x, y, dy, name):  # d erf(x) = 2 / sqrt(pi) * exp(-x^2)
        bell = b.call("Exp", b.call("Neg", b.call("Mul", x, x)), name=f"{name}_bell")
        slope = b.call("Scale", bell, factor=2.0 / math.sqrt(math.pi))
        return b.call("Mul", dy, slope, name=name)

    def log(b, op, x, y, dy, name):
        return b.call("Div", dy, x, name=name)

    def abs_(b, op, x, y, dy, name):  # torch's: dy * sign(x), nothing at 0
        return b.call("Mul", dy, b.call("Sign", x, name=f"{name}_sign"), name=name)

    def power(b, op, ins, outs, dys):  # d a^b = b a^(b-1) da + log(a) a^b db
        (dy,) = dys
        if dy is None:
            return [None, None]
        a, e = ins
        one = b.call("Constant", value=1.0, dtype=a.type.dtype.value, device=a.type.device)
        lower = b.call("Power", a, b.call("Sub", e, one), name=f"{gname(a)}_pow")
        ga = b.call("Mul", dy, b.call("Mul", e, lower), name=f"{gname(a)}_mul")
        gb = b.call("Mul", dy, b.call("Mul", outs[0], b.call("Log", a)), name=f"{gname(e)}_mul")
        return [unbroadcast(b, ga, a.type, gname(a)), unbroadcast(b, gb, e.type, gname(e))]

    def flat(b, op, ins, outs, dys):  # piecewise constant: nothing flows back
        return [None]

    def where(b, op, ins, outs, dys):
        (dy,) = dys
        if dy is None:
            return [None, None, None]
        cond, x, y = ins
        zero = b.call(
            "Constant", value=0.0, dtype=dy.type.dtype.value, device=dy.type.device, name="zero"
        )
        gx = b.call("Where", cond, dy, zero, name=f"{gname(x)}_where")
        gy = b.call("Where", cond, zero, dy, name=f"{gname(y)}_where")
        return [None, unbroadcast(b, gx, x.type, gname(x)), unbroadcast(b, gy, y.type, gname(y))]

    for name, fn in [
        ("Pow", pow_),
        ("Sqrt", sqrt),
        ("Rsqrt", rsqrt),
        ("Exp", exp),
        ("Sigmoid", sigmoid),
        ("Sin", sin),
        ("Cos", cos),
        ("Erf", erf),
        ("Log", log),
        ("Abs", abs_),
    ]:
        attach_rule(name, "gradient_rule", unary(fn))
    for name in ("Sign", "Floor", "Ceil", "Round"):
        attach_rule(name, "gradient_rule", flat)
    attach_rule("Power", "gradient_rule", power)
    attach_rule("Where", "gradient_rule", where)


_attach_gradient_rules()
