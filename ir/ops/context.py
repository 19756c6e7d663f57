"""Context parallelism's ops: attention over one block of keys at explicit positions, its
gradient and the positions themselves (the ring's shift of a tuple to the next member,
``RingShift``, is in :mod:`ir.ops.ring`).

Context parallelism (``ir.transforms.megatron(..., cp=)``) splits each sequence over a
group of devices. Causal attention then needs to know where each query and key sits, so
these ops take the positions as data:

* ``SequencePositions(n, ranks)``: ``0 .. n - 1`` in context parallelism's load-balanced
  order (Megatron-Core's): ``2 * ranks`` chunks, rank ``r``'s part chunks ``r`` and
  ``2 * ranks - 1 - r``, so that every rank's queries attend about as many keys;
  ``ranks = 1`` is plain ``0 .. n - 1``.
* ``(out, lse) = AttentionBlock(q, k, v, q_pos, k_pos[, out_prev, lse_prev])``: the
  attention of ``q`` over the keys and values given, query ``i`` attending key ``j`` iff
  ``k_pos[j] <= q_pos[i]`` when ``causal``; ``lse`` (batch, heads, queries) is each row's
  log-sum-exp of scaled scores (``-inf`` for a row with no key), so that blocks of keys
  combine: with ``out_prev, lse_prev`` (the blocks so far) the result is the attention
  over all of them (FlashAttention's online softmax; ring attention, Liu et al. 2023).
  Over the whole sequence it equals ``Attention``.
* ``(dq, dk, dv) = AttentionBlockGrad(q, k, v, out, dout, lse, q_pos, k_pos)``: the part
  of the gradient that one block of keys gives, from the whole attention's ``out`` and
  ``lse`` (FlashAttention-2's backward, one key block at a time).

Cost: as ``Attention``'s, over the pairs a causal block attends, which the balanced order
makes exactly half of every block (a rank's chunks ``r`` and ``2 cp - 1 - r`` attend, of
the keys of any rank, the first chunk whole or the second not at all, and of their own a
causal half each: Megatron-Core's case split), so a causal block counts half its pairs.
"""

from __future__ import annotations

import math

import numpy as np

from .. import attr_kinds as kinds
from ..errors import TypeRuleError
from ..registry import Attr, Cost, CostContext, OpDef, TypeContext, attach_rule, register_op
from ..types import DType, TensorType
from . import _factors as fx
from ._common import memory_cost, tensor
from ._examples import ctx, t
from .attention import _grouped, _head_operand, _ungrouped, attended_pairs, heads_limit

_ATTRIBUTES = (
    Attr("causal", False, "key j is attended by query i iff k_pos[j] <= q_pos[i]", kind=kinds.BOOL),
    Attr("scale", None, "factor on q k^T; None is 1/sqrt(D)", kind=kinds.optional(kinds.FINITE)),
)
_INTS = (DType.int64, DType.int32)

# -- SequencePositions ---------------------------------------------------------------------


def balanced_positions(n: int, ranks: int) -> np.ndarray:
    """``0 .. n - 1`` in the load-balanced order of ``ranks`` (rank r: chunks r and
    2 ranks - 1 - r of 2 ranks), as one array: rank r's part is the r-th of ``ranks``."""
    if ranks == 1:
        return np.arange(n, dtype=np.int64)
    chunks = np.split(np.arange(n, dtype=np.int64), 2 * ranks)
    return np.concatenate(
        [np.concatenate([chunks[r], chunks[2 * ranks - 1 - r]]) for r in range(ranks)]
    )


def _positions_types(c: TypeContext):
    n, ranks = c.attributes["n"], c.attributes["ranks"]
    if ranks > 1 and n % (2 * ranks):
        raise TypeRuleError(f"{n} positions do not cut into {2 * ranks} equal chunks")
    return [TensorType((n,), DType.int64, c.attributes["device"])]


register_op(
    OpDef(
        name="SequencePositions",
        operands=(),
        results=("positions",),
        type_rule=_positions_types,
        kernel=lambda xs, a: [balanced_positions(a["n"], a["ranks"])],
        cost_rule=memory_cost,
        attributes=(
            Attr("n", doc="sequence length", kind=kinds.POS_INT),
            Attr("ranks", 1, "context-parallel ranks of the order", kind=kinds.POS_INT),
            Attr("device", None, "device the positions live on", kind=kinds.DEVICE),
        ),
        doc="Positions 0 .. n - 1 in context parallelism's load-balanced order: 2 * ranks "
        "chunks, rank r's part chunks r and 2 * ranks - 1 - r.",
        extra={"examples": lambda s: [ctx(n=4 * s, ranks=2, device=0), ctx(n=3 * s, device=1)]},
    )
)


