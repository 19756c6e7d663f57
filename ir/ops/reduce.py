"""Sums and broadcasts: ``Sum`` (of several tensors), ``ReduceSum``, ``ReduceMean``,
``ReduceMax`` and ``ReduceMin`` (over axes) and ``BroadcastTo`` (their gradient).

They run on one device (``OpKind.COMPUTE``). ``Sum`` accepts either several
tensors or one tuple of them, as the seeds write both.
"""

from __future__ import annotations

import numpy as np

from .. import attr_kinds as kinds
from ..errors import TypeRuleError
from ..registry import Attr, Cost, CostContext, OpDef, TypeContext, register_op
from ..types import TensorType, TupleType
from . import _factors as fx
from ._common import memory_cost, normalize_axis, tensor
from ._examples import ctx, t
from .pieces import _flat_arrays, _flat_operands

# -- sums --------------------------------------------------------------------------


def _sum_types(c: TypeContext):
    xs = _flat_operands(c)
    for i, x in enumerate(xs):
        if x.shape != xs[0].shape:
            raise TypeRuleError(f"tensor {i} has shape {x.shape}, tensor 0 has {xs[0].shape}")
    return [xs[0]]


def _sum_kernel(xs, a):
    parts = _flat_arrays(xs)
    out = parts[0].copy()
    for p in parts[1:]:
        out = out + p
    return [out]


def _sum_cost(c: CostContext) -> Cost:
    (y,) = c.output_types
    n = sum(len(x) if isinstance(x, TupleType) else 1 for x in c.input_types)
    return memory_cost(c, (n - 1) * y.num_elements)


register_op(
    OpDef(
        name="Sum",
        operands=("xs",),
        results=("y",),
        type_rule=_sum_types,
        kernel=_sum_kernel,
        cost_rule=_sum_cost,
        variadic=True,
        aliases=("AddN",),
        doc="Elementwise sum of same-shape tensors on one device, or of one tuple's elements.",
        extra={
            "examples": lambda s: [
                ctx(t(s, 3), t(s, 3), t(s, 3)),
                ctx(TupleType((t(2, 2 * s), t(2, 2 * s)))),
            ]
        },
    )
)


def _axes(x: TensorType, axes) -> tuple[int, ...]:
    if axes is None:
        return tuple(range(x.rank))
    if isinstance(axes, int):
        axes = (axes,)
    out = tuple(sorted({normalize_axis(a, x.rank) for a in axes}))
    if len(out) != len(tuple(axes)):
        raise TypeRuleError(f"axes {list(axes)} name an axis twice")
    return out


def _reduce_sum_types(c: TypeContext):
    x = tensor(c, 0, "x")
    axes = _axes(x, c.attributes["axes"])
    if c.attributes["keepdims"]:
        shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    else:
        shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
    return [x.with_shape(shape)]


def _reduce_kernel(reduce):
    """A kernel reducing x over its ``axes`` attribute (None: all) with ``reduce``."""

    def kernel(xs, a):
        x = xs[0]
        axes = tuple(range(x.ndim)) if a["axes"] is None else a["axes"]
        return [reduce(x, axis=axes, keepdims=bool(a["keepdims"])).astype(x.dtype)]

    return kernel


register_op(
    OpDef(
        name="ReduceSum",
        operands=("x",),
        results=("y",),
        type_rule=_reduce_sum_types,
        kernel=_reduce_kernel(np.sum),
        cost_rule=lambda c: memory_cost(c, c.input_types[0].num_elements),
        attributes=(
            Attr("axes", None, "axes to sum over; None sums over all of them", kind=kinds.AXES),
            Attr("keepdims", False, "keep the summed axes with size 1", kind=kinds.BOOL),
        ),
        doc="Sum of x over axes.",
        extra={
            "examples": lambda s: [
                ctx(t(2 * s, 3), axes=(0,)),
                ctx(t(2, s, 3), axes=(1, 2), keepdims=True),
                ctx(t(s, 4)),
            ]
        },
    )
)


