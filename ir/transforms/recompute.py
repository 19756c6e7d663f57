"""Activation recomputation (the seed's last MLP variant) and a liveness count of memory.

``recompute(f)`` takes a training program (a forward, then a backward that starts
with ``LossGrad``) and, for chosen forward activations, re-emits the forward ops
that produce them right before their first backward consumer; the backward then
reads the recomputed copy, so the first copy dies after its last forward use::

    a = MatMul(x, wA); y = MatMul(a, wB)           # a's first copy dies here
    l = Loss(y, z); dl = LossGrad(y, z, 1)
    a = MatMul(x, wA)                              # recomputed
    (dwB, da) = MatMulGrad(a, wB, dl); ...

Default choice: every forward activation read by the backward, not a program
output, produced by a compute op whose operands are program inputs or values the
backward keeps alive anyway (read by the backward and not recomputed) — for the
MLP the first MatMul of each layer, for the GPT the LayerNorm outputs and the
Gelu results (and the fused ``Attention``'s result, replayed from the q, k and v its
gradient reads anyway).

Megatron-LM's two granularities (Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models") are modes: ``recompute(t, "selective")``
replays each attention core (the ``(batch, heads, seq, seq)`` scores and softmax that
only it needs: :func:`attention_core_activations`), dropping the ``5as/h`` term of the
paper's ``sbh(34 + 5as/h)`` bytes per layer (``2as/h`` in this GPT without dropout);
``recompute(t, "full")`` replays every transformer layer from its input, and
``recompute(t, "full", layers=k, stages=p)`` only the first ``k`` layers of each of ``p``
pipeline stages (``--recompute-method block --recompute-num-layers k``).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..arguments import function_arg, names_arg
from ..builder import FunctionBuilder, rebuild_op
from ..errors import ArgumentError, DistIRError
from ..function import Function
from ..layout import layouts_of
from ..op import Op
from ..registry import OpKind, get_op
from ..types import TensorType, TupleType, Type
from ..value import Value
from ..verify import verify
from ._rewrite import starts_backward

__all__ = [
    "MODES",
    "RecomputeError",
    "attention_core_activations",
    "backward_start",
    "mode_activations",
    "peak_live_bytes",
    "recomputable",
    "recompute",
]

MODES = ("selective", "full")


class RecomputeError(DistIRError):
    """Recomputation cannot apply to this program or these values."""


def backward_start(f: Function) -> int:
    """Index of the first backward op: the first whose record says it seeds the backward
    (``LossGrad``)."""
    for i, op in enumerate(f.ops):
        if starts_backward(op):
            return i
    raise RecomputeError(
        f"{f.name} has no backward pass (no LossGrad op); recompute a training program, "
        "e.g. ir.transforms.recompute(ir.transforms.training(f))"
    )


def _backward_readers(f: Function, start: int) -> dict[Value, int]:
    """Forward values read by the backward, with the index of their first backward reader."""
    first: dict[Value, int] = {}
    produced = set(f.inputs)
    for op in f.ops[:start]:
        produced.update(op.outputs)
    for i, op in enumerate(f.ops[start:], start):
        for v in op.inputs:
            if v in produced and v not in first:
                first[v] = i
    return first


def _replayable(op: Op) -> bool:
    opdef = get_op(op.op_type)
    return opdef.kind == OpKind.COMPUTE and not op.subfunctions and not opdef.extra.get("loss")


def recomputable(f: Function) -> list[Value]:
    """The default activations to recompute (see the module docstring), in program order."""
    function_arg("recomputable", "f", f)
    start = backward_start(f)
    readers = _backward_readers(f, start)
    inputs, outputs = set(f.inputs), set(f.outputs)
    chosen: list[Value] = []
    for op in f.ops[:start]:
        if not _replayable(op) or len(op.outputs) != 1:
            continue
        (v,) = op.outputs
        if v not in readers or v in outputs:
            continue
        if all(u in inputs or (u in readers and u not in chosen) for u in op.inputs):
            chosen.append(v)
    return chosen


def attention_core_activations(f: Function) -> list[Value]:
    """Selective recomputation's choice (Korthikanti et al. 2022, section 5): each attention
    core's probabilities that the backward reads (a softmax whose record marks
    ``attention_probabilities``) and the values of the same shape it is made from (the
    masked and scaled scores back to the ``Q K^T`` MatMul), in program order. Replaying
    them needs only ``Q``, ``K`` and ``V``, which the backward keeps anyway. A dropout of
    the probabilities (its output and mask, the rest of the paper's ``5as/h`` term) is
    replayed with them. A program whose attention is one fused op (FlashAttention
    recomputes its core itself) has none.
    """
    function_arg("attention_core_activations", "f", f)
    start = backward_start(f)
    readers = _backward_readers(f, start)
    forward = {v: op for op in f.ops[:start] for v in op.outputs}
    consumers = f.consumers
    forward_ops = set(f.ops[:start])
    chosen: set[Value] = set()
    for op in f.ops[:start]:
        if not get_op(op.op_type).extra.get("attention_probabilities"):
            continue
        probs = v = op.outputs[0]
        if v in f.outputs:
            continue
        while v not in chosen and _replayable(forward[v]):
            chosen.add(v)
            same = [u for u in forward[v].inputs if u in forward and u.type == v.type]
            if len(same) != 1:  # the scores: a MatMul of Q and K^T, of other shapes
                break
            v = same[0]
        # after the softmax, ops of its shape (its dropout: output and mask) up to the
        # MatMul with V; kept where the backward reads them or what it reads is made of them
        after = [probs]
        while after:
            for user in consumers.get(after.pop(), []):
                outs = user.outputs
                if user not in forward_ops or not _replayable(user):
                    continue
                if all(w.type.shape == probs.type.shape and w not in f.outputs for w in outs):
                    new = [w for w in outs if w not in chosen]
                    chosen.update(new)
                    after += new
    return [v for v in forward if v in chosen and _feeds_backward(v, chosen, readers, consumers)]


def _feeds_backward(v: Value, chosen: set[Value], readers, consumers) -> bool:
    """``v`` is read by the backward, or feeds (through chosen values) one that is."""
    seen, frontier = set(), [v]
    while frontier:
        u = frontier.pop()
        if u in readers:
            return True
        seen.add(u)
        frontier += [
            w for op in consumers.get(u, []) for w in op.outputs if w in chosen and w not in seen
        ]
    return False


def mode_activations(
    f: Function,
    mode: str,
    layers: int | None = None,
    stages: int = 1,
    stage_of=None,
    name: str = "layers",
) -> list[Value]:
    """The activations ``recompute(f, mode, layers=, stages=)`` replays (see the module
    docstring): ``"selective"`` or ``"full"``; ``layers``: with ``"full"``, the first
    ``layers`` transformer layers of each of ``stages`` pipeline stages (the stages as
    ``ir.transforms.stage_assignment(f, stages, stage_of)`` cuts them). ``name``: what
    the caller calls ``layers`` (``megatron``'s ``recompute_layers``), for its errors."""
    if mode not in MODES:
        raise RecomputeError(f"recompute mode must be one of {MODES}, got {mode!r}")
    if mode == "selective":
        if layers is not None:
            raise RecomputeError(f"{name}= counts layers recomputed whole: use it with 'full'")
        return attention_core_activations(f)
    from ..models import gpt_layer_activations, gpt_layer_index

    if not any(gpt_layer_index(v) is not None for op in f.ops for v in op.outputs):
        raise RecomputeError(
            f"{f.name} has no transformer layers named as ir.models.gpt names them "
            "(h<i>_...); pass the values to recompute instead of 'full'"
        )
    if layers is None:
        return gpt_layer_activations(f)
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 0:
        raise RecomputeError(f"{name} must be an integer >= 0, got {layers!r}")
    from .pipeline import stage_assignment

    stage = stage_assignment(f, stages, stage_of)
    first_stage: dict[int, int] = {}
    for op in f.ops:
        for v in op.outputs:
            i = gpt_layer_index(v)
            if i is not None:
                first_stage.setdefault(i, stage[op])
    by_stage: dict[int, list[int]] = {}
    for i, s in sorted(first_stage.items()):
        by_stage.setdefault(s, []).append(i)
    chosen = [i for ids in by_stage.values() for i in ids[:layers]]
    return gpt_layer_activations(f, chosen) if chosen else []


def _resolve(f: Function, values: Sequence[str | Value] | None, start: int) -> list[Value]:
    if values is None:
        return recomputable(f)
    readers = _backward_readers(f, start)
    forward = {v: op for op in f.ops[:start] for v in op.outputs}
    chosen = []
    for item in values:
        v = item
        if isinstance(item, str):
            v = next((u for u in forward if u.name == item), None)
            if v is None:
                raise RecomputeError(f"{f.name} has no forward value named {item!r}")
        if v not in forward:
            raise RecomputeError(f"{getattr(v, 'name', v)!r} is not made by a forward op")
        if v in f.outputs:
            raise RecomputeError(f"{v.name!r} is a program output; it stays live anyway")
        if not _replayable(forward[v]):
            raise RecomputeError(
                f"{v.name!r} comes from {forward[v].op_type}, which is not a compute op "
                "that can be replayed"
            )
        chosen.append(v)
    # A chosen value the backward does not read must feed the recomputation of one it does.
    used = {v for v in chosen if v in readers}
    frontier = list(used)
    while frontier:
        for u in forward[frontier.pop()].inputs:
            if u in chosen and u not in used:
                used.add(u)
                frontier.append(u)
    for v in chosen:
        if v not in used:
            raise RecomputeError(
                f"the backward of {f.name} does not read {v.name!r}, nor does the "
                "recomputation of another chosen value"
            )
    return chosen


def recompute(
    f: Function,
    values: Sequence[str | Value] | str | None = None,
    *,
    layers: int | None = None,
    stages: int = 1,
) -> Function:
    """``f`` with ``values`` (names or Values; default ``recomputable(f)``) recomputed, or
    Megatron-LM's granularity ``values="selective"`` / ``"full"`` (``layers``, ``stages``:
    the first ``layers`` layers of each of ``stages`` pipeline stages; see the module
    docstring and :func:`mode_activations`).

    Each chosen value's producer (and, recursively, producers of operands that are
    themselves chosen) is re-emitted just before the value's first backward reader;
    every backward reader then uses the copy. Outputs are unchanged.

    >>> import ir
    >>> t = ir.transforms.training(ir.models.mlp(4, 3, 5, 2, activation=None))
    >>> r = ir.transforms.recompute(t)
    >>> [op.op_type for op in r.ops][:6]
    ['MatMul', 'MatMul', 'Loss', 'LossGrad', 'MatMul', 'MatMulGrad']
    """
    function_arg("recompute", "f", f)
    if isinstance(values, str):
        if values not in MODES:
            raise ArgumentError(
                f"recompute: values must be a mode {MODES} or a list of value names, got "
                f"{values!r} (one name goes in a list: [{values!r}])"
            )
        if _has_backward(f):
            values = mode_activations(f, values, layers, stages)
    elif layers is not None:
        raise RecomputeError("recompute: layers= goes with values='full'")
    values = values if isinstance(values, str) else names_arg("recompute", "values", values)
    if not _has_backward(f) and any(_has_backward(s) for op in f.ops for s in op.subfunctions):
        return _recompute_bodies(f, values)
    start = backward_start(f)
    chosen = set(_resolve(f, values, start))
    producer = f.producers
    b = FunctionBuilder(f.name)
    env = {v: b.input(v.name, v.type) for v in f.inputs}
    again: dict[Value, Value] = {}  # chosen forward value -> recomputed copy

    def recomputed(v: Value) -> Value:
        if v not in chosen:
            return env[v]
        if v not in again:
            op = producer[v]
            outs = rebuild_op(b, op, [recomputed(u) for u in op.inputs])
            again.update(zip(op.outputs, outs))
        return again[v]

    for i, op in enumerate(f.ops):
        read = env.__getitem__ if i < start else recomputed
        outs = rebuild_op(b, op, [read(v) for v in op.inputs])
        env.update(zip(op.outputs, outs))
    return verify(layouts_of(b.finish([env[v] for v in f.outputs]), f))


def _has_backward(f: Function) -> bool:
    return any(starts_backward(op) for op in f.ops)


def _recompute_bodies(f: Function, values: Sequence[str | Value] | str | None) -> Function:
    """A distributed training program: recompute inside each pmap body with a backward."""
    b = FunctionBuilder(f.name)
    env = {v: b.input(v.name, v.type) for v in f.inputs}
    for op in f.ops:
        ins = [env[v] for v in op.inputs]
        if any(_has_backward(sub) for sub in op.subfunctions):
            bodies = [
                recompute(sub, values) if _has_backward(sub) else sub for sub in op.subfunctions
            ]
            new = b.add_op(
                op.op_type,
                ins,
                dict(op.attributes),
                names=[v.name for v in op.outputs],
                subfunctions=bodies,
                op_name=op.name,
            )
            outs = new.outputs
        else:
            outs = rebuild_op(b, op, ins)
        env.update(zip(op.outputs, outs))
    return verify(layouts_of(b.finish([env[v] for v in f.outputs]), f))


# -- liveness --------------------------------------------------------------------------


def _bytes(t: Type) -> int:
    if isinstance(t, TupleType):
        return sum(_bytes(e) for e in t.elements)
    assert isinstance(t, TensorType)
    return t.size_bytes


def peak_live_bytes(f: Function) -> int:
    """The most bytes live at once when ``f``'s ops run in order, all devices together.

    A value is live from its definition (inputs: from the start) through its last
    reader; program outputs stay live to the end. While an op runs, its operands
    and results are live together; a pmap adds, on each of its devices, what its
    body holds beyond its inputs and outputs at the body's peak.
    """
    function_arg("peak_live_bytes", "f", f)
    last: dict[Value, int] = {}
    for i, op in enumerate(f.ops):
        for v in op.inputs:
            last[v] = i
    end = len(f.ops)
    for v in f.outputs:
        last[v] = end
    live = sum(_bytes(v.type) for v in f.inputs if v in last)
    peak = live
    for i, op in enumerate(f.ops):
        live += sum(_bytes(v.type) for v in op.outputs)
        peak = max(peak, live + _body_transient_bytes(op))
        dead = {v for v in (*op.inputs, *op.outputs) if last.get(v, i) <= i}
        live -= sum(_bytes(v.type) for v in dead)
    return peak


def _body_transient_bytes(op: Op) -> int:
    """Bytes a pmap's body holds at its peak beyond its operands and results, all devices."""
    if not op.subfunctions or not op.inputs or not isinstance(op.inputs[0].type, TupleType):
        return 0
    body = op.subfunctions[0]
    ends = sum(_bytes(v.type) for v in (*body.inputs, *body.outputs))
    return len(op.inputs[0].type) * max(peak_live_bytes(body) - ends, 0)