# -- AttentionBlock and its gradient -------------------------------------------------------------


def _positions(c: TypeContext, i: int, n: int, what: str) -> None:
    x = tensor(c, i, what)
    if x.dtype not in _INTS or x.shape != (n,):
        raise TypeRuleError(f"{what} must be {n} int64 positions, got {x}")


def _check(c: TypeContext, fixed: int) -> tuple[TensorType, TensorType, TensorType]:
    q = _head_operand(c, 0, "q", "(batch, heads, query_seq, head_dim)")
    k = _head_operand(c, 1, "k", "(batch, kv_heads, key_seq, head_dim)")
    v = _head_operand(c, 2, "v", "(batch, kv_heads, key_seq, value_dim)")
    if not q.dtype is k.dtype is v.dtype:
        raise TypeRuleError("q, k and v must have one dtype")
    if q.shape[0] != k.shape[0] or k.shape[:3] != v.shape[:3] or q.shape[3] != k.shape[3]:
        raise TypeRuleError(f"q {q.shape}, k {k.shape}, v {v.shape} do not fit together")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise TypeRuleError(f"q's {q.shape[1]} heads are not a multiple of k's {k.shape[1]}")
    _positions(c, fixed, q.shape[2], "q_pos")
    _positions(c, fixed + 1, k.shape[2], "k_pos")
    return q, k, v


def _block_types(c: TypeContext):
    q, _, v = _check(c, 3)
    out = q.with_shape((*q.shape[:3], v.shape[3]))
    lse = q.with_shape(q.shape[:3])
    if len(c.input_types) not in (5, 7):
        raise TypeRuleError("AttentionBlock takes q, k, v, q_pos, k_pos and optionally out, lse")
    if len(c.input_types) == 7 and (c.input_types[5] != out or c.input_types[6] != lse):
        raise TypeRuleError(f"out_prev and lse_prev must be {out} and {lse}")
    return [out, lse]


def _scores(q, k, q_pos, k_pos, a) -> np.ndarray:
    """Scaled scores (B, Hkv, G, Sq, Sk), masked keys at -inf."""
    scale = a["scale"]
    scale = 1.0 / math.sqrt(q.shape[3]) if scale is None else scale
    s = np.matmul(_grouped(q, k.shape[1]), np.swapaxes(k, -1, -2)[:, :, None])
    s = s * q.dtype.type(scale)
    if a["causal"]:
        s = np.where(k_pos[None, :] <= q_pos[:, None], s, q.dtype.type(-np.inf))
    return s


def _merge(o1, l1, o2, l2):
    """Two blocks' attention (outputs and log-sum-exps) as one: the online softmax."""
    top = np.maximum(l1, l2)
    safe = np.where(np.isneginf(top), 0, top)
    w1, w2 = np.exp(l1 - safe), np.exp(l2 - safe)
    total = w1 + w2
    lse = np.where(total > 0, safe + np.log(np.where(total > 0, total, 1)), -np.inf)
    denominator = np.where(total > 0, total, 1)[..., None]
    out = (o1 * w1[..., None] + o2 * w2[..., None]) / denominator
    return out.astype(o1.dtype), lse.astype(o1.dtype)


def _block(xs, a):
    q, k, v, q_pos, k_pos = xs[:5]
    s = _scores(q, k, q_pos, k_pos, a)
    top = np.max(s, axis=-1) if s.shape[-1] else np.full(s.shape[:-1], -np.inf, s.dtype)
    dead = np.isneginf(top)
    e = np.exp(s - np.where(dead, 0, top)[..., None])
    total = np.sum(e, axis=-1)
    out = np.matmul(e, v[:, :, None]) / np.where(dead, 1, total)[..., None]
    lse = np.where(dead, -np.inf, top + np.log(np.where(dead, 1, total)))
    out, lse = _ungrouped(out).astype(q.dtype), _ungrouped(lse).astype(q.dtype)
    if len(xs) > 5:
        out, lse = _merge(xs[5], xs[6], out, lse)
    return [out, lse]


def _block_grad_types(c: TypeContext):
    if len(c.input_types) != 8:
        raise TypeRuleError("AttentionBlockGrad takes q, k, v, out, dout, lse, q_pos, k_pos")
    q, k, v = _check(c, 6)
    want = q.with_shape((*q.shape[:3], v.shape[3]))
    for i, what in ((3, "out"), (4, "dout")):
        if c.input_types[i] != want:
            raise TypeRuleError(f"{what} must be {want}, got {c.input_types[i]}")
    if c.input_types[5] != q.with_shape(q.shape[:3]):
        raise TypeRuleError(f"lse must be {q.with_shape(q.shape[:3])}, got {c.input_types[5]}")
    return [q, k, v]


