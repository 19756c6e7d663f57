"""Shape ops: transpose, reshape and cast (pieces of tensors: ``pieces.py``; sums:
``reduce.py``).

They run on one device (``OpKind.COMPUTE``); moving data between devices is the
communication family's job.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from .. import attr_kinds as kinds
from ..errors import TypeRuleError
from ..registry import Attr, Cost, CostContext, OpDef, TypeContext, register_op
from ..types import DType, TensorType
from . import _factors as fx
from ._common import memory_cost, tensor, with_kernel
from ._examples import ctx, t

# -- Transpose ---------------------------------------------------------------------


def _perm(x: TensorType, perm) -> tuple[int, ...]:
    if perm is None:
        return tuple(reversed(range(x.rank)))
    perm = tuple(perm)
    if sorted(perm) != list(range(x.rank)):
        raise TypeRuleError(f"perm {list(perm)} is not a permutation of the {x.rank} axes")
    return perm


def _transpose_types(c: TypeContext):
    x = tensor(c, 0, "x")
    perm = _perm(x, c.attributes["perm"])
    return [x.with_shape(tuple(x.shape[p] for p in perm))]


def _transpose_cost(c: CostContext) -> Cost:
    """A copy in the new order; a view when only axes of size 1 move (the elements keep
    their memory order: a decode step's ``(B, 1, heads, d) -> (B, heads, 1, d)``)."""
    x = c.input_types[0]
    perm = _perm(x, c.attributes["perm"])
    moved = [p for p in perm if x.shape[p] != 1]
    cost = memory_cost(c)
    return replace(cost, kernel="view") if moved == sorted(moved) else cost


register_op(
    OpDef(
        name="Transpose",
        operands=("x",),
        results=("y",),
        type_rule=_transpose_types,
        kernel=lambda xs, a: [np.transpose(xs[0], a["perm"])],
        cost_rule=_transpose_cost,
        attributes=(
            Attr(
                "perm",
                None,
                "axis order of the result; None reverses the axes",
                kind=kinds.optional(kinds.sequence_of(kinds.INT)),
            ),
        ),
        doc="Permute the axes of x: y.shape[i] = x.shape[perm[i]]; a copy, or a view when "
        "only axes of size 1 move.",
        extra={
            "view": True,  # moves or retypes elements, computes nothing
            "examples": lambda s: [
                ctx(t(2 * s, 3), perm=(1, 0)),
                ctx(t(2, s, 3 * s), perm=(0, 2, 1)),
                ctx(t(s + 1, 4)),
            ],
        },
    )
)

# -- Reshape -----------------------------------------------------------------------


def _reshape_target(x: TensorType, shape) -> tuple[int, ...]:
    shape = tuple(int(d) for d in shape)
    if shape.count(-1) > 1:
        raise TypeRuleError(f"shape {list(shape)} has more than one -1")
    if any(d < -1 for d in shape):
        raise TypeRuleError(f"shape {list(shape)} has a negative dimension")
    known = math.prod(d for d in shape if d != -1)
    if -1 in shape:
        if known == 0 or x.num_elements % known:
            raise TypeRuleError(
                f"cannot reshape {x.shape} ({x.num_elements} elements) to {list(shape)}"
            )
        shape = tuple(x.num_elements // known if d == -1 else d for d in shape)
    if math.prod(shape) != x.num_elements:
        raise TypeRuleError(
            f"cannot reshape {x.shape} ({x.num_elements} elements) to {list(shape)} "
            f"({math.prod(shape)} elements)"
        )
    return shape


def _reshape_types(c: TypeContext):
    x = tensor(c, 0, "x")
    return [x.with_shape(_reshape_target(x, c.attributes["shape"]))]


register_op(
    OpDef(
        name="Reshape",
        operands=("x",),
        results=("y",),
        type_rule=_reshape_types,
        kernel=lambda xs, a: [np.reshape(xs[0], a["shape"])],
        cost_rule=with_kernel("view", memory_cost),
        attributes=(
            Attr("shape", doc="new shape; one entry may be -1 (inferred)", kind=kinds.NEW_SHAPE),
        ),
        doc="x with a new shape holding the same number of elements (row-major order).",
        extra={
            "view": True,  # moves or retypes elements, computes nothing
            "examples": lambda s: [
                ctx(t(2 * s, 6), shape=(12 * s,)),
                ctx(t(4, s, 3), shape=(-1, 3)),
                ctx(t(6 * s), shape=(2, 3, s)),
            ],
        },
    )
)

# -- Cast --------------------------------------------------------------------------


def _dtype(name) -> DType:
    if isinstance(name, DType):
        return name
    try:
        return DType(name)
    except ValueError:
        known = ", ".join(d.value for d in DType)
        raise TypeRuleError(f"unknown dtype {name!r} (one of {known})") from None


def _cast_types(c: TypeContext):
    x = tensor(c, 0, "x")
    return [TensorType(x.shape, _dtype(c.attributes["dtype"]), x.device)]


register_op(
    OpDef(
        name="Cast",
        operands=("x",),
        results=("y",),
        type_rule=lambda c: [
            TensorType(
                tensor(c, 0, "x").shape, _dtype(c.attributes["dtype"]), c.input_types[0].device
            )
        ],
        kernel=lambda xs, a: [xs[0].astype(_dtype(a["dtype"]).numpy)],
        cost_rule=lambda c: memory_cost(c, c.input_types[0].num_elements),
        attributes=(
            Attr(
                "dtype",
                doc="element type name of the result (float32, int64, ...)",
                kind=kinds.DTYPE,
            ),
        ),
        doc="x converted to another element type.",
        extra={
            "view": True,  # moves or retypes elements, computes nothing
            "examples": lambda s: [
                ctx(t(s, 3), dtype="float16"),
                ctx(t(2 * s, dtype=DType.int64), dtype="float32"),
            ],
        },
    )
)


# -- sharding rules ------------------------------------------------------------------
# Pure data movement commutes with every reduction, so Partial values pass through.


def _transpose_sharding(c: TypeContext) -> dict:
    x = c.input_types[0]
    names = fx.axes(x.rank)
    perm = _perm(x, c.attributes["perm"])
    return fx.rule(
        [names], [tuple(names[p] for p in perm)], linear=[(0,)], partial_ops=fx.ALL_REDUCTIONS
    )


def _reshape_groups(a: tuple[int, ...], b: tuple[int, ...]):
    """Pairs of index lists (of a, of b) whose sizes multiply to the same number. An axis of
    size 1 on both sides at once is a group of its own (a decode step's one position keeps
    its batch and hidden axes apart); a 1 on one side only joins its neighbours' group."""
    i = j = 0
    groups = []
    while i < len(a) or j < len(b):
        if i < len(a) and j < len(b) and a[i] == 1 and b[j] == 1:
            groups.append(([i], [j]))
            i, j = i + 1, j + 1
            continue
        gi, gj = [], []
        pa = pb = 1
        while True:
            if pa <= pb and i < len(a):
                pa *= a[i]
                gi.append(i)
                i += 1
            elif j < len(b):
                pb *= b[j]
                gj.append(j)
                j += 1
            else:
                break
            if pa != pb:
                continue
            next_a = a[i] if i < len(a) else None
            next_b = b[j] if j < len(b) else None
            if (next_a != 1 and next_b != 1) or (next_a == 1 and next_b == 1):
                break
        groups.append((gi, gj))
    return groups


def _reshape_sharding(c: TypeContext) -> dict:
    x = c.input_types[0]
    y = _reshape_target(x, c.attributes["shape"])
    xf: list = [None] * x.rank
    yf: list = [None] * len(y)
    for k, (gi, gj) in enumerate(_reshape_groups(x.shape, y)):
        # The major-most non-1 axis on each side carries the group's factor.
        ma = next((i for i in gi if x.shape[i] != 1), None)
        mb = next((j for j in gj if y[j] != 1), None)
        if ma is not None and mb is not None:
            xf[ma] = yf[mb] = f"g{k}"

    def local(attrs, ins, outs):
        return {**dict(attrs), "shape": list(outs[0].shape)}

    return fx.rule(
        [xf],
        [yf],
        linear=[(0,)],
        partial_ops=fx.ALL_REDUCTIONS,
        local_attributes=local,
    )


fx.attach("Transpose", _transpose_sharding)
fx.attach("Reshape", _reshape_sharding)
fx.attach("Cast", lambda c: fx.same_axes(c, linear=()))


# -- gradient rules (autodiff) -------------------------------------------------------
# Data movement: the gradient moves dy back (inverse permutation, old shape, old dtype).


def _attach_gradient_rules() -> None:
    from ..registry import attach_rule
    from ._grad import gname

    def unary(fn):
        def rule(b, op, ins, outs, dys):
            return [None if dys[0] is None else fn(b, op, ins[0], dys[0], gname(ins[0]))]

        return rule

    def transpose(b, op, x, dy, name):
        perm = _perm(x.type, op.attributes["perm"])
        inverse = tuple(sorted(range(len(perm)), key=lambda i: perm[i]))
        return b.call("Transpose", dy, perm=inverse, name=name)

    def reshape(b, op, x, dy, name):
        return b.call("Reshape", dy, shape=x.type.shape, name=name)

    def cast(b, op, x, dy, name):
        return b.call("Cast", dy, dtype=x.type.dtype.value, name=name)

    attach_rule("Transpose", "gradient_rule", unary(transpose))
    attach_rule("Reshape", "gradient_rule", unary(reshape))
    attach_rule("Cast", "gradient_rule", unary(cast))


_attach_gradient_rules()
