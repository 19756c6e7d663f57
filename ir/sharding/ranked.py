"""Running ranked programs together, and finding deadlocks.

Each rank is a numpy "process": a program counter over its ops and its own
values. A deterministic round-robin scheduler runs every rank's local ops until
it reaches a communication op, then matches them across ranks: ``SendTo(peer=q)``
with ``RecvFrom(peer=p)`` of the same tag (a rendezvous: both block until the
other arrives, as a synchronous send), and a ``RankCollective`` when every
member of its group has reached it. When no rank can move and some have not
finished, the ranks wait on each other: :class:`DeadlockError` names the cycle
of ranks and the ops they wait at (seed 004's caveat about reordering
communication inside one ranked program).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ExecutionError
from ..function import Function
from ..registry import get_op
from ..verify import describe_op
from .errors import DeadlockError
from .lower import RankedProgram

_COMM = ("SendTo", "RecvFrom", "RankCollective")
_KERNEL = {
    "allreduce": ("AllReduce", lambda a: {"op": a["op"]}),
    "allgather": ("AllGather", lambda a: {"dim": a["dim"]}),
    "reducescatter": ("ReduceScatter", lambda a: {"dim": a["dim"], "op": a["op"]}),
    "alltoall": ("AllToAll", lambda a: {"split_dim": a["dim"], "concat_dim": a["concat_dim"]}),
}


@dataclass(frozen=True)
class Matching:
    """What a deadlock-free run matched: send/recv pairs and collectives."""

    messages: tuple[tuple[int, int, int], ...]  # (sender, receiver, tag)
    collectives: tuple[tuple[str, tuple[int, ...], int], ...]  # (kind, group, tag)


class _Rank:
    def __init__(self, rank: int, program: Function, args: Sequence[Any] | None) -> None:
        self.rank = rank
        self.program = program
        self.pc = 0
        self.env: dict = dict(zip(program.inputs, args)) if args is not None else {}

    @property
    def done(self) -> bool:
        return self.pc >= len(self.program.ops)

    @property
    def op(self):
        return None if self.done else self.program.ops[self.pc]


def _programs(ranked: RankedProgram | Mapping[int, Function]) -> dict[int, Function]:
    return dict(ranked.programs if isinstance(ranked, RankedProgram) else ranked)


def schedule(
    ranked: RankedProgram | Mapping[int, Function],
    args: Mapping[int, Sequence[Any]] | None = None,
) -> tuple[dict[int, tuple], Matching]:
    """Run (``args`` given) or only match (``args`` None) the ranks' programs together."""
    run = args is not None
    ranks = {r: _Rank(r, p, args[r] if run else None) for r, p in sorted(_programs(ranked).items())}
    messages, collectives = [], []
    while True:
        progress = False
        for st in ranks.values():
            while not st.done and st.op.op_type not in _COMM:
                if run:
                    _local(st)
                st.pc += 1
                progress = True
        for st in ranks.values():
            op = st.op
            if op is None:
                continue
            if op.op_type == "SendTo":
                peer = ranks.get(op.attributes["peer"])
                other = peer.op if peer is not None else None
                if (
                    other is not None
                    and other.op_type == "RecvFrom"
                    and other.attributes["peer"] == st.rank
                    and other.attributes["tag"] == op.attributes["tag"]
                ):
                    _check_message(st, op, peer, other)
                    if run:
                        peer.env[other.outputs[0]] = st.env[op.inputs[0]]
                        st.env[op.outputs[0]] = st.env[op.inputs[0]]
                    messages.append((st.rank, peer.rank, op.attributes["tag"]))
                    st.pc += 1
                    peer.pc += 1
                    progress = True
            elif op.op_type == "RankCollective":
                group = tuple(op.attributes["group"])
                members = [ranks.get(r) for r in group]
                if all(m is not None and _same_collective(m.op, op) for m in members):
                    if run:
                        _collective(members, op)
                    collectives.append((op.attributes["kind"], group, op.attributes["tag"]))
                    for m in members:
                        m.pc += 1
                    progress = True
        if all(st.done for st in ranks.values()):
            break
        if not progress:
            raise DeadlockError(_explain(ranks))
    outputs = {
        r: tuple(st.env[v] for v in st.program.outputs) if run else () for r, st in ranks.items()
    }
    return outputs, Matching(tuple(messages), tuple(collectives))


def _local(st: _Rank) -> None:
    op = st.op
    try:
        results = get_op(op.op_type).kernel([st.env[v] for v in op.inputs], op.attributes)
    except Exception as e:
        raise ExecutionError(
            f"rank {st.rank}: {op.op_type} failed: {type(e).__name__}: {e}\n  in: {describe_op(op)}"
        ) from e
    for v, r in zip(op.outputs, results):
        st.env[v] = np.asarray(r) if not isinstance(r, tuple) else r


def _check_message(st: _Rank, send, peer: _Rank, recv) -> None:
    x, y = send.inputs[0].type, recv.outputs[0].type
    if x.shape != y.shape or x.dtype != y.dtype:
        raise DeadlockError(
            f"rank {st.rank} sends {x} with tag {send.attributes['tag']} but rank {peer.rank} "
            f"expects {y}\n  rank {st.rank}: {describe_op(send)}\n  rank {peer.rank}: "
            f"{describe_op(recv)}"
        )


def _same_collective(a, b) -> bool:
    if a is None or a.op_type != "RankCollective":
        return False
    keys = ("kind", "group", "tag", "op")
    return all(
        tuple(np.atleast_1d(a.attributes[k])) == tuple(np.atleast_1d(b.attributes[k])) for k in keys
    )


