"""Mixture-of-experts routing: the top-k gate, capacity slots, dispatch to the experts'
buffer and combination back, as GShard (Lepikhin et al. 2020) and Switch Transformer
(Fedus et al. 2021) write them, with the token movement as gathers and scatters (as
Megatron-Core's token dispatcher permutes tokens) rather than one-hot matrix products.

A MoE layer over ``E`` experts routes each token of ``x (B, S, H)`` to ``k`` of them:

* ``(gate, expert) = MoETopK(probs, k=k)``: the ``k`` largest router probabilities of
  each token (``probs (B, S, E)``) and their experts (ties: the lower expert first);
* ``slot = MoESlots(expert, experts=E, capacity=C)``: each (token, choice) its place in
  its expert's buffer, ``e * C + c``, or ``-1`` when expert ``e`` already holds ``C``
  tokens of this sequence (the token is *dropped* for that choice, as a capacity factor
  drops it). Places are given in GShard's priority: every token's first choice, in
  order, then every second choice, and so on. Capacity counts per sequence (a batch
  row), so that what drops does not depend on how the batch is split;
* ``buffer = MoEDispatch(x, slot, experts=E, capacity=C)``: ``(E, B * C, H)``, expert
  ``e``'s rows ``b * C .. b * C + C - 1`` the tokens of sequence ``b`` it holds (zeros
  where a place is free). The experts are then batched products over the expert axis
  (``MatMul(buffer, w1 (E, H, F))``), one grouped GEMM per layer;
* ``y = MoECombine(out, slot, gate)``: each token's sum over its choices of the gate
  times its expert's output row (a dropped choice adds nothing).

``MoESlotDot(x, buffer, slot)`` (each choice's dot product of a token with its buffer
row) is the gates' gradient; ``MoEAuxLoss(probs, expert, weight=)`` is the auxiliary
load-balancing loss, per sequence.

Sharding: every op runs on any split of the batch; ``MoEDispatch`` also on a split of
the tokens (its buffer is then a partial sum: each part places its own tokens) and of
the hidden axis; ``MoECombine`` on a split of the tokens and the hidden axis, the
buffer whole; the slots need a sequence whole (a place depends on the tokens before).
The expert axis of the buffer stays whole in these ops: expert parallelism splits it
between them with an all-to-all (``ir.transforms.megatron(..., ep=)``).
"""

from __future__ import annotations

import numpy as np

from .. import attr_kinds as kinds
from ..errors import TypeRuleError
from ..registry import Attr, Cost, CostContext, OpDef, TypeContext, attach_rule, register_op
from ..types import DType, TensorType
from . import _factors as fx
from ._common import tensor
from ._examples import ctx, t

_INTS = (DType.int64, DType.int32)
_EXPERTS = Attr("experts", doc="number of experts E", kind=kinds.POS_INT)
_CAPACITY = Attr("capacity", doc="places per expert and sequence C", kind=kinds.POS_INT)


def _ints(c: TypeContext, i: int, what: str, rank: int = 3) -> TensorType:
    x = tensor(c, i, what)
    if x.dtype not in _INTS:
        raise TypeRuleError(f"{what} must be int64 or int32, got {x.dtype.value}")
    if x.rank != rank:
        raise TypeRuleError(f"{what} must have rank {rank} (batch, seq, k), got {x.shape}")
    return x


def _tokens(c: TypeContext, i: int = 0, what: str = "x") -> TensorType:
    x = tensor(c, i, what)
    if x.rank != 3 or not x.dtype.is_float:
        raise TypeRuleError(f"{what} must be a float (batch, seq, hidden) tensor, got {x}")
    return x


def _weights(c: TypeContext, i: int, like: TensorType, dtype: DType) -> None:
    if len(c.input_types) > i:
        w = tensor(c, i, "weights")
        if w.shape != like.shape or w.dtype is not dtype:
            raise TypeRuleError(
                f"weights must be {dtype.value} of the slots' shape {like.shape}, got {w}"
            )


