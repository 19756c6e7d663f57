"""Communication ops: explicit data movement between devices.

Per-device values are tuples (``Tuple[T@1, ..., T@N]``). Uneven splits follow
one rule everywhere (``split_sizes``): when ``n`` rows go to ``k`` devices, the
first ``n % k`` devices get one row more than the others. Layouts may instead
ask for fixed blocks with a short tail (``block_sizes``, placement ``S(i, b)``).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from operator import attrgetter

import numpy as np

from .. import attr_kinds as kinds
from ..collectives import Collective
from ..errors import TypeRuleError
from ..registry import (
    Attr,
    CostContext,
    OpDef,
    OpKind,
    TypeContext,
    attach_rule,
    register_op,
)
from ..types import Devices, TensorType, TupleType, uniform_tuple
from ._common import memory_cost, normalize_axis, tensor, tuple_operand
from ._examples import ctx, per_device, t

REDUCTIONS = {"sum": np.add, "max": np.maximum, "min": np.minimum, "mean": np.add}


def split_sizes(n: int, k: int) -> list[int]:
    """Sizes of ``k`` shards of ``n`` elements: the first ``n % k`` get one more."""
    base, extra = divmod(n, k)
    return [base + (1 if i < extra else 0) for i in range(k)]


def block_sizes(n: int, k: int, block: int) -> list[int]:
    """Sizes of ``k`` shards of ``n`` elements in fixed blocks of ``block`` with a short
    tail (the RFC's second convention: 66 in blocks of 64 over 2 devices is 64 + 2).

    Every shard must hold at least one element: ``(k - 1) * block < n <= k * block``.
    """
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise TypeRuleError(f"a shard block must be a positive integer, got {block!r}")
    if not (k - 1) * block < n <= k * block:
        raise TypeRuleError(
            f"{n} elements in blocks of {block} over {k} devices: the blocks must cover "
            f"them with a non-empty tail, {(k - 1) * block} < {n} <= {k * block}"
        )
    return [block] * (k - 1) + [n - (k - 1) * block]


def shard_sizes(n: int, k: int, block: int | None = None) -> list[int]:
    """``split_sizes`` (balanced) without ``block``, ``block_sizes`` with it."""
    return split_sizes(n, k) if block is None else block_sizes(n, k, block)


def split_array(x: np.ndarray, k: int, axis: int) -> list[np.ndarray]:
    bounds = np.cumsum([0, *split_sizes(x.shape[axis], k)])
    return [np.take(x, np.arange(bounds[i], bounds[i + 1]), axis=axis) for i in range(k)]


def _devices(ctx: TypeContext) -> tuple:
    devices = tuple(ctx.attributes["devices"])
    if not devices:
        raise TypeRuleError("devices must list at least one device")
    if len(set(devices)) != len(devices):
        raise TypeRuleError(f"devices lists a device twice: {list(devices)}")
    return devices


def _shards(t: TensorType, axis: int, devices: Sequence, what: str) -> TupleType:
    axis = normalize_axis(axis, t.rank, "dim")
    n, k = t.shape[axis], len(devices)
    if k > n:
        raise TypeRuleError(f"{what} of an axis of size {n} over {k} devices leaves empty shards")
    shapes = [(*t.shape[:axis], s, *t.shape[axis + 1 :]) for s in split_sizes(n, k)]
    return TupleType(tuple(TensorType(s, t.dtype, d) for s, d in zip(shapes, devices)))


def _uniform_tuple(ctx: TypeContext, i: int = 0) -> TupleType:
    """Operand ``i`` as a tuple whose elements are tensors of one dtype and rank."""
    xs = tuple_operand(ctx, i)
    if set(map(type, xs.elements)) != {TensorType}:  # one C pass over a tuple of 16,384
        for e in xs.elements:
            if not isinstance(e, TensorType):
                raise TypeRuleError(f"tuple elements must be tensors, got {e}")
    dtypes = set(map(attrgetter("dtype"), xs.elements))
    if len(dtypes) > 1:
        shown = ", ".join(sorted(d.value for d in dtypes))
        raise TypeRuleError(f"operands have different dtypes ({shown}); cast them first")
    if len({len(shape) for shape in set(map(attrgetter("shape"), xs.elements))}) > 1:
        raise TypeRuleError(f"tuple elements have different ranks: {xs}")
    return xs


def _same_shapes(xs: TupleType, what: str) -> None:
    shapes = {e.shape for e in xs.elements}
    if len(shapes) > 1:
        raise TypeRuleError(f"{what} needs one shape on every device, got {sorted(shapes)}")


def _concat_shape(xs: TupleType, axis: int) -> tuple[int, ...]:
    first = xs.elements[0]
    axis = normalize_axis(axis, first.rank, "dim")
    for e in xs.elements:
        if e.shape[:axis] + e.shape[axis + 1 :] != first.shape[:axis] + first.shape[axis + 1 :]:
            raise TypeRuleError(f"shapes {first.shape} and {e.shape} differ off dim {axis}")
    total = sum(e.shape[axis] for e in xs.elements)
    return (*first.shape[:axis], total, *first.shape[axis + 1 :])


def _reduce(parts: Sequence[np.ndarray], op: str) -> np.ndarray:
    if op not in REDUCTIONS:
        raise ValueError(f"unknown reduction {op!r} (one of {sorted(REDUCTIONS)})")
    out = parts[0]
    for p in parts[1:]:
        out = REDUCTIONS[op](out, p)
    return out / len(parts) if op == "mean" else out


def _check_reduction(ctx: TypeContext) -> str:
    op = ctx.attributes["op"]
    if op not in REDUCTIONS:
        raise TypeRuleError(f"op must be one of {sorted(REDUCTIONS)}, got {op!r}")
    return op


def element_groups(groups, n: int) -> list[list[int]]:
    """The ``groups`` attribute of a grouped collective checked against a tuple of ``n``:
    lists of element positions, disjoint, covering ``0..n-1``; ``None`` is one group."""
    if groups is None:
        return [list(range(n))]
    try:
        out = [list(g) if set(map(type, g)) == {int} else [int(i) for i in g] for g in groups]
    except TypeError:
        raise TypeRuleError(f"groups must be lists of tuple positions, got {groups!r}") from None
    seen = sorted(chain.from_iterable(out))  # in C: a group per device of 16,384 is common
    if seen != list(range(n)) or not all(out):
        raise TypeRuleError(
            f"groups {groups!r} must split the {n} tuple positions 0..{n - 1} into "
            "non-empty disjoint groups"
        )
    return out


def _per_group(xs: TupleType, groups, fn) -> TupleType:
    """The tuple whose group members get ``fn(members' types)`` (a list, in member order)."""
    out: list = [None] * len(xs.elements)
    for g in element_groups(groups, len(xs.elements)):
        for i, typ in zip(g, fn(TupleType(tuple(xs.elements[i] for i in g)))):
            out[i] = typ
    return TupleType(tuple(out))


def _grouped_kernel(fn):
    """A kernel on a tuple run on each group (``fn(parts, attributes) -> parts``)."""

    def kernel(xs, a):
        parts = xs[0]
        out: list = [None] * len(parts)
        for g in element_groups(a.get("groups"), len(parts)):
            for i, y in zip(g, fn([parts[i] for i in g], a)):
                out[i] = y
        return [tuple(out)]

    return kernel


_GROUPS = Attr(
    "groups",
    None,
    "element positions of each group (one collective per group, all at once); None: one group",
    kind=kinds.GROUPS,
)


def _comm(
    name: str,
    operands,
    results,
    type_rule,
    kernel,
    attributes=(),
    doc="",
    aliases=(),
    examples=None,
):
    return register_op(
        OpDef(
            name=name,
            operands=operands,
            results=results,
            type_rule=type_rule,
            kernel=kernel,
            cost_rule=memory_cost,
            attributes=attributes,
            kind=OpKind.COMMUNICATION,
            aliases=aliases,
            doc=doc,
            extra={"examples": examples},
        )
    )


_TO_DEVICE = Attr("to_device", doc="destination device", aliases=("device",), kind=kinds.DEVICE)
_DEVICES = Attr("devices", doc="destination devices, in tuple order", kind=kinds.DEVICES)
_DIM = Attr("dim", 0, "tensor axis", kind=kinds.INT)
_OP = Attr("op", "sum", "reduction: sum, mean, max or min", kind=kinds.REDUCTION)
_STREAM = Attr(
    "stream",
    "comm",
    "where the collective runs: 'comm', its own stream, overlapping compute; 'compute', "
    "the compute stream, holding every participant's compute while it runs (a gradient "
    "all-reduce issued after the backward, as Megatron-LM does without "
    "--overlap-grad-reduce). Timing only: the values are the same",
    kind=kinds.one_of("comm", "compute"),
)

# -- point to point --------------------------------------------------------------

_comm(
    "Send",
    ("x",),
    ("y",),
    lambda ctx: [tensor(ctx, 0).with_device(ctx.attributes["to_device"])],
    lambda xs, a: [xs[0]],
    (_TO_DEVICE,),
    "Copy a tensor to another device.",
    examples=lambda s: [ctx(t(2 * s, 3), to_device=1), ctx(t(s), to_device=2)],
)


def _send_each_types(ctx: TypeContext):
    xs = tuple_operand(ctx, 0)
    to = list(ctx.attributes["to_devices"])
    if len(to) != len(xs.elements):
        raise TypeRuleError(f"to_devices lists {len(to)} devices for a tuple of {len(xs.elements)}")
    if len(set(to)) != len(to):
        raise TypeRuleError(f"to_devices lists a device twice: {to}")
    for e in xs.elements:
        if not isinstance(e, TensorType):
            raise TypeRuleError(f"tuple elements must be tensors, got {e}")
    shapes, dtypes = map(attrgetter("shape"), xs.elements), map(attrgetter("dtype"), xs.elements)
    if len(set(zip(shapes, dtypes))) == 1:  # one tensor on every device: the shared tuple
        return [uniform_tuple(xs.elements[0].with_device(None), Devices(to))]
    return [TupleType(tuple(e.with_device(d) for e, d in zip(xs.elements, to)))]


_comm(
    "SendEach",
    ("xs",),
    ("ys",),
    _send_each_types,
    lambda xs, a: [tuple(x.copy() for x in xs[0])],
    (Attr("to_devices", doc="destination of each element, in tuple order", kind=kinds.DEVICES),),
    "Send element i of a per-device tuple to to_devices[i], all pairs at once (a pipeline "
    "stage's activations to the next stage's devices).",
    examples=lambda s: [
        ctx(per_device(s, 3), to_devices=(2, 3)),
        ctx(per_device(2 * s, devices=(1, 2, 3)), to_devices=(4, 5, 6)),
    ],
)

# -- one to many -----------------------------------------------------------------

_comm(
    "Scatter",
    ("x",),
    ("xs",),
    lambda ctx: [_shards(tensor(ctx, 0), ctx.attributes["dim"], _devices(ctx), "scatter")],
    lambda xs, a: [tuple(split_array(xs[0], len(a["devices"]), a["dim"]))],
    (_DIM, _DEVICES),
    "Split a tensor along dim; shard i goes to devices[i] (uneven: first n % k get one more).",
    examples=lambda s: [
        ctx(t(4 * s, 3), devices=(1, 2)),
        ctx(t(2, 3 * s + 1), dim=1, devices=(1, 2, 3)),
    ],
)
_comm(
    "Broadcast",
    ("x",),
    ("xs",),
    lambda ctx: [TupleType(tuple(tensor(ctx, 0).with_device(d) for d in _devices(ctx)))],
    lambda xs, a: [tuple(xs[0].copy() for _ in a["devices"])],
    (_DEVICES,),
    "Copy a tensor to every device in devices.",
    examples=lambda s: [ctx(t(2 * s, 3), devices=(1, 2)), ctx(t(s), devices=(0, 1, 2))],
)

# -- many to one -----------------------------------------------------------------


def _gather_types(ctx: TypeContext):
    xs = _uniform_tuple(ctx)
    shape = _concat_shape(xs, ctx.attributes["dim"])
    return [xs.elements[0].with_shape(shape).with_device(ctx.attributes["to_device"])]


_comm(
    "Gather",
    ("xs",),
    ("x",),
    _gather_types,
    lambda xs, a: [np.concatenate(xs[0], axis=a["dim"])],
    (_DIM, _TO_DEVICE),
    "Concatenate per-device shards along dim on one device.",
    examples=lambda s: [
        ctx(per_device(s, 3), to_device=0),
        ctx(TupleType((t(2, s + 1, device=1), t(2, s, device=2))), dim=1, to_device=1),
    ],
)


def _reduce_types(ctx: TypeContext):
    xs = _uniform_tuple(ctx)
    _same_shapes(xs, "reduce")
    _check_reduction(ctx)
    return [xs.elements[0].with_device(ctx.attributes["to_device"])]


_comm(
    "Reduce",
    ("xs",),
    ("x",),
    _reduce_types,
    lambda xs, a: [_reduce(xs[0], a["op"])],
    (_TO_DEVICE, _OP),
    "Combine per-device tensors elementwise (sum, mean, max, min) onto one device.",
    examples=lambda s: [
        ctx(per_device(2 * s, 3), to_device=0),
        ctx(per_device(s, devices=(1, 2, 3)), to_device=1, op="max"),
    ],
)

# -- collectives -----------------------------------------------------------------


def _allreduce_types(ctx: TypeContext):
    xs = _uniform_tuple(ctx)
    _same_shapes(xs, "allreduce")
    _check_reduction(ctx)
    element_groups(ctx.attributes.get("groups"), len(xs))
    return [xs]


_comm(
    "AllReduce",
    ("xs",),
    ("ys",),
    _allreduce_types,
    _grouped_kernel(lambda parts, a: [_reduce(parts, a["op"]) for _ in parts]),
    (_OP, _GROUPS, _STREAM),
    "Every device gets the elementwise reduction of all devices' tensors.",
    examples=lambda s: [
        ctx(per_device(2 * s, 3)),
        ctx(per_device(s, devices=(1, 2, 3)), op="mean"),
    ],
)


def _allgather_types(ctx: TypeContext):
    xs = _uniform_tuple(ctx)

    def gathered(group: TupleType) -> list:
        shape = _concat_shape(group, ctx.attributes["dim"])
        return [e.with_shape(shape) for e in group.elements]

    return [_per_group(xs, ctx.attributes.get("groups"), gathered)]


_comm(
    "AllGather",
    ("xs",),
    ("ys",),
    _allgather_types,
    _grouped_kernel(lambda parts, a: [np.concatenate(parts, axis=a["dim"]) for _ in parts]),
    (_DIM, _GROUPS),
    "Every device gets the concatenation of all devices' shards along dim.",
    examples=lambda s: [ctx(per_device(s, 3)), ctx(per_device(2, s, devices=(1, 2, 3)), dim=1)],
)


def _reducescatter_types(ctx: TypeContext):
    xs = _uniform_tuple(ctx)
    _same_shapes(xs, "reducescatter")
    _check_reduction(ctx)

    def scattered(group: TupleType) -> list:
        shards = _shards(group.elements[0], ctx.attributes["dim"], group.devices, "reducescatter")
        return list(shards.elements)

    return [_per_group(xs, ctx.attributes.get("groups"), scattered)]


_comm(
    "ReduceScatter",
    ("xs",),
    ("ys",),
    _reducescatter_types,
    _grouped_kernel(lambda parts, a: split_array(_reduce(parts, a["op"]), len(parts), a["dim"])),
    (_DIM, _OP, _GROUPS, _STREAM),
    "Reduce across devices, then device i keeps shard i along dim.",
    examples=lambda s: [ctx(per_device(2 * s, 3)), ctx(per_device(3, 2 * s + 1), dim=1)],
)


def _keepshard_types(ctx: TypeContext):
    xs = _uniform_tuple(ctx)
    _same_shapes(xs, "keepshard")

    def kept(group: TupleType) -> list:
        shards = _shards(group.elements[0], ctx.attributes["dim"], group.devices, "keepshard")
        return list(shards.elements)

    return [_per_group(xs, ctx.attributes.get("groups"), kept)]


_comm(
    "KeepShard",
    ("xs",),
    ("ys",),
    _keepshard_types,
    _grouped_kernel(
        lambda parts, a: [split_array(x, len(parts), a["dim"])[i] for i, x in enumerate(parts)]
    ),
    (_DIM, _GROUPS),
    "Each device keeps shard i (its position i in its group) of its own copy of a replicated "
    "tensor along dim; nothing moves (a scatter into a sequence-parallel region, a ZeRO "
    "replica's parameter shard).",
    examples=lambda s: [ctx(per_device(2 * s, 3)), ctx(per_device(3, 2 * s + 1), dim=1)],
)


def _alltoall_types(ctx: TypeContext):
    xs = _uniform_tuple(ctx)

    def exchanged(group: TupleType) -> list:
        _same_shapes(group, "alltoall")
        first = group.elements[0]
        split = normalize_axis(ctx.attributes["split_dim"], first.rank, "split_dim")
        concat = normalize_axis(ctx.attributes["concat_dim"], first.rank, "concat_dim")
        k = len(group)
        if first.shape[split] % k:
            raise TypeRuleError(
                f"alltoall splits dim {split} of size {first.shape[split]} into {k} equal parts"
            )
        shape = list(first.shape)
        shape[split] //= k
        shape[concat] *= k
        return [e.with_shape(tuple(shape)) for e in group.elements]

    return [_per_group(xs, ctx.attributes.get("groups"), exchanged)]


def _alltoall_group(parts, a):
    pieces = [split_array(x, len(parts), a["split_dim"]) for x in parts]
    k = len(pieces)
    return [
        np.concatenate([pieces[src][dst] for src in range(k)], a["concat_dim"]) for dst in range(k)
    ]


_alltoall_kernel = _grouped_kernel(_alltoall_group)


_comm(
    "AllToAll",
    ("xs",),
    ("ys",),
    _alltoall_types,
    _alltoall_kernel,
    (Attr("split_dim", 0, kind=kinds.INT), Attr("concat_dim", 0, kind=kinds.INT), _GROUPS),
    "Device i sends its j-th chunk (along split_dim) to device j, which concatenates "
    "the chunks it receives along concat_dim in device order (within each group).",
    examples=lambda s: [
        ctx(per_device(2 * s, 4), split_dim=0, concat_dim=1),
        ctx(per_device(3, 3 * s, devices=(1, 2, 3)), split_dim=1, concat_dim=0),
        ctx(per_device(2 * s, 2, devices=(0, 1, 2, 3)), concat_dim=1, groups=[[0, 2], [1, 3]]),
    ],
)

# -- communication cost rules (simulator) ------------------------------------------
# Each comm_rule maps an op's (device-bound) types to the Collective it performs, so
# that ir.sim and ir.collectives cost every communication op without naming it.


def _tensor_devices(t) -> tuple:
    return tuple(e.device for e in t.elements)


def _send_comm(c: CostContext) -> Collective:
    (x,), (y,) = c.input_types, c.output_types
    return Collective("send", x.size_bytes, (x.device, y.device), y.device)


def _one_to_many_comm(kind: str):
    def rule(c: CostContext) -> Collective:
        (x,), (ys,) = c.input_types, c.output_types
        return Collective(kind, x.size_bytes, _tensor_devices(ys), x.device)

    return rule


def _gather_comm(c: CostContext) -> Collective:
    (xs,), (y,) = c.input_types, c.output_types
    return Collective("gather", y.size_bytes, _tensor_devices(xs), y.device)


def _reduce_comm(c: CostContext) -> Collective:
    (xs,), (y,) = c.input_types, c.output_types
    return Collective("reduce", y.size_bytes, _tensor_devices(xs), y.device)


def _ring_comm(kind: str, full_size_from_output: bool):
    def rule(c: CostContext) -> Collective:
        (xs,), (ys,) = c.input_types, c.output_types
        full = ys.elements[0] if full_size_from_output else xs.elements[0]
        devices = _tensor_devices(xs)
        groups = c.attributes.get("groups")
        if groups is None or len(groups) == 1:
            return Collective(kind, full.size_bytes, devices)
        by_group = tuple(tuple(devices[i] for i in g) for g in groups)
        return Collective(kind, full.size_bytes, by_group[0], groups=by_group)

    return rule


def _keepshard_comm(c: CostContext) -> Collective:
    devices = _tensor_devices(c.input_types[0])
    groups = c.attributes.get("groups")
    if groups is None or len(groups) == 1:
        return Collective("local", 0, devices)
    by_group = tuple(tuple(devices[i] for i in g) for g in groups)
    return Collective("local", 0, by_group[0], groups=by_group)


attach_rule("KeepShard", "comm_rule", _keepshard_comm)
attach_rule("Send", "comm_rule", _send_comm)


def _send_each_comm(c: CostContext) -> Collective:
    (xs,), (ys,) = c.input_types, c.output_types
    pairs = tuple((x.device, y.device) for x, y in zip(xs.elements, ys.elements))
    size = max(x.size_bytes for x in xs.elements)
    return Collective("send", size, pairs[0], pairs[0][1], groups=pairs if len(pairs) > 1 else ())


attach_rule("SendEach", "comm_rule", _send_each_comm)
attach_rule("Scatter", "comm_rule", _one_to_many_comm("scatter"))
attach_rule("Broadcast", "comm_rule", _one_to_many_comm("broadcast"))
attach_rule("Gather", "comm_rule", _gather_comm)
attach_rule("Reduce", "comm_rule", _reduce_comm)
attach_rule("AllReduce", "comm_rule", _ring_comm("allreduce", False))
attach_rule("AllGather", "comm_rule", _ring_comm("allgather", True))  # S: the gathered tensor
attach_rule("ReduceScatter", "comm_rule", _ring_comm("reducescatter", False))
attach_rule("AllToAll", "comm_rule", _ring_comm("alltoall", False))


# -- gradient rules (autodiff) -------------------------------------------------------
# Each movement's gradient moves dy back: Send returns it, Scatter's is a Gather,
# Broadcast's a Reduce(sum), AllReduce(sum)'s an AllReduce(sum), AllGather's a
# ReduceScatter(sum), AllToAll's the AllToAll with the dims swapped. max/min
# reductions have no gradient rule here.


def _attach_gradient_rules() -> None:
    from ..errors import DistIRError
    from ._grad import gname

    def linear_only(op):
        if op.attributes.get("op", "sum") not in ("sum", "mean"):
            raise DistIRError(
                f"{op.op_type}(op={op.attributes['op']!r}) has no gradient rule; only sum "
                "and mean reductions are differentiable"
            )
        return op.attributes.get("op", "sum")

    def send(b, op, ins, outs, dys):
        (dy,), (x,) = dys, ins
        return [None if dy is None else b.call("Send", dy, to_device=x.type.device, name=gname(x))]

    def scatter(b, op, ins, outs, dys):
        (dys_,), (x,) = dys, ins
        if dys_ is None:
            return [None]
        dim = op.attributes["dim"]
        return [b.call("Gather", dys_, dim=dim, to_device=x.type.device, name=gname(x))]

    def broadcast(b, op, ins, outs, dys):
        (dys_,), (x,) = dys, ins
        if dys_ is None:
            return [None]
        return [b.call("Reduce", dys_, to_device=x.type.device, op="sum", name=gname(x))]

    def gather(b, op, ins, outs, dys):
        (dy,), (xs,) = dys, ins
        if dy is None:
            return [None]
        dim = normalize_axis(op.attributes["dim"], dy.type.rank, "dim")
        sizes = [e.shape[dim] for e in xs.type.elements]
        if sizes == split_sizes(dy.type.shape[dim], len(sizes)):
            return [b.call("Scatter", dy, dim=dim, devices=xs.type.devices, name=gname(xs))]
        parts, start = [], 0
        for k, (e, n) in enumerate(zip(xs.type.elements, sizes)):
            piece = b.call(
                "Slice", dy, axis=dim, start=start, end=start + n, name=f"{gname(xs)}_{k}_rows"
            )
            parts.append(b.call("Send", piece, to_device=e.device, name=f"{gname(xs)}_{k}"))
            start += n
        return [b.call("MakeTuple", *parts, name=gname(xs))]

    def reduce(b, op, ins, outs, dys):
        (dy,), (xs,) = dys, ins
        if dy is None:
            return [None]
        if linear_only(op) == "mean":
            dy = b.call("Scale", dy, factor=1.0 / len(xs.type), name=f"{gname(xs)}_mean")
        return [b.call("Broadcast", dy, devices=xs.type.devices, name=gname(xs))]

    def send_each(b, op, ins, outs, dys):
        (dys_,), (xs,) = dys, ins
        if dys_ is None:
            return [None]
        return [b.call("SendEach", dys_, to_devices=list(xs.type.devices), name=gname(xs))]

    def allreduce(b, op, ins, outs, dys):
        (dys_,), (xs,) = dys, ins
        if dys_ is None:
            return [None]
        groups = op.attributes.get("groups")
        return [b.call("AllReduce", dys_, op=linear_only(op), groups=groups, name=gname(xs))]

    def allgather(b, op, ins, outs, dys):
        (dys_,), (xs,) = dys, ins
        if dys_ is None:
            return [None]
        dim = op.attributes["dim"]
        groups = op.attributes.get("groups")
        return [b.call("ReduceScatter", dys_, dim=dim, op="sum", groups=groups, name=gname(xs))]

    def reducescatter(b, op, ins, outs, dys):
        (dys_,), (xs,) = dys, ins
        if dys_ is None:
            return [None]
        if linear_only(op) != "sum":
            raise DistIRError("ReduceScatter(op='mean') has no gradient rule; use sum")
        groups = op.attributes.get("groups")
        dim = op.attributes["dim"]
        return [b.call("AllGather", dys_, dim=dim, groups=groups, name=gname(xs))]

    def alltoall(b, op, ins, outs, dys):
        (dys_,), (xs,) = dys, ins
        if dys_ is None:
            return [None]
        a = op.attributes
        return [
            b.call(
                "AllToAll",
                dys_,
                split_dim=a["concat_dim"],
                concat_dim=a["split_dim"],
                groups=a.get("groups"),
                name=gname(xs),
            )
        ]

    for name, rule in [
        ("Send", send),
        ("SendEach", send_each),
        ("Scatter", scatter),
        ("Broadcast", broadcast),
        ("Gather", gather),
        ("Reduce", reduce),
        ("AllReduce", allreduce),
        ("AllGather", allgather),
        ("ReduceScatter", reducescatter),
        ("AllToAll", alltoall),
    ]:
        attach_rule(name, "gradient_rule", rule)


_attach_gradient_rules()
