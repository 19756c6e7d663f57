"""Shape ops: transpose, reshape, slice, concat, split, sums, broadcast and cast.

They run on one device (``OpKind.COMPUTE``); moving data between devices is the
communication family's job. ``Split`` follows the uneven-split rule of
``communication.split_sizes`` (the first ``n % k`` parts get one element more),
and ``Concat``/``Sum`` accept either several tensors or one tuple of them, as
the seeds write both (``concat(y_0, y_1, dim=0)`` and ``concat(ys, dim=0)``).
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import TypeRuleError
from ..registry import Attr, Cost, CostContext, OpDef, TypeContext, register_op
from ..types import DType, TensorType, TupleType
from . import _factors as fx
from ._common import memory_cost, normalize_axis, same_dtype, tensor
from ._examples import ctx, t
from .communication import split_array, split_sizes


def _flat_operands(c: TypeContext) -> tuple[TensorType, ...]:
    """The tensors of a variadic op: its operands, or the elements of one tuple operand."""
    types = c.input_types
    if len(types) == 1 and isinstance(types[0], TupleType):
        types = types[0].elements
    if not types:
        raise TypeRuleError("needs at least one tensor")
    for i, x in enumerate(types):
        if not isinstance(x, TensorType):
            raise TypeRuleError(f"operand {i} must be a tensor, got {x}")
    devices = {x.device for x in types}
    if len(devices) > 1:
        shown = ", ".join(sorted(map(str, devices)))
        raise TypeRuleError(
            f"its tensors live on different devices ({shown}); use Gather or Reduce to "
            "combine values across devices"
        )
    same_dtype(*types)
    return tuple(types)


def _flat_arrays(xs) -> list:
    return list(xs[0]) if len(xs) == 1 and isinstance(xs[0], tuple) else list(xs)


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


register_op(
    OpDef(
        name="Transpose",
        operands=("x",),
        results=("y",),
        type_rule=_transpose_types,
        kernel=lambda xs, a: [np.transpose(xs[0], a["perm"])],
        cost_rule=memory_cost,
        attributes=(Attr("perm", None, "axis order of the result; None reverses the axes"),),
        doc="Permute the axes of x: y.shape[i] = x.shape[perm[i]].",
        extra={
            "examples": lambda s: [
                ctx(t(2 * s, 3), perm=(1, 0)),
                ctx(t(2, s, 3 * s), perm=(0, 2, 1)),
                ctx(t(s + 1, 4)),
            ]
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
        cost_rule=memory_cost,
        attributes=(Attr("shape", doc="new shape; one entry may be -1 (inferred)"),),
        doc="x with a new shape holding the same number of elements (row-major order).",
        extra={
            "examples": lambda s: [
                ctx(t(2 * s, 6), shape=(12 * s,)),
                ctx(t(4, s, 3), shape=(-1, 3)),
                ctx(t(6 * s), shape=(2, 3, s)),
            ]
        },
    )
)

# -- Slice -------------------------------------------------------------------------


def _slice_bounds(x: TensorType, a) -> tuple[int, int, int]:
    axis = normalize_axis(a["axis"], x.rank)
    n = x.shape[axis]
    start, end = a["start"], a["end"]
    start = start + n if start < 0 else start
    end = n if end is None else (end + n if end < 0 else end)
    if not 0 <= start <= end <= n:
        raise TypeRuleError(f"slice [{a['start']}:{a['end']}] does not fit axis {axis} of size {n}")
    return axis, start, end


def _slice_types(c: TypeContext):
    x = tensor(c, 0, "x")
    axis, start, end = _slice_bounds(x, c.attributes)
    return [x.with_shape((*x.shape[:axis], end - start, *x.shape[axis + 1 :]))]


def _slice_kernel(xs, a):
    x = xs[0]
    axis = a["axis"] % x.ndim
    n = x.shape[axis]
    start = a["start"] + n if a["start"] < 0 else a["start"]
    end = n if a["end"] is None else (a["end"] + n if a["end"] < 0 else a["end"])
    return [np.take(x, np.arange(start, end), axis=axis)]


register_op(
    OpDef(
        name="Slice",
        operands=("x",),
        results=("y",),
        type_rule=_slice_types,
        kernel=_slice_kernel,
        cost_rule=memory_cost,
        attributes=(
            Attr("axis", doc="axis to slice"),
            Attr("start", doc="first index (negative counts from the end)"),
            Attr("end", None, "one past the last index; None means the end"),
        ),
        doc="The elements start..end-1 of x along axis.",
        extra={
            "examples": lambda s: [
                ctx(t(4 * s, 3), axis=0, start=s, end=3 * s),
                ctx(t(2, 5 * s), axis=-1, start=-2 * s, end=None),
            ]
        },
    )
)

# -- Concat and Split --------------------------------------------------------------


def _concat_types(c: TypeContext):
    xs = _flat_operands(c)
    first = xs[0]
    axis = normalize_axis(c.attributes["dim"], first.rank, "dim")
    rest = first.shape[:axis] + first.shape[axis + 1 :]
    for x in xs:
        if x.rank != first.rank or x.shape[:axis] + x.shape[axis + 1 :] != rest:
            raise TypeRuleError(f"shapes {first.shape} and {x.shape} differ off dim {axis}")
    total = sum(x.shape[axis] for x in xs)
    return [first.with_shape((*first.shape[:axis], total, *first.shape[axis + 1 :]))]


register_op(
    OpDef(
        name="Concat",
        operands=("xs",),
        results=("y",),
        type_rule=_concat_types,
        kernel=lambda xs, a: [np.concatenate(_flat_arrays(xs), axis=a["dim"])],
        cost_rule=memory_cost,
        attributes=(Attr("dim", 0, "axis to concatenate along"),),
        variadic=True,
        doc="Concatenate tensors on one device along dim; takes tensors or one tuple of them.",
        extra={
            "examples": lambda s: [
                ctx(t(s, 3), t(2 * s, 3), dim=0),
                ctx(TupleType((t(2, s), t(2, s + 1))), dim=1),
            ]
        },
    )
)


def _split_types(c: TypeContext):
    x = tensor(c, 0, "x")
    axis = normalize_axis(c.attributes["dim"], x.rank, "dim")
    k = c.attributes["partitions"]
    if not isinstance(k, int) or k < 1:
        raise TypeRuleError(f"partitions must be a positive integer, got {k!r}")
    if k > x.shape[axis]:
        raise TypeRuleError(
            f"splitting an axis of size {x.shape[axis]} into {k} parts leaves empty parts"
        )
    shapes = [(*x.shape[:axis], n, *x.shape[axis + 1 :]) for n in split_sizes(x.shape[axis], k)]
    return [TupleType(tuple(x.with_shape(shape) for shape in shapes))]


register_op(
    OpDef(
        name="Split",
        operands=("x",),
        results=("xs",),
        type_rule=_split_types,
        kernel=lambda xs, a: [tuple(split_array(xs[0], a["partitions"], a["dim"] % xs[0].ndim))],
        cost_rule=memory_cost,
        attributes=(
            Attr("partitions", doc="number of parts"),
            Attr("dim", 0, "axis to split"),
        ),
        doc="Split x along dim into a tuple of parts on x's device (the first n % k get one more).",
        extra={
            "examples": lambda s: [
                ctx(t(4 * s, 3), partitions=2),
                ctx(t(3, 2 * s + 1), partitions=2, dim=1),
            ]
        },
    )
)

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


def _reduce_sum_kernel(xs, a):
    x = xs[0]
    axes = a["axes"]
    axes = tuple(range(x.ndim)) if axes is None else axes
    return [np.sum(x, axis=axes, keepdims=bool(a["keepdims"])).astype(x.dtype)]


register_op(
    OpDef(
        name="ReduceSum",
        operands=("x",),
        results=("y",),
        type_rule=_reduce_sum_types,
        kernel=_reduce_sum_kernel,
        cost_rule=lambda c: memory_cost(c, c.input_types[0].num_elements),
        attributes=(
            Attr("axes", None, "axes to sum over; None sums over all of them"),
            Attr("keepdims", False, "keep the summed axes with size 1"),
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
        attributes=(Attr("shape", doc="result shape (numpy broadcasting)"),),
        doc="x broadcast to shape by numpy's rules (the gradient of ReduceSum).",
        extra={
            "examples": lambda s: [
                ctx(t(1, 3), shape=(2 * s, 3)),
                ctx(t(s), shape=(2, 3, s)),
            ]
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
        attributes=(Attr("dtype", doc="element type name of the result (float32, int64, ...)"),),
        doc="x converted to another element type.",
        extra={
            "examples": lambda s: [
                ctx(t(s, 3), dtype="float16"),
                ctx(t(2 * s, dtype=DType.int64), dtype="float32"),
            ]
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
    """Pairs of index lists (of a, of b) whose sizes multiply to the same number."""
    i = j = 0
    groups = []
    while i < len(a) or j < len(b):
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
            if pa == pb and (i == len(a) or a[i] != 1) and (j == len(b) or b[j] != 1):
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


def _concat_sharding(c: TypeContext) -> dict:
    xs = _flat_operands(c)
    dim = normalize_axis(c.attributes["dim"], xs[0].rank, "dim")
    r = fx.same_axes(c, whole=(dim,), partial_ops=fx.ALL_REDUCTIONS)
    r["linear"] = [tuple(range(len(c.input_types)))]
    return r


def _split_sharding(c: TypeContext) -> dict:
    return fx.same_axes(c, whole=(c.attributes["dim"],))


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
    return fx.rule([xf], [yf], linear=[(0,)], partial_ops=fx.ALL_REDUCTIONS)


fx.attach("Transpose", _transpose_sharding)
fx.attach("Reshape", _reshape_sharding)
fx.attach("Slice", lambda c: fx.same_axes(c, whole=(c.attributes["axis"],)))
fx.attach("Concat", _concat_sharding)
fx.attach("Split", _split_sharding)
fx.attach("Sum", _sum_sharding)
fx.attach("ReduceSum", _reduce_sum_sharding)
fx.attach("BroadcastTo", _broadcast_to_sharding)
fx.attach("Cast", lambda c: fx.same_axes(c, linear=()))


# -- gradient rules (autodiff) -------------------------------------------------------
# Data movement: the gradient moves dy back (inverse permutation, old shape, zero
# padding around a slice, slices of a concatenation); sums broadcast dy back.


def _attach_gradient_rules() -> None:
    from ..registry import attach_rule
    from ._grad import gname, unbroadcast, zeros

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

    def slice_(b, op, x, dy, name):
        axis, start, end = _slice_bounds(x.type, op.attributes)
        n = x.type.shape[axis]
        parts = []
        for k, (lo, hi) in enumerate(((0, start), (end, n))):
            if hi > lo:
                shape = (*x.type.shape[:axis], hi - lo, *x.type.shape[axis + 1 :])
                parts.append(zeros(b, x.type.with_shape(shape), f"{name}_pad{k}"))
        if not parts:
            return dy
        parts.insert(0 if start == 0 else 1, dy)
        return b.call("Concat", *parts, dim=axis, name=name)

    def reduce_sum(b, op, x, dy, name):
        axes = _axes(x.type, op.attributes["axes"])
        kept = tuple(1 if i in axes else d for i, d in enumerate(x.type.shape))
        if dy.type.shape != kept:
            dy = b.call("Reshape", dy, shape=kept, name=f"{name}_keep")
        return b.call("BroadcastTo", dy, shape=x.type.shape, name=name)

    def broadcast_to(b, op, x, dy, name):
        return unbroadcast(b, dy, x.type, name)

    def cast(b, op, x, dy, name):
        return b.call("Cast", dy, dtype=x.type.dtype.value, name=name)

    def pieces(b, op, ins, dy, name):
        """Slices of dy along dim, one per concatenated tensor (a tuple for a tuple operand)."""
        tensors = ins[0].type.elements if isinstance(ins[0].type, TupleType) else ins
        tensors = [getattr(t, "type", t) for t in tensors]
        axis = normalize_axis(op.attributes["dim"], tensors[0].rank, "dim")
        out, start = [], 0
        for k, part in enumerate(tensors):
            end = start + part.shape[axis]
            out.append(b.call("Slice", dy, axis=axis, start=start, end=end, name=f"{name}_{k}"))
            start = end
        return out

    def concat(b, op, ins, outs, dys):
        if dys[0] is None:
            return [None] * len(ins)
        parts = pieces(b, op, ins, dys[0], gname(outs[0]))
        if len(ins) == 1 and isinstance(ins[0].type, TupleType):
            return [b.call("MakeTuple", *parts, name=gname(ins[0]))]
        return parts

    def split(b, op, ins, outs, dys):
        (dxs,) = dys
        if dxs is None:
            return [None]
        (x,) = ins
        n = len(outs[0].type)
        parts = [b.call("TupleGet", dxs, index=i, name=f"{gname(x)}_{i}") for i in range(n)]
        return [b.call("Concat", *parts, dim=op.attributes["dim"], name=gname(x))]

    def sum_(b, op, ins, outs, dys):
        (dy,) = dys
        if dy is None:
            return [None] * len(ins)
        if len(ins) == 1 and isinstance(ins[0].type, TupleType):
            n = len(ins[0].type)
            return [b.call("MakeTuple", *([dy] * n), name=gname(ins[0]))]
        return [dy] * len(ins)

    attach_rule("Transpose", "gradient_rule", unary(transpose))
    attach_rule("Reshape", "gradient_rule", unary(reshape))
    attach_rule("Slice", "gradient_rule", unary(slice_))
    attach_rule("ReduceSum", "gradient_rule", unary(reduce_sum))
    attach_rule("BroadcastTo", "gradient_rule", unary(broadcast_to))
    attach_rule("Cast", "gradient_rule", unary(cast))
    attach_rule("Concat", "gradient_rule", concat)
    attach_rule("Split", "gradient_rule", split)
    attach_rule("Sum", "gradient_rule", sum_)


_attach_gradient_rules()
