"""Comparisons, logic and selection: ``Compare``, ``Logical``, ``Not``, ``Maximum``,
``Minimum``.

``Compare(a, b, kind)`` gives a boolean tensor (``eq``, ``ne``, ``lt``, ``le``,
``gt``, ``ge``: torch's ``eq``/``ne``/... and ONNX's ``Equal``/``Less``/...);
``Logical`` and ``Not`` combine boolean tensors (masks). They have no gradient: their
results are booleans. ``Maximum`` and ``Minimum`` pick elementwise (ONNX's ``Max`` and
``Min``, torch's ``maximum``/``clamp``); their gradient follows torch's: the chosen
operand takes ``dy``, and ties split it in halves. All broadcast as numpy does.
"""

from __future__ import annotations

import numpy as np

from .. import attr_kinds as kinds
from ..errors import TypeRuleError
from ..registry import Attr, OpDef, TypeContext, register_op
from ..types import DType, TensorType
from . import _factors as fx
from ._common import broadcast_shapes, per_output_element, same_dtype, tensor
from ._examples import ctx, t

COMPARISONS = {
    "eq": np.equal,
    "ne": np.not_equal,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
}
LOGIC = {"and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor}


def _binary_shape(c: TypeContext):
    a, b = tensor(c, 0, "a"), tensor(c, 1, "b")
    same_dtype(a, b)
    return a, b, broadcast_shapes(a.shape, b.shape)


def _compare_types(c: TypeContext):
    a, _, shape = _binary_shape(c)
    return [TensorType(shape, DType.bool, a.device)]


def _boolean(c: TypeContext, i: int, what: str):
    x = tensor(c, i, what)
    if x.dtype is not DType.bool:
        raise TypeRuleError(f"{what} must be bool, got {x.dtype.value}; compare first")
    return x


def _logical_types(c: TypeContext):
    _boolean(c, 0, "a")
    _boolean(c, 1, "b")
    a, _, shape = _binary_shape(c)
    return [a.with_shape(shape)]


def _examples(dtype: DType, **attributes):
    return lambda s: [
        ctx(t(2 * s, 3, dtype=dtype), t(2 * s, 3, dtype=dtype), **attributes),
        ctx(t(2, s, 4, dtype=dtype), t(4, dtype=dtype), **attributes),
    ]


register_op(
    OpDef(
        name="Compare",
        operands=("a", "b"),
        results=("c",),
        type_rule=_compare_types,
        kernel=lambda xs, a: [COMPARISONS[a["kind"]](xs[0], xs[1])],
        cost_rule=per_output_element(1),
        attributes=(Attr("kind", doc="the comparison", kind=kinds.one_of(*COMPARISONS)),),
        doc="a == b, !=, <, <=, > or >= (kind): a bool tensor, with numpy broadcasting.",
        extra={
            "examples": lambda s: [
                ctx(t(2 * s, 3), t(2 * s, 3), kind="lt"),
                ctx(t(2, s, 4, dtype=DType.int64), t(4, dtype=DType.int64), kind="eq"),
            ],
            "broadcasting": True,
        },
    )
)

register_op(
    OpDef(
        name="Logical",
        operands=("a", "b"),
        results=("c",),
        type_rule=_logical_types,
        kernel=lambda xs, a: [LOGIC[a["kind"]](xs[0], xs[1])],
        cost_rule=per_output_element(1),
        attributes=(Attr("kind", doc="the connective", kind=kinds.one_of(*LOGIC)),),
        doc="a and b, a or b, a xor b (kind) of bool tensors, with numpy broadcasting.",
        extra={"examples": _examples(DType.bool, kind="xor"), "broadcasting": True},
    )
)


def _not_types(c: TypeContext):
    return [_boolean(c, 0, "x")]


register_op(
    OpDef(
        name="Not",
        operands=("x",),
        results=("y",),
        type_rule=_not_types,
        kernel=lambda xs, a: [np.logical_not(xs[0])],
        cost_rule=per_output_element(1),
        doc="The negation of a bool tensor.",
        extra={
            "examples": lambda s: [ctx(t(2 * s, 3, dtype=DType.bool)), ctx(t(s, dtype=DType.bool))]
        },
    )
)


def _pick_types(c: TypeContext):
    a, _, shape = _binary_shape(c)
    return [a.with_shape(shape)]


for _name, _fn, _what in (("Maximum", np.maximum, "larger"), ("Minimum", np.minimum, "smaller")):
    register_op(
        OpDef(
            name=_name,
            operands=("a", "b"),
            results=("c",),
            type_rule=_pick_types,
            kernel=lambda xs, a, fn=_fn: [fn(xs[0], xs[1])],
            cost_rule=per_output_element(1),
            doc=f"The {_what} of a and b, elementwise, with numpy broadcasting (NaN wins).",
            extra={"examples": _examples(DType.float32), "broadcasting": True},
        )
    )


# -- sharding rules ------------------------------------------------------------------
# Elementwise; nothing linear (a comparison of partial sums is not a sum of comparisons).

for _name in ("Compare", "Logical", "Maximum", "Minimum"):
    fx.attach(_name, lambda c: fx.elementwise(c, linear=()))
fx.attach("Not", lambda c: fx.same_axes(c, linear=()))


# -- gradient rules (autodiff) -------------------------------------------------------


def _attach_gradient_rules() -> None:
    from ..registry import attach_rule
    from ._grad import gname, unbroadcast

    def none(b, op, ins, outs, dys):  # boolean results carry no gradient
        return [None] * len(ins)

    def pick(larger: bool):
        def rule(b, op, ins, outs, dys):
            (dy,) = dys
            if dy is None:
                return [None, None]
            a, c = ins
            dtype = dy.type.dtype.value
            wins = b.call("Compare", a, c, kind="gt" if larger else "lt", name="wins")
            ties = b.call("Compare", a, c, kind="eq", name="ties")
            share = b.call(
                "Add",
                b.call("Cast", wins, dtype=dtype),
                b.call("Scale", b.call("Cast", ties, dtype=dtype), factor=0.5),
                name=f"{gname(a)}_share",
            )
            one = b.call("Constant", value=1.0, dtype=dtype, device=dy.type.device)
            ga = b.call("Mul", dy, share, name=f"{gname(a)}_mul")
            gc = b.call("Mul", dy, b.call("Sub", one, share), name=f"{gname(c)}_mul")
            return [unbroadcast(b, ga, a.type, gname(a)), unbroadcast(b, gc, c.type, gname(c))]

        return rule

    for name in ("Compare", "Logical", "Not"):
        attach_rule(name, "gradient_rule", none)
    attach_rule("Maximum", "gradient_rule", pick(larger=True))
    attach_rule("Minimum", "gradient_rule", pick(larger=False))


_attach_gradient_rules()
