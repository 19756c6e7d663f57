"""Ring attention in the context level (``megatron(..., cp=)``): the keys and values of the
context group passed round a ring block by block instead of gathered whole.

The context level's plan (:mod:`ir.transforms._megatron_context`) gives each rank's
queries the group's keys and values by an all-gather, and reduce-scatters their
gradients back. :func:`ring_level` rewrites its local program as ring attention runs it
(Liu et al. 2023; Megatron-Core / Transformer Engine's context parallelism):

* forward, step ``s = 0 .. cp - 1``: the block the rank holds (its own at step 0), its
  keys, values and positions passed on to the next member (``RingShift``, offset 1)
  for step ``s + 1``, attended by ``AttentionBlock`` and merged into the steps so far by
  the online softmax (its ``out_prev, lse_prev``);
* backward: the blocks passed round again (the forward's are not kept: each rank holds
  one block of keys and values a layer between the passes, where the all-gather keeps
  the whole sequence's), each block's ``AttentionBlockGrad`` (from the whole
  attention's ``out`` and ``lse``), the query gradients summed on the rank; the key and
  value gradients travel with their block, each rank adding its part, and one pass more
  brings each block's sums home (``cp`` passes, as ring-flash-attn and Megatron-Core
  run it).

Per rank that is ``cp - 1`` blocks of keys and of values sent in the forward and again in
the backward, and ``cp`` blocks of their gradients, each pass one block over one link, so
step ``s + 1``'s transfer hides behind step ``s``'s block when the block's compute
outlasts it (``RingShift`` is asynchronous: its record's ``async_p2p``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from ..builder import FunctionBuilder
from ..op import Op
from ..registry import get_op
from ..value import Value
from ._megatron_levels import Level
from ._spmd import Link, R, S, Shard


def ring_level(level: Level, cp: int) -> Level:
    """``level`` (the context level's local program) with its attention as a ring; the
    attention blocks whose keys are not a plain all-gather of the group stay as they are."""
    f, links = level.function, level.links
    scattered: dict[Value, Value] = {}  # a gradient (pending sum) -> its reduce-scatter input
    for x, link in links.items():
        if link.level == "cp" and link.src_state.kind == "P" and link.dst_state == S(2):
            scattered[link.src] = x
    readers: dict[Value, int] = {}
    for op in f.ops:
        for v in op.inputs:
            readers[v] = readers.get(v, 0) + 1
    for v in f.outputs:
        readers[v] = readers.get(v, 0) + 1

    def gathered(x: Value) -> Value | None:
        link = links.get(x)
        ok = link is not None and link.level == "cp" and link.src_state == S(2)
        return link.src if ok and link.dst_state == R and not link.whole else None

    def ring_op(op: Op) -> bool:
        role = _role(op)
        if role is None:
            return False
        first = _positions_operand(op)
        if role == "block" and len(op.inputs) != 5:  # no blocks so far: a whole attention
            return False
        q_pos = links.get(op.inputs[first])
        if gathered(op.inputs[1]) is None or gathered(op.inputs[2]) is None or q_pos is None:
            return False
        if q_pos.src is not op.inputs[first + 1] or q_pos.dst_state != S(0):
            return False
        if role == "gradient":  # its key gradients only reduce-scattered
            return all(
                op.outputs[i] in scattered and not readers.get(op.outputs[i]) for i in (1, 2)
            )
        return True

    rings = [op for op in f.ops if ring_op(op)]
    if not rings:
        return level
    # the inputs the ring makes unneeded: the gathered keys and values no other op reads,
    # the reduce-scattered key and value gradients
    in_rings = {v for op in rings for v in op.inputs[1:3]}
    drop = {
        x
        for x in in_rings
        if sum(1 for op in rings for v in op.inputs[1:3] if v is x) == readers.get(x)
    }
    drop |= {scattered[op.outputs[i]] for op in rings if _role(op) == "gradient" for i in (1, 2)}
    b = FunctionBuilder(f.name)
    env: dict[Value, Value] = {v: b.input(v.name, v.type) for v in f.inputs if v not in drop}
    new_links = {env[x]: link for x, link in links.items() if x in env}
    origin: dict[Op, Op] = {}
    shifted: dict[tuple[Value, int, str], Value] = {}

    def shift(src: Value, s: int, like: Value, src_state: Shard, phase: str) -> Value:
        """``src`` (here) of the rank ``s`` places back on the ring: passed on one member
        ``s`` times (a value of state ``R`` has each member's own part passed on); the
        backward (``phase`` ``"B"``) passes the blocks round again rather than keeping the
        forward's."""
        key = (src, s, phase)
        if s == 0:
            return src
        if key not in shifted:
            prev = shift(src, s - 1, like, src_state, phase)
            x = b.input(f"{like.name}_{'ring' if phase == 'F' else 'bring'}{s}", like.type)
            state = src_state if s == 1 else (S(0) if src_state == R else src_state)
            new_links[x] = Link(prev, "cp", state, S(0) if state == R else state, shift=1)
            shifted[key] = x
        return shifted[key]

    def pass_on(src: Value, name: str) -> Value:
        """``src`` (a split along the sequence) passed on one member of the ring."""
        x = b.input(name, src.type)
        new_links[x] = Link(src, "cp", S(2), S(2), shift=1)
        return x

    for op in f.ops:
        first_new = len(b.ops)
        if op not in rings:
            made = b.add_like(op, [env[v] for v in op.inputs], [v.name for v in op.outputs])
            env.update(zip(op.outputs, made.outputs))
        else:
            _ring(b, op, env, cp, shift, pass_on, gathered, scattered)
        for made_op in b.ops[first_new:]:
            origin[made_op] = level.origin.get(op, op)
    g = b.finish([env[v] for v in f.outputs])
    # the sources as rebuilt (the ring's own links have theirs already)
    new_links = {
        x: link if link.shift else replace(link, src=env.get(link.src, link.src))
        for x, link in new_links.items()
    }
    value_of = {v: env.get(x, x) for v, x in level.value_of.items()}
    return Level(level.name, level.n, g, value_of, new_links, level.out_states, origin)


def _ring(
    b: FunctionBuilder,
    op: Op,
    env: dict[Value, Value],
    cp: int,
    shift: Callable[[Value, int, Value, Shard, str], Value],
    pass_on: Callable[[Value, str], Value],
    gathered: Callable[[Value], Value | None],
    scattered: Mapping[Value, Value],
) -> None:
    """The ring form of one attention block (forward) or its gradient (backward): its
    results in ``env``, and the reduce-scatters' results its gradients replace."""
    ins = [env.get(v) for v in op.inputs]
    grad = _role(op) == "gradient"
    first = _positions_operand(op)
    k_all, v_all = op.inputs[1:3]
    k_src, v_src = gathered(k_all), gathered(v_all)
    assert k_src is not None and v_src is not None
    k, v = env[k_src], env[v_src]
    q_pos, whole_pos = ins[first], ins[first + 1]

    phase = "B" if grad else "F"

    def block(s: int) -> tuple[Value, Value, Value]:
        if s == 0:
            return k, v, q_pos
        return (
            shift(k, s, k, S(2), phase),
            shift(v, s, v, S(2), phase),
            shift(whole_pos, s, q_pos, R, phase),
        )

    a = dict(op.attributes)
    if not grad:
        out_name, lse_name = (x.name for x in op.outputs)
        prev: list[Value] = []
        for s in range(cp):
            kb, vb, pb = block(s)
            last = s == cp - 1
            names = [out_name, lse_name] if last else [f"{out_name}_{s}", f"{lse_name}_{s}"]
            made = b.add_op(op.op_type, [ins[0], kb, vb, q_pos, pb, *prev], a, names=names)
            prev = list(made.outputs)
        env.update(zip(op.outputs, prev))
        return
    # the key and value gradients travel with their block, each rank adding its part:
    # at step s a rank holds the sums for the block of the rank s places back, and one
    # more pass after the last step brings each block's sums home
    fixed = ins[3:6]
    dq: Value | None = None
    sums: list[Value] = []
    for s in range(cp):
        kb, vb, pb = block(s)
        names = [f"{x.name}_{s}" for x in op.outputs]
        made = b.add_op(op.op_type, [ins[0], kb, vb, *fixed, q_pos, pb], a, names=names)
        dq_s, *parts = made.outputs
        dq = dq_s if dq is None else b.call("Add", dq, dq_s, name=f"{op.outputs[0].name}_sum{s}")
        if s == 0:
            sums = list(parts)
            continue
        for i, part in enumerate(parts):
            got = pass_on(sums[i], f"{op.outputs[i + 1].name}_ring{s}")
            sums[i] = b.call("Add", got, part, name=f"{op.outputs[i + 1].name}_sum{s}")
    assert dq is not None
    env[op.outputs[0]] = dq
    for i in (1, 2):  # read where the reduce-scatter's result was
        env[scattered[op.outputs[i]]] = pass_on(sums[i - 1], f"{op.outputs[i].name}_home")


def _role(op: Op) -> str | None:
    """``"block"`` or ``"gradient"`` for an op ring attention splits by key blocks (its
    record's ``extra["ring_attention"]``), else None."""
    return get_op(op.op_type).extra.get("ring_attention")


def _positions_operand(op: Op) -> int:
    """The operand index of the queries' positions (the keys' follow)."""
    return get_op(op.op_type).extra["positions_operand"]


__all__ = ["ring_level"]