def _block_grad(xs, a):
    q, k, v, out, dout, lse, q_pos, k_pos = xs
    hkv = k.shape[1]
    s = _scores(q, k, q_pos, k_pos, a)
    level = _grouped(lse, hkv)[..., None]
    p = np.where(np.isneginf(level), 0, np.exp(s - np.where(np.isneginf(level), 0, level)))
    do = _grouped(dout, hkv)
    dv = np.sum(np.matmul(np.swapaxes(p, -1, -2), do), axis=2)
    dp = np.matmul(do, np.swapaxes(v, -1, -2)[:, :, None])
    rows = np.sum(do * _grouped(out, hkv), axis=-1, keepdims=True)
    scale = a["scale"]
    scale = 1.0 / math.sqrt(q.shape[3]) if scale is None else scale
    ds = p * (dp - rows) * q.dtype.type(scale)
    dq = np.matmul(ds, k[:, :, None])
    dk = np.sum(np.matmul(np.swapaxes(ds, -1, -2), _grouped(q, hkv)), axis=2)
    return [_ungrouped(dq).astype(q.dtype), dk.astype(q.dtype), dv.astype(q.dtype)]


def _cost(c: CostContext, width_of, kernel: str, launches: int) -> Cost:
    q, k, v = c.input_types[:3]
    n, sq, sk, d, dv = q.shape[0] * q.shape[1], q.shape[2], k.shape[2], q.shape[3], v.shape[3]
    # a causal block of a load-balanced split attends exactly half its pairs (see above)
    pairs = sq * sk / 2.0 if c.attributes["causal"] else attended_pairs(sq, sk, False)
    flops = 2.0 * n * pairs * width_of(d, dv)
    read = sum(x.size_bytes for x in c.input_types)
    written = sum(x.size_bytes for x in c.output_types)
    gemms = ((n, sq, sk, d),)
    return Cost(flops, read, written, flops, gemms=gemms, kernel=kernel, launches=launches)


def _block_cost(c: CostContext) -> Cost:
    return _cost(c, lambda d, dv: d + dv, "attention", 1)


def _block_grad_cost(c: CostContext) -> Cost:
    return _cost(c, lambda d, dv: 3 * d + 2 * dv, "attention_grad", 3)


def _examples(s: int, grad: bool = False) -> list[TypeContext]:
    pos = t(2 * s, dtype=DType.int64)
    kpos = t(3 * s, dtype=DType.int64)

    def case(b, hq, hkv, d, dv, *more, **attributes):
        base = [t(b, hq, 2 * s, d), t(b, hkv, 3 * s, d), t(b, hkv, 3 * s, dv)]
        if grad:
            base += [t(b, hq, 2 * s, dv), t(b, hq, 2 * s, dv), t(b, hq, 2 * s)]
        return ctx(*base, pos, kpos, *more, **attributes)

    cases = [case(2, 2, 2, 4, 4, causal=True), case(1, 4, 2, 2 * s, 3, scale=0.5)]
    if not grad:
        cases.append(case(1, 2, 1, 2, 2, t(1, 2, 2 * s, 2), t(1, 2, 2 * s), causal=True))
    return cases


def _position_ranges(op) -> dict:
    first = 6 if op.op_type == "AttentionBlockGrad" else 3
    top = max(op.inputs[first].type.shape[0], op.inputs[first + 1].type.shape[0])
    return {first: (0, top), first + 1: (0, top)}


register_op(
    OpDef(
        name="AttentionBlock",
        operands=("q", "k", "v", "q_pos", "k_pos", "prev"),
        results=("out", "lse"),
        type_rule=_block_types,
        kernel=_block,
        cost_rule=_block_cost,
        attributes=_ATTRIBUTES,
        variadic=True,
        doc="Attention of q (B, Hq, Sq, D) over one block of keys k, v (B, Hkv, Sk, D/Dv) "
        "at explicit positions q_pos (Sq,), k_pos (Sk,) (causal: k_pos[j] <= q_pos[i]); also "
        "each row's log-sum-exp (B, Hq, Sq). With out_prev, lse_prev (the blocks so far) the "
        "attention over all the blocks (online softmax): ring attention's step.",
        extra={
            "examples": _examples,
            "value_ranges": _position_ranges,
            "nondiff_operands": (3, 4),
            # ring attention (ir.transforms._megatron_ring) runs it block by block, merging
            # each block into the blocks so far
            "ring_attention": "block",
            "positions_operand": 3,
            "heads_limit": heads_limit,
        },
    )
)