def _collective(members: list[_Rank], op) -> None:
    name, attrs = _KERNEL[op.attributes["kind"]]
    parts = tuple(m.env[m.op.inputs[0]] for m in members)
    results = get_op(name).kernel([parts], attrs(op.attributes))[0]
    for m, r in zip(members, results):
        want = tuple(m.op.attributes["result_shape"])
        if np.shape(r) != want:
            raise ExecutionError(
                f"rank {m.rank}: collective result has shape {np.shape(r)}, the program expects "
                f"{want}\n  in: {describe_op(m.op)}"
            )
        m.env[m.op.outputs[0]] = r


def _waits_for(st: _Rank, ranks: dict[int, _Rank]) -> list[int]:
    op = st.op
    if op.op_type in ("SendTo", "RecvFrom"):
        return [op.attributes["peer"]]
    return [
        r
        for r in op.attributes["group"]
        if r != st.rank and (r not in ranks or not _same_collective(ranks[r].op, op))
    ]


def _explain(ranks: dict[int, _Rank]) -> str:
    def at(r: int) -> str:
        st = ranks[r]
        return f"rank {r} waits at `{describe_op(st.op)}`"

    blocked = [r for r, st in ranks.items() if not st.done]
    for start in blocked:
        path, seen = [start], {start}
        r = start
        while True:
            nxt = _waits_for(ranks[r], ranks)[0]
            if nxt not in ranks or ranks[nxt].done:
                why = "does not exist" if nxt not in ranks else "has finished"
                return (
                    f"ranks block forever: {at(r)} for rank {nxt}, which {why} "
                    "(a send or receive without its match)"
                )
            if nxt in seen:
                cycle = path[path.index(nxt) :]
                steps = "; ".join(
                    f"{at(c)} for rank {_waits_for(ranks[c], ranks)[0]}" for c in cycle
                )
                return f"deadlock: a cycle of waits between ranks {cycle}: {steps}"
            path.append(nxt)
            seen.add(nxt)
            r = nxt
    return "deadlock"  # pragma: no cover - every blocked rank waits for someone


def check_deadlock(ranked: RankedProgram | Mapping[int, Function]) -> Matching:
    """Match every send with its receive and every collective across ranks, or raise
    :class:`DeadlockError` naming the ranks and ops in the cycle of waits."""
    return schedule(ranked)[1]


def run_ranked(ranked: RankedProgram, inputs: Sequence[Any] | Mapping[str, Any]) -> tuple:
    """Execute the ranked programs together on the global ``inputs``; return global outputs.

    Inputs are split into each rank's blocks by their bindings; outputs are merged back.
    """
    args = rank_arguments(ranked, inputs)
    outs, _ = schedule(ranked, args)
    return global_outputs(ranked, outs)


def _global_inputs(ranked: RankedProgram, inputs: Sequence[Any] | Mapping[str, Any]) -> list:
    """One global input per binding: by name from a mapping, by position from a sequence."""
    if isinstance(inputs, Mapping):
        missing = [b.name for b in ranked.inputs if b.name not in inputs]
        if missing:
            raise ExecutionError(f"ranked program: no value given for inputs {missing}")
        return [inputs[b.name] for b in ranked.inputs]
    count = len({b.source for b in ranked.inputs})
    if len(inputs) != count:
        raise ExecutionError(f"ranked program takes {count} inputs, got {len(inputs)}")
    if any(b.source < 0 for b in ranked.inputs):
        return list(inputs)
    order = sorted({b.source for b in ranked.inputs})
    return [inputs[order.index(b.source)] for b in ranked.inputs]


def rank_arguments(
    ranked: RankedProgram, inputs: Sequence[Any] | Mapping[str, Any]
) -> dict[int, list]:
    """Each rank's arguments: the global ``inputs`` split into its blocks by the bindings."""
    args: dict[int, list] = {r: [None] * len(p.inputs) for r, p in ranked.programs.items()}
    for binding, x in zip(ranked.inputs, _global_inputs(ranked, inputs)):
        if binding.elements:  # a per-device tuple: each leaf on its rank
            for (r, pos), part in zip(binding.elements, binding.flatten(x), strict=True):
                args[r][pos] = part
            continue
        x = np.asarray(x)
        if binding.layout is None:
            ((r, pos),) = binding.positions.items()
            args[r][pos] = x
            continue
        for d, block in zip(binding.layout.mesh.devices, binding.layout.split(x)):
            if binding.padded:
                pad = [(0, n - m) for n, m in zip(binding.padded[d], block.shape)]
                block = np.pad(block, pad)
            args[d][binding.positions[d]] = block
    for r, p in ranked.programs.items():
        for v, a in zip(p.inputs, args[r]):
            if a is not None:
                args[r][p.inputs.index(v)] = np.asarray(a).astype(v.type.dtype.numpy, copy=False)
    return args


def global_outputs(ranked: RankedProgram, outs: Mapping[int, Sequence[Any]]) -> tuple:
    """The global outputs from each rank's outputs (blocks merged by the bindings)."""
    result = []
    for binding in ranked.outputs:
        if binding.elements:
            result.append(binding.unflatten([outs[r][pos] for r, pos in binding.elements]))
        elif binding.layout is None:
            ((r, pos),) = binding.positions.items()
            result.append(outs[r][pos])
        else:
            parts = [outs[d][binding.positions[d]] for d in binding.layout.mesh.devices]
            result.append(binding.layout.merge(parts))
    return tuple(result)
