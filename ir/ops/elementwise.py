"""Elementwise ops: binary arithmetic with numpy broadcasting, activations, their gradients."""

from __future__ import annotations

import math

import numpy as np

from ..errors import TypeRuleError
from ..registry import OpDef, TypeContext, register_op
from . import _factors as fx
from ._common import broadcast_shapes, per_output_element, same_dtype, tensor
from ._examples import ctx, per_device, t

# -- examples for the registry walk (see ``_examples``) -------------------------


def _binary_examples(s: int):
    return [ctx(t(2 * s, 3), t(2 * s, 3)), ctx(t(2, s, 4), t(4))]


def _unary_examples(s: int):
    return [ctx(t(2 * s, 3)), ctx(t(s))]


def _grad_examples(s: int):
    return [ctx(t(2 * s, 3), t(2 * s, 3)), ctx(t(s), t(s))]


# -- binary arithmetic ---------------------------------------------------------


def _binary_types(ctx: TypeContext):
    a, b = tensor(ctx, 0, "left operand"), tensor(ctx, 1, "right operand")
    same_dtype(a, b)
    return [a.with_shape(broadcast_shapes(a.shape, b.shape))]


def _binary(name: str, fn, doc: str, aliases: tuple[str, ...] = ()) -> OpDef:
    return register_op(
        OpDef(
            name=name,
            operands=("a", "b"),
            results=("c",),
            type_rule=_binary_types,
            kernel=lambda xs, attrs: [fn(xs[0], xs[1])],
            cost_rule=per_output_element(1),
            aliases=aliases,
            doc=doc,
            # an operand of lower rank is broadcast (a bias): parameter_inputs reads it
            extra={"examples": _binary_examples, "broadcasting": True},
        )
    )


_binary("Add", np.add, "a + b, with numpy broadcasting.")
_binary("Sub", np.subtract, "a - b, with numpy broadcasting.")
_binary("Mul", np.multiply, "a * b, with numpy broadcasting.")


def _divide(a, b):
    """a / b; whole numbers divide truncating toward zero (C's, ONNX's, torch's 'trunc')."""
    if np.asarray(a).dtype.kind not in "iu":
        return np.divide(a, b)
    q = np.floor_divide(a, b)
    inexact = (np.remainder(a, b) != 0) & ((np.asarray(a) < 0) != (np.asarray(b) < 0))
    return (q + inexact).astype(q.dtype)


_binary("Div", _divide, "a / b, with numpy broadcasting; integers truncate toward zero.")


# -- unary activations ---------------------------------------------------------


def _same_as_first(ctx: TypeContext):
    return [tensor(ctx, 0)]


def _same_as_all(ctx: TypeContext):
    """Every operand has the first operand's type; the result too."""
    first = tensor(ctx, 0)
    for i in range(1, len(ctx.input_types)):
        t = tensor(ctx, i)
        if t.shape != first.shape:
            raise TypeRuleError(f"operand {i} has shape {t.shape}, operand 0 has {first.shape}")
        same_dtype(first, t)
    return [first]


_GELU_C = math.sqrt(2.0 / math.pi)


def _gelu(x):
    # The tanh approximation (Hendrycks & Gimpel), as GPT-2 uses.
    return 0.5 * x * (1.0 + np.tanh(_GELU_C * (x + 0.044715 * x**3)))


def _gelu_grad(x, dy):
    inner = _GELU_C * (x + 0.044715 * x**3)
    t = np.tanh(inner)
    d_inner = _GELU_C * (1.0 + 3 * 0.044715 * x**2)
    return dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * d_inner)


def _unary(name: str, fn, flops: float, doc: str) -> OpDef:
    return register_op(
        OpDef(
            name=name,
            operands=("x",),
            results=("y",),
            type_rule=_same_as_first,
            kernel=lambda xs, attrs: [fn(xs[0])],
            cost_rule=per_output_element(flops),
            doc=doc,
            extra={"examples": _unary_examples},
        )
    )


def _unary_grad(name: str, fn, flops: float, doc: str, operands=("x", "dy")) -> OpDef:
    return register_op(
        OpDef(
            name=name,
            operands=operands,
            results=("dx",),
            type_rule=_same_as_all,
            kernel=lambda xs, attrs: [fn(xs[0], xs[1])],
            cost_rule=per_output_element(flops),
            doc=doc,
            extra={"examples": _grad_examples},
        )
    )