def _buffer(c: TypeContext, i: int, x: TensorType, slot: TensorType) -> TensorType:
    y = tensor(c, i, "buffer")
    b = slot.shape[0]
    if y.rank != 3 or y.shape[2] != x.shape[2] or b == 0 or y.shape[1] % b:
        raise TypeRuleError(
            f"buffer must be (experts, batch * capacity, {x.shape[2]}) for a batch of {b}, "
            f"got shape {y.shape}"
        )
    if y.dtype is not x.dtype:
        raise TypeRuleError(f"buffer and tokens differ in dtype: {y.dtype.value}, {x.dtype.value}")
    return y


def _slot_of(slot: np.ndarray, batch: int, capacity: int) -> tuple:
    """(expert, row, valid) of every place ``slot`` (B, S, k) names in an (E, B * C, H)
    buffer; ``valid`` is False for dropped choices (-1)."""
    valid = slot >= 0
    s = np.where(valid, slot, 0)
    rows = np.arange(batch).reshape(-1, 1, 1) * capacity + s % capacity
    return s // capacity, rows, valid


# -- MoETopK -------------------------------------------------------------------------------


def _topk_types(c: TypeContext):
    x = tensor(c, 0, "probs")
    k = c.attributes["k"]
    if x.rank < 1 or not x.dtype.is_float:
        raise TypeRuleError(f"probs must be a float tensor of rank >= 1, got {x}")
    if k > x.shape[-1]:
        raise TypeRuleError(f"top-k of {k} is more than the {x.shape[-1]} experts (last axis)")
    shape = (*x.shape[:-1], k)
    return [x.with_shape(shape), TensorType(shape, DType.int64, x.device)]


def _topk(xs, a):
    (x,) = xs
    index = np.argsort(-x, axis=-1, kind="stable")[..., : a["k"]]
    return [np.take_along_axis(x, index, axis=-1), index.astype(np.int64)]


register_op(
    OpDef(
        name="MoETopK",
        operands=("probs",),
        results=("gate", "expert"),
        type_rule=_topk_types,
        kernel=_topk,
        cost_rule=lambda c: Cost(
            c.input_types[0].num_elements * c.attributes["k"],
            c.input_types[0].size_bytes,
            sum(y.size_bytes for y in c.output_types),
        ),
        attributes=(Attr("k", doc="choices per token", kind=kinds.POS_INT),),
        doc="The k largest entries of probs along its last axis, largest first (ties: the "
        "lower index first), and their indices: a router's gates and experts.",
        extra={
            "examples": lambda s: [ctx(t(2, 3 * s, 4), k=2), ctx(t(s, 5), k=1)],
        },
    )
)


def _topk_grad_types(c: TypeContext):
    index, dgate = tensor(c, 0, "expert"), tensor(c, 1, "dgate")
    if index.dtype not in _INTS or index.shape != dgate.shape or not dgate.dtype.is_float:
        raise TypeRuleError(f"expert (int) and dgate (float) must match, got {index}, {dgate}")
    if c.attributes["experts"] < index.shape[-1]:
        raise TypeRuleError(f"{c.attributes['experts']} experts is fewer than the choices")
    return [dgate.with_shape((*dgate.shape[:-1], c.attributes["experts"]))]


def _topk_grad(xs, a):
    index, dgate = xs
    out = np.zeros((*dgate.shape[:-1], a["experts"]), dtype=dgate.dtype)
    np.put_along_axis(out, index.astype(np.int64), dgate, axis=-1)
    return [out]


register_op(
    OpDef(
        name="MoETopKGrad",
        operands=("expert", "dgate"),
        results=("dprobs",),
        type_rule=_topk_grad_types,
        kernel=_topk_grad,
        cost_rule=lambda c: Cost(
            0.0, sum(x.size_bytes for x in c.input_types), c.output_types[0].size_bytes
        ),
        attributes=(_EXPERTS,),
        doc="Gradient of MoETopK's gates: dgate placed at each choice's index of a zero "
        "(..., experts) tensor.",
        extra={
            "value_ranges": lambda op: {0: (0, op.attributes["experts"])},
            "examples": lambda s: [
                ctx(t(2, s, 2, dtype=DType.int64), t(2, s, 2), experts=4),
                ctx(t(3 * s, 1, dtype=DType.int64), t(3 * s, 1), experts=3),
            ],
        },
    )
)


