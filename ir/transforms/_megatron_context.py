"""Context parallelism in :func:`ir.transforms.megatron` (``cp=``): each sequence split over
``cp`` devices, attention as ring attention.

The level's plan (``_megatron_levels``) works on the piece with its sequence in
context parallelism's load-balanced order (Megatron-Core's: ``2 cp`` chunks, rank ``r``
holding chunks ``r`` and ``2 cp - 1 - r``, so that every rank's causal queries attend
as many keys): split into ``cp`` contiguous parts, that order gives each rank its two
chunks. The batch inputs arrive so (layout ``Z(1)@cp``), and the ops that care where a
token sits are given its position explicitly (:func:`permuted_form`), which makes the
piece in that order compute what the sequential one does:

* a causal ``Attention`` becomes ``AttentionBlock`` over the positions
  (``SequencePositions``), its gradient ``AttentionBlockGrad`` with the forward's
  log-sum-exp; under the split each rank's queries attend every rank's keys and values,
  which the plan gathers (and whose gradients it reduce-scatters back): attention by
  all-gather of the keys and values, as Llama 3 trains (Dubey et al. 2024, section
  3.3.2), which :mod:`ir.transforms._megatron_ring` then runs as a ring (the default;
  ``ring_attention=False`` keeps the all-gather);
* a position table added to the tokens (GPT's ``wpe``) is looked up at the positions
  (``Embedding``), its gradient put back where they point (``EmbeddingGrad``);
* ``MoESlots`` takes the tokens in the order of their positions, so that capacity drops
  what the sequential program drops.

Ops that place tokens by their index and cannot take positions (``CausalMask``, a causal
``Softmax``, an ``Attention`` with a mask or fewer queries than keys, a ``Rotary``
embedding, which rotates each row by its index) are refused, each op saying what to do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from ..builder import FunctionBuilder
from ..function import Function
from ..op import Op
from ..registry import get_op
from ..types import TensorType
from ..value import Value
from ._megatron_levels import Level, plan_level, sequence_rule
from ._megatron_ring import ring_level
from ._rewrite import TransformError, is_optimizer
from ._spmd import Link, P, S
from ._spmd import Plan as _Plan
from .stage_cut import gradient_ops

if TYPE_CHECKING:
    from ._megatron_plan import MegatronPlan

SEQ = 1  # the sequence axis of the batch inputs (tokens, labels: batch, seq)


def context_level(
    plan: MegatronPlan,
    f: Function,
    batch: set[Value],
    links: Mapping[Value, Link],
    var: str,
) -> Level:
    """The context level of the piece ``f`` (``batch``: its inputs split by rows)."""
    cp = plan.cp
    seqs = {v.type.shape[SEQ] for v in batch if isinstance(v.type, TensorType) and v.type.rank > 1}
    if len(seqs) != 1 or any(v.type.rank < 2 for v in batch):  # type: ignore[union-attr]
        shown = ", ".join(
            f"{v.name} {v.type.shape}"  # type: ignore[union-attr]
            for v in sorted(batch, key=f.inputs.index)
        )
        raise TransformError(
            f"context level: cp={cp} splits the sequence (axis 1) of the batch inputs, but "
            f"they do not share one (one piece's: {shown}); a model without a sequence "
            "axis takes cp=1"
        )
    seq = seqs.pop()
    if seq % (2 * cp):
        raise TransformError(
            f"context level: cp={cp} cuts each sequence of {seq} tokens into 2 x cp = "
            f"{2 * cp} chunks (causal load balancing), which {seq} is not a multiple of; "
            f"choose cp with 2 cp dividing {seq}"
        )
    g, value_of, origin = permuted_form(plan, f, seq, cp)
    states = {value_of[p]: S(SEQ) for p in batch}
    g_links = {value_of[dst]: _moved(link, value_of) for dst, link in links.items()}
    level = plan_level(
        g, cp, "cp", states, sequence_rule(cp), g_links, var, plan._finish_context, _scatter_kv
    )
    if plan.ring_attention:
        level = ring_level(level, cp)
    level.value_of = {v: level.value_of[x] for v, x in value_of.items() if x in level.value_of}
    level.origin = {new: origin[old] for new, old in level.origin.items() if old in origin}
    return level


def _moved(link: Link, value_of: Mapping[Value, Value]) -> Link:
    return Link(value_of[link.src], link.level, link.src_state, link.dst_state, link.whole)


def _scatter_kv(plan: _Plan, op: Op) -> None:
    """An attention block's key and value gradients, sums over the group's queries, are
    reduce-scattered back to the keys' split as they are made (the ring's way)."""
    for i in get_op(op.op_type).extra.get("key_gradients", ()):
        v = op.outputs[i]
        key = plan.current[v]
        if plan.state[key] == P:
            plan.current[v] = plan.convert(key, S(2))


class _Context:
    """What an op's ``context_form`` (its record's ``extra``) reads: the positions of the
    sequence (a ``SequencePositions`` op per op that asks), the attentions' log-sum-exps."""

    def __init__(self, b: FunctionBuilder, seq: int, cp: int) -> None:
        self.b, self.seq, self.cp = b, seq, cp
        self.op: Op | None = None  # the op being rewritten
        self.lse: dict[Value, Value] = {}
        self._made: dict[Op, Value] = {}

    def positions(self) -> Value:
        op = self.op
        assert op is not None
        if op not in self._made:
            device = op.inputs[0].type.device if op.inputs else None  # type: ignore[union-attr]
            attrs = {"n": self.seq, "ranks": self.cp, "device": device}
            made = self.b.add_op(
                "SequencePositions", [], attrs, names=[f"{op.outputs[0].name}_pos"]
            )
            self._made[op] = made.outputs[0]
        return self._made[op]