register_op(
    OpDef(
        name="AttentionBlockGrad",
        operands=("q", "k", "v", "out", "dout", "lse", "q_pos", "k_pos"),
        results=("dq", "dk", "dv"),
        type_rule=_block_grad_types,
        kernel=_block_grad,
        cost_rule=_block_grad_cost,
        attributes=_ATTRIBUTES,
        doc="One key block's part of the attention's gradients (dq, dk, dv), from the whole "
        "attention's out and lse (FlashAttention-2's backward by key blocks).",
        extra={
            "examples": lambda s: _examples(s, grad=True),
            "value_ranges": _position_ranges,
            "nondiff_operands": (6, 7),
            # ring attention runs it once per key block, summing dq and passing dk, dv on
            "ring_attention": "gradient",
            "positions_operand": 6,
            "heads_limit": heads_limit,
            # dk, dv: sums over the queries of a context-parallel group, reduce-scattered to
            # the keys' split as they are made (ir.transforms._megatron_context)
            "key_gradients": (1, 2),
        },
    )
)


def attention_context_form(b, op, ins, ctx):
    """``Attention`` (or its gradient) over a sequence in another order: an attention block
    at the sequence's positions (``ctx.positions()``), the gradient with the forward's
    log-sum-exp (``ctx.lse``: result -> log-sum-exp); or why it cannot be."""
    grad = op.op_type == "AttentionGrad"
    fixed = 5 if grad else 3
    q, k = op.inputs[0].type, op.inputs[1].type
    if len(ins) > fixed:
        return f"{op.op_type} takes a mask: build the model with no mask"
    if q.shape[2] != k.shape[2]:
        return f"{op.op_type} has fewer queries than keys: use cp=1"
    pos = ctx.positions()
    if not grad:
        name = op.outputs[0].name
        made = b.add_op(
            "AttentionBlock", [*ins, pos, pos], op.attributes, names=[name, f"{name}_lse"]
        )
        ctx.lse[op.outputs[0]] = made.outputs[1]
        return made.outputs[:1]
    lse = ctx.lse.get(op.inputs[3])
    if lse is None:
        return "the attention whose gradient it is is not in the same piece"
    names = [v.name for v in op.outputs]
    return b.add_op("AttentionBlockGrad", [*ins, lse, pos, pos], op.attributes, names=names).outputs


# -- sharding rules ------------------------------------------------------------------------------
# Batch and heads split (kv heads with the query heads, in proportion), the queries split with
# their positions (positions make a causal block's mask independent of where its queries sit);
# the keys stay whole. The gradient's dk, dv sum over the queries.


def _kv(c: TypeContext) -> str | None:
    q, k = c.input_types[0], c.input_types[1]
    return None if k.shape[1] == 1 and q.shape[1] > 1 else "h"


def _block_sharding(c: TypeContext) -> dict:
    kv = _kv(c)
    rows = ("b", "h", "sq", "dv")
    operands = [
        ("b", "h", "sq", None),
        ("b", kv, None, None),
        ("b", kv, None, "dv"),
        ("sq",),
        (None,),
    ]
    if len(c.input_types) == 7:
        operands += [rows, ("b", "h", "sq")]
    return fx.rule(operands, [rows, ("b", "h", "sq")])


def _block_grad_sharding(c: TypeContext) -> dict:
    kv = _kv(c)
    rows = ("b", "h", "sq", None)
    kv_axes = ("b", kv, None, None)
    reduce = {"sq": "sum"}
    if kv is None:
        reduce["h"] = "sum"
    return fx.rule(
        [rows, kv_axes, kv_axes, rows, rows, ("b", "h", "sq"), ("sq",), (None,)],
        [rows, kv_axes, kv_axes],
        reduce=reduce,
        linear=[(4,)],
    )


fx.attach("AttentionBlock", _block_sharding)
fx.attach("AttentionBlockGrad", _block_grad_sharding)
fx.attach("SequencePositions", lambda c: fx.rule([], [(None,)]))


# -- gradient rules (autodiff) -------------------------------------------------------------------


def _block_gradient(b, op, ins, outs, dys):
    from ..errors import DistIRError
    from ._grad import gname

    dout, dlse = dys
    if len(ins) > 5 or dlse is not None:
        raise DistIRError(
            "AttentionBlock has a gradient rule for a whole attention only (no blocks so far, "
            "its lse unused): context parallelism writes the blocks' backward itself"
        )
    if dout is None:
        return [None] * len(ins)
    q, k, v, q_pos, k_pos = ins
    dq, dk, dv = b.call(
        "AttentionBlockGrad",
        q,
        k,
        v,
        outs[0],
        dout,
        outs[1],
        q_pos,
        k_pos,
        **dict(op.attributes),
        name=[gname(q), gname(k), gname(v)],
    )
    return [dq, dk, dv, None, None]


attach_rule("AttentionBlock", "gradient_rule", _block_gradient)