_unary("Relu", lambda x: np.maximum(x, 0).astype(x.dtype), 1, "max(x, 0).")
_unary("Gelu", _gelu, 8, "GELU, tanh approximation.")
_unary("Tanh", np.tanh, 4, "tanh(x).")
_unary("Neg", np.negative, 1, "-x.")
register_op(
    OpDef(
        name="Identity",
        operands=("x",),
        results=("y",),
        type_rule=lambda ctx: [ctx.input_types[0]],
        kernel=lambda xs, attrs: [xs[0]],
        cost_rule=per_output_element(0),
        doc="Returns its operand (a tensor or a tuple) unchanged.",
        extra={
            "view": True,
            "examples": lambda s: [ctx(t(2 * s, 3)), ctx(per_device(s, 2))],
        },
    )
)

_unary_grad("ReluGrad", lambda x, dy: dy * (x > 0), 1, "dy where x > 0, else 0.")
_unary_grad("GeluGrad", _gelu_grad, 16, "Gradient of Gelu at x times dy.")
_unary_grad(
    "TanhGrad", lambda y, dy: dy * (1.0 - y * y), 3, "dy * (1 - y^2), y = tanh(x).", ("y", "dy")
)


# -- sharding rules ------------------------------------------------------------------
# Factor notation (see ir/ops/_factors.py): the result's axes are shared by every
# operand (broadcast size-1 axes stay whole). Add/Sub pass Partial sums through when
# both operands are partial; Mul/Div when one operand is and the other replicated.

fx.attach("Add", lambda c: fx.elementwise(c, linear=[(0, 1)]))
fx.attach("Sub", lambda c: fx.elementwise(c, linear=[(0, 1)]))
fx.attach("Mul", lambda c: fx.elementwise(c, linear=[(0,), (1,)]))
fx.attach("Div", lambda c: fx.elementwise(c, linear=[(0,)]))
for _name in ("Relu", "Gelu", "Tanh"):
    fx.attach(_name, lambda c: fx.same_axes(c, linear=()))
fx.attach("Neg", lambda c: fx.same_axes(c, partial_ops=fx.LINEAR))
fx.attach("Identity", lambda c: fx.same_axes(c))
for _name in ("ReluGrad", "GeluGrad", "TanhGrad"):
    fx.attach(_name, lambda c: fx.elementwise(c, linear=[(1,)]))


# -- gradient rules (autodiff) -------------------------------------------------------
# Signature in ir/ops/_grad.py. Binary ops undo broadcasting by summing.


def _grad_rules() -> None:
    from ..registry import attach_rule
    from ._grad import gname, unbroadcast

    def binary(fa, fb):
        def rule(b, op, ins, outs, dys):
            (dy,) = dys
            if dy is None:
                return [None, None]
            a, c = ins
            ga = fa(b, dy, ins, outs, gname(a))
            gb = fb(b, dy, ins, outs, gname(c))
            return [
                None if ga is None else unbroadcast(b, ga, a.type, gname(a)),
                None if gb is None else unbroadcast(b, gb, c.type, gname(c)),
            ]

        return rule

    def same(b, dy, ins, outs, name):
        return dy

    def neg(b, dy, ins, outs, name):
        return b.call("Neg", dy, name=f"{name}_neg")

    def mul_by(i):
        return lambda b, dy, ins, outs, name: b.call("Mul", dy, ins[i], name=f"{name}_mul")

    def div_a(b, dy, ins, outs, name):
        return b.call("Div", dy, ins[1], name=f"{name}_div")

    def div_b(b, dy, ins, outs, name):
        q = b.call("Div", b.call("Mul", dy, outs[0], name=f"{name}_mul"), ins[1], name=f"{name}_q")
        return b.call("Neg", q, name=f"{name}_neg")

    attach_rule("Add", "gradient_rule", binary(same, same))
    attach_rule("Sub", "gradient_rule", binary(same, neg))
    attach_rule("Mul", "gradient_rule", binary(mul_by(1), mul_by(0)))
    attach_rule("Div", "gradient_rule", binary(div_a, div_b))

    def via(grad_op: str, use_output: bool = False):
        def rule(b, op, ins, outs, dys):
            (dy,) = dys
            if dy is None:
                return [None]
            x = outs[0] if use_output else ins[0]
            return [b.call(grad_op, x, dy, name=gname(ins[0]))]

        return rule

    attach_rule("Relu", "gradient_rule", via("ReluGrad"))
    attach_rule("Gelu", "gradient_rule", via("GeluGrad"))
    attach_rule("Tanh", "gradient_rule", via("TanhGrad", use_output=True))
    attach_rule(
        "Neg",
        "gradient_rule",
        lambda b, op, ins, outs, dys: [
            None if dys[0] is None else b.call("Neg", dys[0], name=gname(ins[0]))
        ],
    )
    attach_rule("Identity", "gradient_rule", lambda b, op, ins, outs, dys: [dys[0]])


_grad_rules()