def permuted_form(
    plan: MegatronPlan, f: Function, seq: int, cp: int
) -> tuple[Function, dict[Value, Value], dict[Op, Op]]:
    """``f`` on its sequences in the load-balanced order of ``cp`` ranks, positions given
    explicitly (the module docstring); each value of ``f`` -> its value here, and each op
    here -> the op of ``f`` it runs or serves."""
    b = FunctionBuilder(f.name)
    value_of: dict[Value, Value] = {v: b.input(v.name, v.type) for v in f.inputs}
    origin: dict[Op, Op] = {}
    tables = _position_tables(plan, f, seq)
    # the values that are a table's gradient (by rows in the permuted order): a piece
    # output whose data-plan key is one, or what an optimizer step in the piece reads
    grads = {v for v in f.outputs if plan.key_of.get(v) in tables}
    grads |= {op.inputs[1] for op in f.ops if is_optimizer(op) and op.inputs[0] in tables}
    _check_gradients_found(plan, f, tables)
    ctx = _Context(b, seq, cp)
    for op in f.ops:
        first = len(b.ops)
        ctx.op = op
        ins = [value_of[v] for v in op.inputs]
        extra = get_op(op.op_type).extra
        form = extra.get("context_form")
        outs = form(b, op, ins, ctx) if form is not None else None
        if isinstance(outs, str):
            raise TransformError(
                f"context level: cp={cp} needs every op that depends on where a token sits to "
                f"take its position, but {outs} ({op.outputs[0].name})"
            )
        if outs is None and extra.get("broadcasting") and any(v in tables for v in op.inputs):
            table = next(v for v in op.inputs if v in tables)
            rows = b.add_op(
                "Embedding", [value_of[table], ctx.positions()], {}, names=[f"{table.name}_rows"]
            )
            ins = [rows.outputs[0] if v is table else value_of[v] for v in op.inputs]
        if outs is None:
            outs = b.add_like(op, ins, [v.name for v in op.outputs]).outputs
        for v, y in zip(op.outputs, outs):
            if v in grads:  # a position table's gradient: its rows put back
                back = b.add_op(
                    "EmbeddingGrad", [ctx.positions(), y], {"num_embeddings": seq}, names=[v.name]
                )
                y = back.outputs[0]
            value_of[v] = y
        for made in b.ops[first:]:
            origin[made] = op
    return b.finish([value_of[v] for v in f.outputs]), value_of, origin


def _check_gradients_found(plan: MegatronPlan, f: Function, tables: Mapping) -> None:
    """A position table's gradient is found as an optimizer step's operand; a program that
    returns gradients with no optimizer step (``T.gradients``) and sums them over batch
    pieces links none to its table, and its rows would come back in the ranks' permuted
    order: refused rather than returned wrong."""
    if not tables or plan.post or any(is_optimizer(op) for op in f.ops) or plan.dp * plan.m == 1:
        return  # (one piece: its gradient is an output of the piece, put back as made)
    if not gradient_ops(plan.t):
        return  # no backward pass: no gradient to put back
    named = ", ".join(sorted(w.name for w, table in tables.items() if w is table))
    raise TransformError(
        f"context level: cp={plan.cp} permutes the sequence, so the gradient of position "
        f"table(s) {named} must have its rows put back in order, which the 3D step finds "
        "as an optimizer step's operand; a program returning gradients without an "
        "optimizer step (T.gradients) names none: train it with an optimizer "
        "(T.training, return_gradients=True returns them too) or use cp=1"
    )


def _position_tables(plan: MegatronPlan, f: Function, seq: int) -> dict:
    """The piece's position tables (a ``(seq, H)`` weight added to ``(B, seq, H)`` tokens),
    keyed by the piece input; and the data-plan key of each one's gradient -> the table."""
    inputs = set(f.inputs)
    found: dict = {}
    for op in f.ops:
        if not get_op(op.op_type).extra.get("broadcasting") or len(op.inputs) != 2:
            continue
        for w, x in (op.inputs, op.inputs[::-1]):
            shape = w.type.shape if isinstance(w.type, TensorType) else ()
            if (
                w in inputs
                and len(shape) == 2
                and shape[0] == seq
                and isinstance(x.type, TensorType)
                and x.type.rank == 3
                and x.type.shape[1:] == shape
                and plan.dplan.state.get(plan.source_of.get(w)) not in (S(0), P)
            ):
                found[w] = w
    if not found:
        return {}
    by_source = {plan.source_of[w]: w for w in found}
    for op in plan.post:  # the gradient of each table: the optimizer step's operand 1
        keys = plan.post_keys[op]
        table = by_source.get(keys[0])
        st = plan.conv_dst.get(keys[1]) if table is not None and len(keys) > 1 else None
        if st is not None:
            found[st.keys[0]] = table
    return found


__all__ = ["context_level", "permuted_form"]