register_op(
    OpDef(
        name="ReduceMean",
        operands=("x",),
        results=("y",),
        type_rule=_reduce_sum_types,
        kernel=_reduce_kernel(np.mean),
        cost_rule=lambda c: memory_cost(c, c.input_types[0].num_elements + 1),
        attributes=(
            Attr(
                "axes",
                None,
                "axes to average over; None averages over all of them",
                kind=kinds.AXES,
            ),
            Attr("keepdims", False, "keep the averaged axes with size 1", kind=kinds.BOOL),
        ),
        doc="Mean of x over axes (RMSNorm's mean square).",
        extra={
            "examples": lambda s: [
                ctx(t(2 * s, 3), axes=(0,)),
                ctx(t(2, s, 3), axes=(-1,), keepdims=True),
                ctx(t(s, 4)),
            ]
        },
    )
)


for _name, _fn, _what in (("ReduceMax", np.max, "Largest"), ("ReduceMin", np.min, "Smallest")):
    register_op(
        OpDef(
            name=_name,
            operands=("x",),
            results=("y",),
            type_rule=_reduce_sum_types,
            kernel=_reduce_kernel(_fn),
            cost_rule=lambda c: memory_cost(c, c.input_types[0].num_elements),
            attributes=(
                Attr("axes", None, "axes to reduce; None reduces all of them", kind=kinds.AXES),
                Attr("keepdims", False, "keep the reduced axes with size 1", kind=kinds.BOOL),
            ),
            doc=f"{_what} element of x over axes (ties share the gradient, as torch's amax).",
            extra={
                "examples": lambda s: [
                    ctx(t(2 * s, 3), axes=(0,)),
                    ctx(t(2, s, 3), axes=(-1,), keepdims=True),
                    ctx(t(s, 4)),
                ]
            },
        )
    )


def _broadcast_to_types(c: TypeContext):
    x = tensor(c, 0, "x")
    shape = tuple(int(d) for d in c.attributes["shape"])
    try:
        fits = tuple(np.broadcast_shapes(x.shape, shape)) == shape
    except ValueError:
        fits = False
    if not fits:
        raise TypeRuleError(f"shape {x.shape} does not broadcast to {list(shape)}")
    return [x.with_shape(shape)]


register_op(
    OpDef(
        name="BroadcastTo",
        operands=("x",),
        results=("y",),
        type_rule=_broadcast_to_types,
        kernel=lambda xs, a: [np.broadcast_to(xs[0], tuple(a["shape"])).copy()],
        cost_rule=memory_cost,
        attributes=(Attr("shape", doc="result shape (numpy broadcasting)", kind=kinds.SHAPE),),
        doc="x broadcast to shape by numpy's rules (the gradient of ReduceSum).",
        extra={
            "examples": lambda s: [
                ctx(t(1, 3), shape=(2 * s, 3)),
                ctx(t(s), shape=(2, 3, s)),
            ]
        },
    )
)


# -- sharding rules ------------------------------------------------------------------
# A sum over a sharded axis is Partial; Sum and BroadcastTo pass Partial values through.


def _sum_sharding(c: TypeContext) -> dict:
    r = fx.same_axes(c, partial_ops=fx.LINEAR)
    r["linear"] = [tuple(range(len(c.input_types)))]
    return r


def _reduce_sum_sharding(c: TypeContext) -> dict:
    x = c.input_types[0]
    summed = _axes(x, c.attributes["axes"])
    names = fx.axes(x.rank)
    if c.attributes["keepdims"]:
        out = tuple(None if i in summed else n for i, n in enumerate(names))
    else:
        out = tuple(n for i, n in enumerate(names) if i not in summed)
    reduce = {names[i]: "sum" for i in summed}
    return fx.rule([names], [out], reduce=reduce, linear=[(0,)])


def _broadcast_to_sharding(c: TypeContext) -> dict:
    x = c.input_types[0]
    shape = tuple(int(d) for d in c.attributes["shape"])
    lead = len(shape) - x.rank
    names = fx.axes(len(shape))
    xf = tuple(
        None if n == 1 and shape[lead + i] != 1 else names[lead + i] for i, n in enumerate(x.shape)
    )
    yf = tuple(n if i >= lead and n in xf else None for i, n in enumerate(names))

    def local(attrs, ins, outs):  # a shard broadcasts to its own (smaller) shape
        return {**dict(attrs), "shape": list(outs[0].shape)}

    return fx.rule([xf], [yf], linear=[(0,)], partial_ops=fx.ALL_REDUCTIONS, local_attributes=local)


