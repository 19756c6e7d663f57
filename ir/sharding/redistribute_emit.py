"""Redistribution written into a program: the ops of each step of a plan
(:func:`ir.sharding.redistribute.plan`) on a value's per-device tuple.
"""

from __future__ import annotations

from ..builder import FunctionBuilder
from ..op import Op
from ..ops.communication import shard_sizes
from ..value import Value
from .mesh import Layout
from .redistribute import DistValue, Step, _after, _elem


def emit(
    b: FunctionBuilder, value: DistValue, step: Step, made: dict[tuple, Op] | None = None
) -> DistValue:
    """Append the ops of one step to ``b``; return the redistributed value.

    One op on the value's per-device tuple: ``KeepShard`` for a local slice (nothing
    moves), a collective for the rest, with ``groups`` (tuple positions) where the mesh
    axis has several groups. An all-to-all, which has no grouped form, runs per group.

    ``made``, when given, holds the first op of each (step, operand type, groups) that this
    program's emissions added: a repeat of one (the same redistribution in every layer)
    is added like it (:meth:`FunctionBuilder.add_like`), without asking the type rule
    again.
    """
    layout = value.layout
    mesh = layout.mesh
    name, after = value.name, _after(layout, step)
    groups = [[mesh.devices.index(d) for d in g] for g in mesh.groups(step.axis)]
    grouped = {"groups": groups} if len(groups) > 1 else {}
    # One op over the whole tuple takes pieces of one shape; uneven pieces (a tail block,
    # an axis split unevenly by another mesh axis) go per device or per group.
    uneven = len({_elem(t).shape for t in value.local_types}) > 1
    if step.kind == "slice" and (uneven or step.dst.block is not None):  # type: ignore[union-attr]
        return _slice_per_device(b, value, step, after)
    if step.kind == "alltoall" or uneven:
        return _per_group(b, value, step, groups, after, made)
    ys = _call(b, step, value.whole_in(b), name, grouped, made)
    return DistValue(None, after, value.type, whole=ys, name=name)


def _call(
    b: FunctionBuilder,
    step: Step,
    xs: Value,
    name: str,
    grouped: dict,
    made: dict[tuple, Op] | None = None,
) -> Value:
    """The one op of ``step`` on the per-device tuple ``xs`` (its groups in ``grouped``)."""
    op_type, attributes, suffix = _collective(step)
    names = [f"{name}_{suffix}"]
    key = None
    if made is not None:  # the step and the groups fix the attributes
        key = (step, xs.type, tuple([tuple(g) for g in grouped.get("groups", ())]))
        first = made.get(key)
        if first is not None:
            return b.add_like(first, [xs], names).outputs[0]
    op = b.add_op(op_type, [xs], {**attributes, **grouped}, names=names)
    if key is not None:
        made[key] = op  # type: ignore[index]
    return op.outputs[0]


def _collective(step: Step) -> tuple[str, dict, str]:
    """The op type, attributes (but groups) and result-name suffix of ``step``'s op."""
    src, dst = step.src, step.dst
    if step.kind == "slice":
        return "KeepShard", {"dim": dst.dim}, "kept"  # type: ignore[union-attr]
    if step.kind == "allgather":
        return "AllGather", {"dim": src.dim}, "gathered"  # type: ignore[union-attr]
    if step.kind == "allreduce":
        return "AllReduce", {"op": src.op}, "reduced"  # type: ignore[union-attr]
    if step.kind == "reducescatter":
        scattered = {"dim": dst.dim, "op": src.op}  # type: ignore[union-attr]
        return "ReduceScatter", scattered, "scattered"
    exchanged = {"split_dim": dst.dim, "concat_dim": src.dim}  # type: ignore[union-attr]
    return "AllToAll", exchanged, "exchanged"  # no grouped form: called per group


def _slice_per_device(b: FunctionBuilder, value: DistValue, step: Step, after: Layout) -> DistValue:
    """A local slice into fixed blocks with a short tail (``S(i, block=b)``), per device."""
    mesh = value.layout.mesh
    suffixes = [f"_{d}" for d in mesh.devices]
    dim = step.dst.dim  # type: ignore[union-attr]
    new = []
    for d, x in zip(mesh.devices, value.locals_in(b, suffixes)):
        n = _elem(x.type).shape[dim]
        sizes = shard_sizes(n, mesh.shape[step.axis], step.dst.block)  # type: ignore[union-attr]
        c = mesh.coord_of(d)[step.axis]
        start = sum(sizes[:c])
        new.append(
            b.call(
                "Slice", x, axis=dim, start=start, end=start + sizes[c], name=f"{value.name}_{d}"
            )
        )
    return DistValue(tuple(new), after, value.type, name=value.name)


def _per_group(
    b: FunctionBuilder,
    value: DistValue,
    step: Step,
    groups: list[list[int]],
    after: Layout,
    made: dict[tuple, Op] | None = None,
) -> DistValue:
    """The step's collective once per group of the mesh axis, on that group's pieces."""
    suffixes = [f"_{d}" for d in value.layout.mesh.devices]
    new = list(value.locals_in(b, suffixes))
    name = value.name
    for idx in groups:
        xs = b.call("MakeTuple", *(new[i] for i in idx), name=f"{name}_parts")
        ys = _call(b, step, xs, name, {}, made)
        for i, part in zip(idx, b.unpack(ys, [name + suffixes[i] for i in idx])):
            new[i] = part
    return DistValue(tuple(new), after, value.type, name=name)


__all__ = ["emit"]