# -- MoESlots --------------------------------------------------------------------------------


def _slots_types(c: TypeContext):
    index = _ints(c, 0, "expert")
    if len(c.input_types) > 1:
        order = tensor(c, 1, "positions")
        if order.dtype not in _INTS or order.shape != (index.shape[1],):
            raise TypeRuleError(f"positions must be {index.shape[1]} ints, got {order}")
    return [TensorType(index.shape, DType.int64, index.device)]


def moe_slots(
    expert: np.ndarray, experts: int, capacity: int, positions: np.ndarray | None = None
) -> np.ndarray:
    """Each (token, choice) of ``expert (B, S, k)`` its place ``e * C + c`` in its expert's
    buffer, or -1 past the capacity: choices in GShard's priority (every token's first,
    then every token's second, ...), counted per sequence; tokens in the order of their
    ``positions`` (default: as they come)."""
    b, s, k = expert.shape
    out = np.full((b, s, k), -1, dtype=np.int64)
    order = range(s) if positions is None else np.argsort(positions, kind="stable")
    for row in range(b):
        count = np.zeros(experts, dtype=np.int64)
        for j in range(k):
            for pos in order:
                e = int(expert[row, pos, j])
                if 0 <= e < experts and count[e] < capacity:
                    out[row, pos, j] = e * capacity + count[e]
                    count[e] += 1
    return out


register_op(
    OpDef(
        name="MoESlots",
        operands=("expert", "positions"),
        results=("slot",),
        type_rule=_slots_types,
        kernel=lambda xs, a: [
            moe_slots(xs[0], a["experts"], a["capacity"], xs[1] if len(xs) > 1 else None)
        ],
        variadic=True,
        cost_rule=lambda c: Cost(
            float(c.input_types[0].num_elements),
            c.input_types[0].size_bytes,
            c.output_types[0].size_bytes,
        ),
        attributes=(_EXPERTS, _CAPACITY),
        doc="Places in the experts' buffers (e * capacity + c) of each token's choices "
        "(batch, seq, k) in GShard's priority, counted per sequence; -1: dropped (the "
        "expert is full). With positions (seq,), tokens are taken in their order (context "
        "parallelism's permuted sequences keep the places of the sequential program).",
        extra={
            # over a sequence in another order (context parallelism): the tokens taken in
            # the order of their positions
            "context_form": lambda b, op, ins, ctx: (
                None
                if len(ins) > 1
                else b.add_op(
                    op.op_type, [*ins, ctx.positions()], op.attributes, names=[op.outputs[0].name]
                ).outputs
            ),
            "value_ranges": lambda op: {
                0: (0, op.attributes["experts"]),
                **({1: (0, op.inputs[0].type.shape[1])} if len(op.inputs) > 1 else {}),
            },
            "examples": lambda s: [
                ctx(t(2, 3 * s, 2, dtype=DType.int64), experts=3, capacity=s),
                ctx(t(1, 2 * s, 1, dtype=DType.int64), experts=2, capacity=2 * s),
                ctx(
                    t(2, 2 * s, 2, dtype=DType.int64),
                    t(2 * s, dtype=DType.int64),
                    experts=3,
                    capacity=s,
                ),
            ],
        },
    )
)


# -- MoEDispatch / MoECombine / MoESlotDot ------------------------------------------------


def _dispatch_types(c: TypeContext):
    x, slot = _tokens(c), _ints(c, 1, "slot")
    if slot.shape[:2] != x.shape[:2]:
        raise TypeRuleError(f"slot {slot.shape} and x {x.shape} must share (batch, seq)")
    _weights(c, 2, slot, x.dtype)
    e, cap = c.attributes["experts"], c.attributes["capacity"]
    return [x.with_shape((e, x.shape[0] * cap, x.shape[2]))]


