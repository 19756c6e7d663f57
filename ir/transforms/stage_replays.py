"""Recomputation under a pipeline: each stage replays its activations from what it holds.

``ir.transforms.recompute`` re-emits forward ops before the backward pass (*replays*),
and a pipeline runs each replay on the stage of the forward op it replays. Where a cut
falls inside a replayed run (a cut between a transformer block's attention and its MLP
when the whole block is recomputed), a replay of the later stage reads a replay of the
earlier one: made in the earlier stage's backward task, which waits for the later
stage's gradients, which wait for that replay. No schedule runs that (the pipeline
used to refuse it: "the schedule deadlocks").

Megatron-LM's answer is the stage's input: a stage keeps the activation it received
in the forward pass for its backward pass and recomputes from it. So here: a backward
op that reads a replay made on an earlier stage reads the forward value that the replay
recomputes instead (the value the stage received in the forward pass), and replays no
one reads any more are dropped. :func:`replay_twins` finds, for each replay, the
forward op it recomputes (same op type, attributes and operands, or their replays).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..builder import FunctionBuilder, rebuild_op
from ..function import Function
from ..layout import layouts_of
from ..op import Op
from ..value import Value
from ..verify import verify
from ._rewrite import is_optimizer


def replay_twins(f: Function, backward: set[Op], gradients: set[Op]) -> dict[Op, Op]:
    """Each replay of ``f`` (a backward op that is no gradient op) -> the forward op it
    recomputes: the same op type and attributes on the same operands, an operand that is
    itself a replay standing for the forward value it recomputes. A backward op with no
    such forward op (not a replay) is left out."""
    index: dict[tuple[str, tuple[Value, ...]], list[Op]] = {}
    for op in f.ops:
        if op not in backward and not is_optimizer(op):
            index.setdefault((op.op_type, op.inputs), []).append(op)
    original: dict[Value, Value] = {}  # a replay's result -> the forward value
    twins: dict[Op, Op] = {}
    for op in f.ops:
        if op not in backward or op in gradients:
            continue
        key = (op.op_type, tuple(original.get(v, v) for v in op.inputs))
        twin = next((c for c in index.get(key, ()) if _same(op, c)), None)
        if twin is not None:
            twins[op] = twin
            original.update(zip(op.outputs, twin.outputs))
    return twins


def _same(a: Op, b: Op) -> bool:
    if len(a.outputs) != len(b.outputs) or a.subfunctions != b.subfunctions:
        return False
    if a.attributes.keys() != b.attributes.keys():
        return False
    return all(_equal(a.attributes[k], b.attributes[k]) for k in a.attributes)


def _equal(x: object, y: object) -> bool:
    if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
        return isinstance(x, np.ndarray) and isinstance(y, np.ndarray) and np.array_equal(x, y)
    if isinstance(x, tuple) and isinstance(y, tuple):
        return len(x) == len(y) and all(_equal(a, b) for a, b in zip(x, y))
    return bool(x == y)


def local_replays(
    f: Function, stage: Mapping[Op, int], twins: Mapping[Op, Op], backward: set[Op]
) -> tuple[Function, dict[Op, int]]:
    """``f`` with every backward read of a replay made on an earlier stage turned into a
    read of the forward value it recomputes, and the replays left unread dropped; and the
    stage of each op of the result (see the module docstring). ``f`` itself (and
    ``stage``) when no read crosses."""
    producer = f.producers
    original = {v: w for r, t in twins.items() for v, w in zip(r.outputs, t.outputs)}
    swap: dict[tuple[Op, int], Value] = {}
    for op in f.ops:
        if op not in backward:
            continue
        for i, v in enumerate(op.inputs):
            r = producer.get(v)
            if r in twins and stage[r] < stage[op]:
                swap[(op, i)] = original[v]
    if not swap:
        return f, dict(stage)
    readers: dict[Value, int] = dict.fromkeys(f.outputs, 1)
    for op in f.ops:
        for i, v in enumerate(op.inputs):
            u = swap.get((op, i), v)
            readers[u] = readers.get(u, 0) + 1
    dropped: set[Op] = set()
    for op in reversed(f.ops):
        if op in twins and not any(readers.get(v, 0) for v in op.outputs):
            dropped.add(op)
            for i, v in enumerate(op.inputs):
                u = swap.get((op, i), v)
                readers[u] -= 1
    b = FunctionBuilder(f.name)
    env = {v: b.input(v.name, v.type) for v in f.inputs}
    kept = [op for op in f.ops if op not in dropped]
    for op in kept:
        ins = [env[swap.get((op, i), v)] for i, v in enumerate(op.inputs)]
        env.update(zip(op.outputs, rebuild_op(b, op, ins)))
    g = verify(layouts_of(b.finish([env[v] for v in f.outputs]), f))
    return g, {new: stage[old] for old, new in zip(kept, g.ops)}


__all__ = ["local_replays", "replay_twins"]
