"""Lowering of the communication ops of a global program to rank programs.

Each communication op's ``lower_rule`` (attached to its registry record here, on
import) turns one global op of that type into ops of the ranks it involves: a
transfer becomes a ``SendTo`` on the sender and a ``RecvFrom`` on the receiver (a
transfer within one rank is no op at all), a scatter slices on its source before
sending, a gather or reduction receives on its destination and concatenates
(``Concat``) or adds (``Sum``) there, and a tuple collective becomes one
``RankCollective`` per member, for each group of a grouped collective. Every rank
meets its transfers and collectives in the global program's order, so the ranks
never wait on each other in a cycle.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from ..ops.communication import element_groups, split_sizes
from ..registry import attach_rule
from ..value import Value
from ..verify import describe_op
from .errors import LoweringError
from .lower import _is_single


def move(low, src: int, local: Value, dst: int, name: str) -> tuple[int, Value]:
    """``local`` of rank ``src`` on rank ``dst``: a matched SendTo / RecvFrom pair."""
    if src == dst:
        return (dst, local)
    tag = low.next_tag()
    t = local.type
    low.rank(src).call("SendTo", local, peer=dst, tag=tag, name=f"{local.name}_sent")
    got = low.rank(dst).call(
        "RecvFrom", peer=src, tag=tag, shape=list(t.shape), dtype=t.dtype.value, name=name
    )
    return (dst, got)


def _elements(low, op) -> list[tuple[int, Value]]:
    """The per-device tuple operand of ``op`` as one (rank, local tensor) per element."""
    rep = low.local(op.inputs[0])
    if _is_single(rep) or not all(_is_single(e) for e in rep):
        raise LoweringError(f"{describe_op(op)}: expected a tuple of tensors, one per device")
    return list(rep)


def _send(low, op) -> None:
    src, local = low.single(op.inputs[0], op)
    low.rep[op.outputs[0]] = move(low, src, local, op.attributes["to_device"], op.outputs[0].name)


def _send_each(low, op) -> None:
    name = op.outputs[0].name
    low.rep[op.outputs[0]] = tuple(
        move(low, r, local, dst, f"{name}_{i}")
        for i, ((r, local), dst) in enumerate(zip(_elements(low, op), op.attributes["to_devices"]))
    )


def _broadcast(low, op) -> None:
    src, local = low.single(op.inputs[0], op)
    name = op.outputs[0].name
    low.rep[op.outputs[0]] = tuple(
        move(low, src, local, d, f"{name}_{i}") for i, d in enumerate(op.attributes["devices"])
    )


def _slice(low, r: int, local: Value, dim: int, parts: int, index: int, name: str) -> Value:
    if parts == 1:
        return local
    sizes = split_sizes(local.type.shape[dim], parts)
    start = sum(sizes[:index])
    return low.rank(r).call(
        "Slice", local, axis=dim, start=start, end=start + sizes[index], name=name
    )


def _scatter(low, op) -> None:
    src, local = low.single(op.inputs[0], op)
    devices, dim = op.attributes["devices"], op.attributes["dim"]
    name = op.outputs[0].name
    out = []
    for i, d in enumerate(devices):
        piece = _slice(low, src, local, dim, len(devices), i, f"{name}_{i}_rows")
        out.append(move(low, src, piece, d, f"{name}_{i}"))
    low.rep[op.outputs[0]] = tuple(out)


def _collected(low, op) -> tuple[int, list[Value]]:
    dst = op.attributes["to_device"]
    name = op.outputs[0].name
    parts = [
        move(low, r, local, dst, f"{name}_part{i}")[1]
        for i, (r, local) in enumerate(_elements(low, op))
    ]
    return dst, parts


def _gather(low, op) -> None:
    dst, parts = _collected(low, op)
    b = low.rank(dst)
    y = b.call("Concat", *parts, dim=op.attributes["dim"], name=op.outputs[0].name)
    low.rep[op.outputs[0]] = (dst, y)


def _reduce(low, op) -> None:
    how = op.attributes["op"]
    if how not in ("sum", "mean"):
        raise LoweringError(
            f"cannot lower {describe_op(op)}: a reduction by {how!r} inside a program has no "
            "rank op (sum and mean do); reduce to the outputs instead"
        )
    dst, parts = _collected(low, op)
    b = low.rank(dst)
    name = op.outputs[0].name
    y = b.call("Sum", *parts, name=name) if len(parts) > 1 else parts[0]
    if how == "mean":
        y = b.call("Scale", y, factor=1.0 / len(parts), name=f"{name}_mean")
    low.rep[op.outputs[0]] = (dst, y)


def _keep_shard(low, op) -> None:
    reps = _elements(low, op)
    dim, name = op.attributes["dim"], op.outputs[0].name
    out: list[Any] = [None] * len(reps)
    for group in element_groups(op.attributes.get("groups"), len(reps)):
        for pos, i in enumerate(group):
            r, local = reps[i]
            out[i] = (r, _slice(low, r, local, dim, len(group), pos, f"{name}_{r}"))
    low.rep[op.outputs[0]] = tuple(out)


def _collective(low, op, kind: str) -> None:
    a = op.attributes
    reps = _elements(low, op)
    outs = op.outputs[0].type.elements
    attrs: dict[str, Any] = {"kind": kind}
    if "op" in a:
        attrs["op"] = a["op"]
    if kind in ("allgather", "reducescatter"):
        attrs["dim"] = a["dim"]
    if kind == "alltoall":
        attrs["dim"], attrs["concat_dim"] = a["split_dim"], a["concat_dim"]
    new: list[Any] = [None] * len(reps)
    for members in element_groups(a.get("groups"), len(reps)):
        group = [reps[i][0] for i in members]
        if len(set(group)) != len(group):
            raise LoweringError(
                f"cannot lower {describe_op(op)}: a collective group holds rank "
                f"{max(group, key=group.count)} twice ({group})"
            )
        tag = low.next_tag()
        for i in members:
            r, local = reps[i]
            y = low.rank(r).call(
                "RankCollective",
                local,
                **attrs,
                group=group,
                tag=tag,
                result_shape=list(outs[i].shape),
                name=op.outputs[0].name,
            )
            new[i] = (r, y)
    low.rep[op.outputs[0]] = tuple(new)


for _name, _rule in (
    ("Send", _send),
    ("SendEach", _send_each),
    ("Broadcast", _broadcast),
    ("Scatter", _scatter),
    ("Gather", _gather),
    ("Reduce", _reduce),
    ("KeepShard", _keep_shard),
    ("AllReduce", partial(_collective, kind="allreduce")),
    ("AllGather", partial(_collective, kind="allgather")),
    ("ReduceScatter", partial(_collective, kind="reducescatter")),
    ("AllToAll", partial(_collective, kind="alltoall")),
):
    attach_rule(_name, "lower_rule", _rule)