def _reduce_mean_sharding(c: TypeContext) -> dict:
    # Averaged axes stay whole: a mean of uneven shards' means is not the mean.
    x = c.input_types[0]
    averaged = _axes(x, c.attributes["axes"])
    names = tuple(None if i in averaged else n for i, n in enumerate(fx.axes(x.rank)))
    if c.attributes["keepdims"]:
        out = names
    else:
        out = tuple(n for i, n in enumerate(names) if i not in averaged)
    return fx.rule([names], [out], linear=[(0,)])


fx.attach("Sum", _sum_sharding)
fx.attach("ReduceMean", _reduce_mean_sharding)
fx.attach("ReduceMax", _reduce_mean_sharding)  # reduced axes whole, as a mean's
fx.attach("ReduceMin", _reduce_mean_sharding)
fx.attach("ReduceSum", _reduce_sum_sharding)
fx.attach("BroadcastTo", _broadcast_to_sharding)


# -- gradient rules (autodiff) -------------------------------------------------------
# Sums broadcast dy back; a broadcast sums dy over the broadcast axes.


def _attach_gradient_rules() -> None:
    from ..registry import attach_rule
    from ._grad import gname, unbroadcast

    def unary(fn):
        def rule(b, op, ins, outs, dys):
            return [None if dys[0] is None else fn(b, op, ins[0], dys[0], gname(ins[0]))]

        return rule

    def reduce_sum(b, op, x, dy, name):
        axes = _axes(x.type, op.attributes["axes"])
        kept = tuple(1 if i in axes else d for i, d in enumerate(x.type.shape))
        if dy.type.shape != kept:
            dy = b.call("Reshape", dy, shape=kept, name=f"{name}_keep")
        return b.call("BroadcastTo", dy, shape=x.type.shape, name=name)

    def reduce_mean(b, op, x, dy, name):
        axes = _axes(x.type, op.attributes["axes"])
        count = 1
        for i in axes:
            count *= x.type.shape[i]
        spread = reduce_sum(b, op, x, dy, f"{name}_spread")
        return b.call("Scale", spread, factor=1.0 / max(count, 1), name=name)

    def reduce_extreme(b, op, ins, outs, dys):
        """dy to the elements equal to the extreme, shared evenly among ties (torch's amax)."""
        ((x,), (y,), (dy,)) = ins, outs, dys
        if dy is None:
            return [None]
        name = gname(x)
        axes = _axes(x.type, op.attributes["axes"])
        kept = tuple(1 if i in axes else d for i, d in enumerate(x.type.shape))
        extreme = b.call("Reshape", y, shape=kept, name=f"{name}_y") if y.type.shape != kept else y
        hit = b.call("Cast", b.call("Compare", x, extreme, kind="eq"), dtype=x.type.dtype.value)
        count = b.call("ReduceSum", hit, axes=axes, keepdims=True, name=f"{name}_ties")
        share = b.call("Div", hit, count, name=f"{name}_share")
        return [b.call("Mul", share, reduce_sum(b, op, x, dy, f"{name}_spread"), name=name)]

    def broadcast_to(b, op, x, dy, name):
        return unbroadcast(b, dy, x.type, name)

    def sum_(b, op, ins, outs, dys):
        (dy,) = dys
        if dy is None:
            return [None] * len(ins)
        if len(ins) == 1 and isinstance(ins[0].type, TupleType):
            n = len(ins[0].type)
            return [b.call("MakeTuple", *([dy] * n), name=gname(ins[0]))]
        return [dy] * len(ins)

    attach_rule("ReduceSum", "gradient_rule", unary(reduce_sum))
    attach_rule("ReduceMean", "gradient_rule", unary(reduce_mean))
    attach_rule("ReduceMax", "gradient_rule", reduce_extreme)
    attach_rule("ReduceMin", "gradient_rule", reduce_extreme)
    attach_rule("BroadcastTo", "gradient_rule", unary(broadcast_to))
    attach_rule("Sum", "gradient_rule", sum_)


_attach_gradient_rules()
