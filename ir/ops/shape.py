"""Shape ops: transpose, reshape, slice, concat, split and cast (sums: ``reduce.py``).

They run on one device (``OpKind.COMPUTE``); moving data between devices is the
communication family's job. ``Split`` follows the uneven-split rule of
``communication.split_sizes`` (the first ``n % k`` parts get one element more),
and ``Concat`` accepts either several tensors or one tuple of them, as
the seeds write both (``concat(y_0, y_1, dim=0)`` and ``concat(ys, dim=0)``).
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import TypeRuleError
from ..registry import Attr, OpDef, TypeContext, register_op
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


fx.attach("Transpose", _transpose_sharding)
fx.attach("Reshape", _reshape_sharding)
fx.attach("Slice", lambda c: fx.same_axes(c, whole=(c.attributes["axis"],)))
fx.attach("Concat", _concat_sharding)
fx.attach("Split", _split_sharding)
fx.attach("Cast", lambda c: fx.same_axes(c, linear=()))


# -- gradient rules (autodiff) -------------------------------------------------------
# Data movement: the gradient moves dy back (inverse permutation, old shape, zero
# padding around a slice, slices of a concatenation).


def _attach_gradient_rules() -> None:
    from ..registry import attach_rule
    from ._grad import gname, zeros

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

    attach_rule("Transpose", "gradient_rule", unary(transpose))
    attach_rule("Reshape", "gradient_rule", unary(reshape))
    attach_rule("Slice", "gradient_rule", unary(slice_))
    attach_rule("Cast", "gradient_rule", unary(cast))
    attach_rule("Concat", "gradient_rule", concat)
    attach_rule("Split", "gradient_rule", split)


_attach_gradient_rules()
