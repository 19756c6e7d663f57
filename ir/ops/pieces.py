"""Pieces of tensors: ``Slice``, ``Pad``, ``Concat`` and ``Split``.

They run on one device (``OpKind.COMPUTE``). ``Split`` follows the uneven-split
rule of ``communication.split_sizes`` (the first ``n % k`` parts get one element
more), and ``Concat`` (like ``Sum`` in ``reduce.py``) accepts either several
tensors or one tuple of them, as the seeds write both (``concat(y_0, y_1, dim=0)``
and ``concat(ys, dim=0)``).
"""

from __future__ import annotations

import numpy as np

from .. import attr_kinds as kinds
from ..errors import TypeRuleError
from ..registry import Attr, OpDef, TypeContext, register_op
from ..types import TensorType, TupleType
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
            Attr("axis", doc="axis to slice", kind=kinds.INT),
            Attr("start", doc="first index (negative counts from the end)", kind=kinds.INT),
            Attr(
                "end",
                None,
                "one past the last index; None means the end",
                kind=kinds.optional(kinds.INT),
            ),
        ),
        doc="The elements start..end-1 of x along axis.",
        extra={
            "keeps_values": True,  # its result holds its operands' elements
            "examples": lambda s: [
                ctx(t(4 * s, 3), axis=0, start=s, end=3 * s),
                ctx(t(2, 5 * s), axis=-1, start=-2 * s, end=None),
            ],
            # the attributes that may differ between the ranks of one rank class
            # (ir.sharding.rank_classes): a rank's offsets into a sharded value
            "rank_parameters": ("start", "end"),
        },
    )
)

# -- Pad ---------------------------------------------------------------------------
# ``Pad`` is ``Slice``'s gradient: zeros before and after x along one axis. Written as
# one op (not a Concat with zero Constants of fixed shape) it keeps the other axes'
# factors, so a split by heads passes a sliced rotary embedding's backward. Imported
# models pad with other values too (``value``: torch's ``constant_pad_nd``, ONNX's Pad).


def _pad_types(c: TypeContext):
    x = tensor(c, 0, "x")
    axis = normalize_axis(c.attributes["axis"], x.rank)
    before, after = c.attributes["before"], c.attributes["after"]
    if before < 0 or after < 0:
        raise TypeRuleError(f"pad sizes must be >= 0, got before={before}, after={after}")
    n = x.shape[axis] + before + after
    return [x.with_shape((*x.shape[:axis], n, *x.shape[axis + 1 :]))]


def _pad_kernel(xs, a):
    x = xs[0]
    widths = [(0, 0)] * x.ndim
    widths[a["axis"] % x.ndim] = (a["before"], a["after"])
    return [np.pad(x, widths, constant_values=np.asarray(a["value"]).astype(x.dtype))]


register_op(
    OpDef(
        name="Pad",
        operands=("x",),
        results=("y",),
        type_rule=_pad_types,
        kernel=_pad_kernel,
        cost_rule=memory_cost,
        attributes=(
            Attr("axis", doc="axis to pad", kind=kinds.INT),
            Attr("before", 0, "zeros put before x", kind=kinds.INT),
            Attr("after", 0, "zeros put after x", kind=kinds.INT),
            Attr("value", 0.0, "what is put (zeros by default)", kind=kinds.REAL),
        ),
        doc="x with before values (zeros unless told) in front and after behind along axis.",
        extra={
            "examples": lambda s: [
                ctx(t(2 * s, 3), axis=0, before=s, after=1),
                ctx(t(2, s), axis=-1, before=0, after=2 * s),
                ctx(t(s, 2, 3), axis=1, before=1, after=2, value=-1.5),
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
        attributes=(Attr("dim", 0, "axis to concatenate along", kind=kinds.INT),),
        variadic=True,
        doc="Concatenate tensors on one device along dim; takes tensors or one tuple of them.",
        extra={
            "keeps_values": True,  # its result holds its operands' elements
            "examples": lambda s: [
                ctx(t(s, 3), t(2 * s, 3), dim=0),
                ctx(TupleType((t(2, s), t(2, s + 1))), dim=1),
            ],
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
            Attr("partitions", doc="number of parts", kind=kinds.POS_INT),
            Attr("dim", 0, "axis to split", kind=kinds.INT),
        ),
        doc="Split x along dim into a tuple of parts on x's device (the first n % k get one more).",
        extra={
            "keeps_values": True,  # its result holds its operands' elements
            "examples": lambda s: [
                ctx(t(4 * s, 3), partitions=2),
                ctx(t(3, 2 * s + 1), partitions=2, dim=1),
            ],
        },
    )
)


# -- sharding rules ------------------------------------------------------------------
# The sliced, concatenated or split axis stays whole; Concat passes Partial values.


def _concat_sharding(c: TypeContext) -> dict:
    xs = _flat_operands(c)
    dim = normalize_axis(c.attributes["dim"], xs[0].rank, "dim")
    r = fx.same_axes(c, whole=(dim,), partial_ops=fx.ALL_REDUCTIONS)
    r["linear"] = [tuple(range(len(c.input_types)))]
    return r


def _split_sharding(c: TypeContext) -> dict:
    return fx.same_axes(c, whole=(c.attributes["dim"],))


fx.attach("Slice", lambda c: fx.same_axes(c, whole=(c.attributes["axis"],)))
fx.attach(
    "Pad",
    lambda c: fx.same_axes(
        c,
        whole=(c.attributes["axis"],),
        linear=((0,),) if c.attributes["value"] == 0 else (),  # a partial sum pads zeros only
        partial_ops=("sum",),
    ),
)
fx.attach("Concat", _concat_sharding)
fx.attach("Split", _split_sharding)


# -- gradient rules (autodiff) -------------------------------------------------------
# Zero padding around a slice, slices of a concatenation, a concatenation of pieces.


def _attach_gradient_rules() -> None:
    from ..registry import attach_rule
    from ._grad import gname

    def unary(fn):
        def rule(b, op, ins, outs, dys):
            return [None if dys[0] is None else fn(b, op, ins[0], dys[0], gname(ins[0]))]

        return rule

    def slice_(b, op, x, dy, name):
        axis, start, end = _slice_bounds(x.type, op.attributes)
        n = x.type.shape[axis]
        if (start, end) == (0, n):
            return dy
        return b.call("Pad", dy, axis=axis, before=start, after=n - end, name=name)

    def pad(b, op, x, dy, name):
        axis = normalize_axis(op.attributes["axis"], x.type.rank)
        start = op.attributes["before"]
        return b.call(
            "Slice", dy, axis=axis, start=start, end=start + x.type.shape[axis], name=name
        )

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

    attach_rule("Slice", "gradient_rule", unary(slice_))
    attach_rule("Pad", "gradient_rule", unary(pad))
    attach_rule("Concat", "gradient_rule", concat)
    attach_rule("Split", "gradient_rule", split)


_attach_gradient_rules()