def _dispatch(xs, a):
    x, slot = xs[:2]
    b, _, h = x.shape
    cap = a["capacity"]
    out = np.zeros((a["experts"], b * cap, h), dtype=x.dtype)
    expert, rows, valid = _slot_of(slot, b, cap)
    picked = np.broadcast_to(x[:, :, None, :], (*slot.shape, h))
    if len(xs) > 2:
        picked = picked * xs[2][..., None]
    np.add.at(out, (expert[valid], rows[valid]), picked[valid])
    return [out]


def _combine_types(c: TypeContext):
    slot = _ints(c, 1, "slot")
    y = tensor(c, 0, "buffer")
    if y.rank != 3 or not y.dtype.is_float:
        raise TypeRuleError(f"buffer must be a float (experts, batch * capacity, hidden), got {y}")
    x = y.with_shape((slot.shape[0], slot.shape[1], y.shape[2]))
    _buffer(c, 0, x, slot)
    _weights(c, 2, slot, y.dtype)
    return [x]


def _gathered(y: np.ndarray, slot: np.ndarray) -> np.ndarray:
    """(B, S, k, H): each choice's buffer row (zero where dropped)."""
    b = slot.shape[0]
    expert, rows, valid = _slot_of(slot, b, y.shape[1] // b)
    return np.where(valid[..., None], y[expert, rows], y.dtype.type(0))


def _combine(xs, a):
    y, slot = xs[:2]
    rows = _gathered(y, slot)
    if len(xs) > 2:
        rows = rows * xs[2][..., None]
    return [rows.sum(axis=2).astype(y.dtype, copy=False)]


def _slot_dot_types(c: TypeContext):
    x, slot = _tokens(c), _ints(c, 2, "slot")
    _buffer(c, 1, x, slot)
    if slot.shape[:2] != x.shape[:2]:
        raise TypeRuleError(f"slot {slot.shape} and x {x.shape} must share (batch, seq)")
    return [TensorType(slot.shape, x.dtype, slot.device)]


def _slot_dot(xs, a):
    x, y, slot = xs
    return [np.einsum("bskh,bsh->bsk", _gathered(y, slot), x).astype(x.dtype, copy=False)]


def _moved_cost(c: CostContext) -> Cost:
    """A gather or scatter of token rows: one row per (token, choice) read and written, the
    buffer zeroed; a weight multiplies each moved element."""
    slot = next(x for x in c.input_types if x.dtype in _INTS)
    hidden = c.input_types[0].shape[-1]
    moved = slot.num_elements * hidden * c.input_types[0].dtype.itemsize_bytes
    flops = float(slot.num_elements * hidden) * (len(c.input_types) - 1)
    read = moved + sum(x.size_bytes for x in c.input_types[1:])
    return Cost(flops, read, moved + c.output_types[0].size_bytes)


def _dispatch_examples(s: int) -> list[TypeContext]:
    ids = t(2, 3 * s, 2, dtype=DType.int64)
    return [
        ctx(t(2, 3 * s, 4), ids, experts=3, capacity=2 * s),
        ctx(
            t(1, 2 * s, 3),
            t(1, 2 * s, 1, dtype=DType.int64),
            t(1, 2 * s, 1),
            experts=2,
            capacity=s,
        ),
    ]


def _combine_examples(s: int) -> list[TypeContext]:
    return [
        ctx(t(3, 2 * 2 * s, 4), t(2, 3 * s, 2, dtype=DType.int64), t(2, 3 * s, 2)),
        ctx(t(2, s, 3), t(1, 2 * s, 1, dtype=DType.int64)),
    ]


def _slot_range(op) -> dict:
    """The slot operand's values: -1 (dropped) or a place of the buffer."""
    if op.op_type == "MoEDispatch":
        buffer, index = op.outputs[0].type, 1
    elif op.op_type == "MoECombine":
        buffer, index = op.inputs[0].type, 1
    else:
        buffer, index = op.inputs[1].type, 2
    rows = op.inputs[index].type.shape[0]
    places = buffer.shape[0] * (buffer.shape[1] // max(rows, 1))
    return {index: (-1, places)}


register_op(
    OpDef(
        name="MoEDispatch",
        operands=("x", "slot", "weights"),
        results=("buffer",),
        type_rule=_dispatch_types,
        kernel=_dispatch,
        cost_rule=_moved_cost,
        attributes=(_EXPERTS, _CAPACITY),
        variadic=True,
        doc="The experts' buffer (experts, batch * capacity, hidden): each token x[b, s] "
        "(times weights[b, s, j] if given) at the place slot[b, s, j] names in sequence b's "
        "rows, zeros where no token is; -1 places nothing.",
        extra={
            "value_ranges": _slot_range,
            "nondiff_operands": (1,),
            "examples": _dispatch_examples,
            # under sequence parallelism it reads the tokens whole (gathered), as the
            # column-parallel experts after it do: its buffer is then whole on every tensor
            # rank, not a partial sum of the buffer's size
            "whole_tokens": True,
            "expert_buffer": "made",  # expert parallelism splits its result by experts
        },
    )
)

register_op(
    OpDef(
        name="MoECombine",
        operands=("buffer", "slot", "weights"),
        results=("y",),
        type_rule=_combine_types,
        kernel=_combine,
        cost_rule=_moved_cost,
        variadic=True,
        doc="Each token's sum over its choices j of weights[b, s, j] (1 if not given) times "
        "the buffer row slot[b, s, j] names; dropped choices (-1) add nothing.",
        extra={
            "expert_buffer": "read",  # reads places back (by token)
            "value_ranges": _slot_range,
            "nondiff_operands": (1,),
            "examples": _combine_examples,
        },
    )
)

register_op(
    OpDef(
        name="MoESlotDot",
        operands=("x", "buffer", "slot"),
        results=("dots",),
        type_rule=_slot_dot_types,
        kernel=_slot_dot,
        cost_rule=_moved_cost,
        doc="(batch, seq, k): the dot product of each token x[b, s] with the buffer row of "
        "each of its choices (0 where dropped): the gradient of MoECombine's weights.",
        extra={
            "expert_buffer": "read",  # reads places back (by token)
            "value_ranges": _slot_range,
            "nondiff_operands": (2,),
            "examples": lambda s: [
                ctx(t(2, 3 * s, 4), t(3, 2 * 2 * s, 4), t(2, 3 * s, 2, dtype=DType.int64)),
            ],
        },
    )
)


# -- MoEAuxLoss ---------------------------------------------------------------------------------


def _aux_types(c: TypeContext):
    probs, index = _tokens(c, 0, "probs"), _ints(c, 1, "expert")
    if index.shape[:2] != probs.shape[:2] or index.shape[2] > probs.shape[2]:
        raise TypeRuleError(f"expert {index.shape} must be (batch, seq, k) of probs {probs.shape}")
    return [TensorType((), probs.dtype, probs.device)]


def _fraction(index: np.ndarray, experts: int, dtype) -> np.ndarray:
    """(B, E): the fraction of each sequence's choices that went to each expert."""
    b, s, k = index.shape
    out = np.zeros((b, experts), dtype=dtype)
    for row in range(b):
        np.add.at(out[row], index[row].reshape(-1), 1)
    return out / dtype.type(s * k)


def _aux(xs, a):
    probs, index = xs
    f = _fraction(index, probs.shape[2], probs.dtype)
    p = probs.mean(axis=1)
    return [np.asarray(a["weight"] * np.sum(f * p), dtype=probs.dtype)]


def _aux_grad_types(c: TypeContext):
    index, dloss = _ints(c, 0, "expert"), tensor(c, 1, "dloss")
    if dloss.rank or not dloss.dtype.is_float:
        raise TypeRuleError(f"dloss must be a float scalar, got {dloss}")
    e = c.attributes["experts"]
    return [TensorType((*index.shape[:2], e), dloss.dtype, index.device)]


def _aux_grad(xs, a):
    index, dloss = xs
    dtype = np.asarray(dloss).dtype
    f = _fraction(index, a["experts"], dtype)
    seq = index.shape[1]
    per_token = (dtype.type(a["weight"]) * np.asarray(dloss) / dtype.type(seq)) * f
    return [np.broadcast_to(per_token[:, None, :], (*index.shape[:2], a["experts"])).copy()]


_WEIGHT = Attr(
    "weight", doc="the loss's factor (aux_loss * experts / global batch)", kind=kinds.FINITE
)

register_op(
    OpDef(
        name="MoEAuxLoss",
        operands=("probs", "expert"),
        results=("loss",),
        type_rule=_aux_types,
        kernel=_aux,
        cost_rule=lambda c: Cost(
            2.0 * c.input_types[0].num_elements,
            sum(x.size_bytes for x in c.input_types),
            c.output_types[0].size_bytes,
        ),
        attributes=(_WEIGHT,),
        doc="Switch Transformer's load-balancing loss per sequence: weight * sum over rows b "
        "and experts e of f[b, e] * P[b, e], f the fraction of row b's choices (expert: "
        "batch, seq, k) routed to e, P the mean over the row of probs (batch, seq, experts).",
        extra={
            "value_ranges": lambda op: {1: (0, op.inputs[0].type.shape[2])},
            "nondiff_operands": (1,),
            "examples": lambda s: [
                ctx(t(2, 3 * s, 4), t(2, 3 * s, 2, dtype=DType.int64), weight=0.01),
                ctx(t(s, 2, 3), t(s, 2, 1, dtype=DType.int64), weight=1.5),
            ],
        },
    )
)

register_op(
    OpDef(
        name="MoEAuxLossGrad",
        operands=("expert", "dloss"),
        results=("dprobs",),
        type_rule=_aux_grad_types,
        kernel=_aux_grad,
        cost_rule=lambda c: Cost(
            float(c.output_types[0].num_elements),
            sum(x.size_bytes for x in c.input_types),
            c.output_types[0].size_bytes,
        ),
        attributes=(_EXPERTS, _WEIGHT),
        doc="Gradient of MoEAuxLoss with respect to probs: weight * dloss * f[b, e] / seq at "
        "every token of row b.",
        extra={
            "value_ranges": lambda op: {0: (0, op.attributes["experts"])},
            "examples": lambda s: [
                ctx(t(2, 3 * s, 2, dtype=DType.int64), t(), experts=4, weight=0.01),
                ctx(t(s, 2, 1, dtype=DType.int64), t(), experts=2, weight=2.0),
            ],
        },
    )
)


# -- sharding rules --------------------------------------------------------------------------
# Batch rows are independent everywhere; tokens split where an op places or reads them one
# by one (dispatch: its buffer a partial sum); the buffer's expert and place axes whole.


def _lead(c: TypeContext) -> tuple[str, ...]:
    return fx.axes(c.input_types[0].rank - 1)


fx.attach("MoETopK", lambda c: fx.rule([(*_lead(c), None)], [(*_lead(c), None)] * 2))
fx.attach(
    "MoETopKGrad",
    lambda c: fx.rule([(*_lead(c), None)] * 2, [(*_lead(c), None)], linear=[(1,)]),
)
fx.attach(
    "MoESlots",
    lambda c: fx.rule([("b", None, None), (None,)][: len(c.input_types)], [("b", None, None)]),
)
# the loss sums over rows (a partial sum when they split); a row's fraction and mean
# probability multiply, so its tokens stay together
fx.attach(
    "MoEAuxLoss",
    lambda c: fx.rule([("b", None, None), ("b", None, None)], [()], reduce={"b": "sum"}),
)
fx.attach(
    "MoEAuxLossGrad",
    lambda c: fx.rule([("b", None, None), ()], [("b", None, None)], linear=[(1,)]),
)


def _dispatch_sharding(c: TypeContext) -> dict:
    weighted = len(c.input_types) > 2
    operands = [("b", "s", "h"), ("b", "s", None)] + ([("b", "s", None)] if weighted else [])
    linear = [(0,), (2,)] if weighted else [(0,)]
    return fx.rule(operands, [(None, "b", "h")], reduce={"s": "sum"}, linear=linear)


def _combine_sharding(c: TypeContext) -> dict:
    weighted = len(c.input_types) > 2
    operands = [(None, "b", "h"), ("b", "s", None)] + ([("b", "s", None)] if weighted else [])
    linear = [(0,), (2,)] if weighted else [(0,)]
    return fx.rule(operands, [("b", "s", "h")], linear=linear)


def _slot_dot_sharding(c: TypeContext) -> dict:
    return fx.rule(
        [("b", "s", "h"), (None, "b", "h"), ("b", "s", None)],
        [("b", "s", None)],
        reduce={"h": "sum"},
        linear=[(0,), (1,)],
    )


fx.attach("MoEDispatch", _dispatch_sharding)
fx.attach("MoECombine", _combine_sharding)
fx.attach("MoESlotDot", _slot_dot_sharding)


# -- gradient rules (autodiff) ---------------------------------------------------------------


def _topk_gradient(b, op, ins, outs, dys):
    from ._grad import gname

    dgate = dys[0]
    if dgate is None:
        return [None]
    (x,) = ins
    experts = x.type.shape[-1]
    return [b.call("MoETopKGrad", outs[1], dgate, experts=experts, name=gname(x))]


def _dispatch_gradient(b, op, ins, outs, dys):
    from ._grad import gname

    (dbuf,) = dys
    if dbuf is None:
        return [None] * len(ins)
    x, slot, *w = ins
    dx = b.call("MoECombine", dbuf, slot, *w, name=gname(x))
    if not w:
        return [dx, None]
    dw = b.call("MoESlotDot", x, dbuf, slot, name=gname(w[0]))
    return [dx, None, dw]


def _combine_gradient(b, op, ins, outs, dys):
    from ._grad import gname

    (dy,) = dys
    if dy is None:
        return [None] * len(ins)
    y, slot, *w = ins
    e, rows = y.type.shape[0], y.type.shape[1]
    cap = rows // slot.type.shape[0]
    dbuf = b.call("MoEDispatch", dy, slot, *w, experts=e, capacity=cap, name=gname(y))
    if not w:
        return [dbuf, None]
    return [dbuf, None, b.call("MoESlotDot", dy, y, slot, name=gname(w[0]))]


def _slot_dot_gradient(b, op, ins, outs, dys):
    from ._grad import gname

    (dz,) = dys
    if dz is None:
        return [None, None, None]
    x, y, slot = ins
    e, cap = y.type.shape[0], y.type.shape[1] // slot.type.shape[0]
    dx = b.call("MoECombine", y, slot, dz, name=gname(x))
    dy = b.call("MoEDispatch", x, slot, dz, experts=e, capacity=cap, name=gname(y))
    return [dx, dy, None]


attach_rule("MoETopK", "gradient_rule", _topk_gradient)
attach_rule("MoEDispatch", "gradient_rule", _dispatch_gradient)
attach_rule("MoECombine", "gradient_rule", _combine_gradient)
attach_rule("MoESlotDot", "gradient_rule", _slot_dot_gradient)
attach_rule("MoESlots", "gradient_rule", lambda b, op, ins, outs, dys: [None] * len(ins))


def _aux_gradient(b, op, ins, outs, dys):
    from ._grad import gname

    (dloss,) = dys
    if dloss is None:
        return [None, None]
    probs, index = ins
    e, w = probs.type.shape[2], op.attributes["weight"]
    return [b.call("MoEAuxLossGrad", index, dloss, experts=e, weight=w, name=gname(probs)), None]


attach_rule("MoEAuxLoss", "gradient_rule", _aux_gradient)
