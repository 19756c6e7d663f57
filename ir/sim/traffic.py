"""What a step's communication moves: bytes each device sends, by collective kind.

The closed forms of the parallel strategies are statements about bytes, not seconds:
data parallelism's ring all-reduce sends ``2 (n-1)/n`` of the gradient from each rank,
ZeRO-3 ``3 (n-1)/n`` of the weights (two all-gathers and a reduce-scatter), expert
parallelism's all-to-all ``(n-1)/n`` of each dispatched buffer, ring attention's KV
exchanges one block per step. :func:`traffic_bytes` counts them on a program as the
simulator's collective models move them (a ring for all-reduce, all-gather and
reduce-scatter; every other member's share for an all-to-all; the whole tensor for a
send), per device, so a test or a lesson can compare a strategy with its formula
without timing anything.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from ..function import Function
from ..op import Op
from ..registry import CostContext, OpKind, get_op

#: Of a collective's ``size_bytes`` (:class:`ir.collectives.Collective`), the share each
#: member sends over a group of ``n``.
_SHARE = {
    "allreduce": lambda n: 2 * (n - 1) / n,
    "allgather": lambda n: (n - 1) / n,
    "reducescatter": lambda n: (n - 1) / n,
    "alltoall": lambda n: (n - 1) / n,
}


def traffic_bytes(f: Function, kinds: Iterable[str] | None = None) -> dict[str, dict[int, float]]:
    """Collective kind -> device -> bytes it sends in one run of ``f``'s top level (the
    ops of a pmap body are local: a transform writes its transfers at the top level).

    ``kinds`` keeps only those kinds (``"allreduce"``, ``"allgather"``, ``"reducescatter"``,
    ``"alltoall"``, ``"send"``); a ``"local"`` transfer (``KeepShard``) sends nothing.
    Broadcasts, scatters, gathers and reduces count the whole tensor for the root.

    >>> import ir
    >>> f = ir.transforms.training(ir.models.mlp(8, 4, 4, 2, layers=2))
    >>> g = ir.transforms.megatron(f, 2)
    >>> sent = traffic_bytes(g)["allreduce"]
    >>> sent[0] == sent[1] == 2 * (2 - 1) / 2 * (4 * 4 + 4 * 2) * 4  # the weights, float32
    True
    """
    wanted = None if kinds is None else set(kinds)
    out: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for op in _top_level(f.ops):
        c = _collective(op)
        if c is None or c.kind == "local" or (wanted is not None and c.kind not in wanted):
            continue
        groups = c.groups or (c.devices,)
        if c.kind == "send":
            for pair in groups:
                out["send"][pair[0]] += c.size_bytes
            continue
        share = _SHARE.get(c.kind)
        for group in groups:
            members = tuple(dict.fromkeys(group))
            if share is not None:
                for d in members:
                    out[c.kind][d] += share(len(members)) * c.size_bytes
            elif c.root is not None:
                out[c.kind][c.root] += c.size_bytes
    return {k: dict(v) for k, v in out.items()}


def _top_level(ops):
    """The ops, each task's body in its place (a task runs its body once)."""
    for op in ops:
        if op.op_type == "Task":
            yield from _top_level(op.subfunctions[0].ops)
        else:
            yield op


def _collective(op: Op):
    opdef = get_op(op.op_type)
    if opdef.kind is not OpKind.COMMUNICATION or opdef.comm_rule is None:
        return None
    types_in = tuple(v.type for v in op.inputs)
    types_out = tuple(v.type for v in op.outputs)
    return opdef.comm_rule(CostContext(types_in, types_out, op.attributes))


__all__ = ["traffic_bytes"]
