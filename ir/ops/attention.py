"""Fused scaled-dot-product attention: ``Attention`` and its gradient ``AttentionGrad``.

``Attention(q, k, v[, mask])`` is one op for what the unfused form writes as five
(``MatMul``, ``Scale``, ``CausalMask``, ``Softmax``, ``MatMul``; ``ir.models.gpt(...,
attention="unfused")`` keeps that form for teaching): ``softmax(q k^T * scale + mask) v``,
computed as the fused kernels users run (FlashAttention, torch's
``scaled_dot_product_attention``) compute it, with no ``(Sq, Sk)`` tensor left behind.

* ``q`` is ``(B, Hq, Sq, D)``, ``k`` ``(B, Hkv, Sk, D)``, ``v`` ``(B, Hkv, Sk, Dv)``; the
  result is ``(B, Hq, Sq, Dv)``. Grouped-query attention (GQA; multi-query, MQA, when
  ``Hkv == 1``): ``Hq`` is a multiple of ``Hkv`` and query head ``h`` reads key/value head
  ``h // (Hq / Hkv)``, as torch's ``enable_gqa=True`` does.
* ``mask`` (optional) broadcasts to ``(B, Hq, Sq, Sk)``: boolean (True: the query may
  attend that key) or additive (a float of q's dtype added to the scaled scores: ``-inf``
  or a large negative number masks). It carries no gradient.
* ``causal=True``: query ``i`` attends keys ``j <= i + Sk - Sq``. The diagonal is aligned
  *bottom-right*, so that the last query sees every key: a decode step (``Sq = 1``)
  attends the whole KV cache, a chunk of ``Sq`` new tokens after ``Sk - Sq`` cached ones
  attends causally. For ``Sq == Sk`` this is the usual lower triangle, equal to torch's
  ``is_causal=True``; for ``Sq != Sk`` torch's ``is_causal`` aligns the diagonal top-left,
  and torch's ``torch.nn.attention.bias.causal_lower_right`` is this op's mask.
* ``scale``: the factor on ``q k^T``; None is ``1 / sqrt(D)``.
* A query with no key to attend (all masked; the first ``Sq - Sk`` rows of a causal op
  with more queries than keys) gets a zero result and zero gradients, as FlashAttention
  gives, not NaN.

Cost: the FLOPs of the two products, ``2 B Hq Sq Sk (D + Dv)`` (``4 B Hq Sq Sk D`` when
``Dv == D``), counted as matrix FLOPs; for ``causal`` only the pairs attended, with
FlashAttention's convention that a square causal op does half (``Sq == Sk``: exactly half,
the masked triangle's area), and the exact count of attended pairs otherwise (a decode
step attends all ``Sk`` keys). Bytes: the fused kernel's IO, each operand read once and
the result written once; no ``(Sq, Sk)`` scores or probabilities reach memory. The
softmax's exponentials are not counted, as FlashAttention's FLOP count leaves them out.
The cost names its kernel (``"attention"``, ``"attention_grad"``: the efficiency model of
``ir.hardware`` times it as a fused attention) and its problem ``(B * Hq, Sq, Sk, D)``.

``AttentionGrad(q, k, v, out, dout[, mask])`` returns ``(dq, dk, dv)``. It recomputes the
probabilities from ``q`` and ``k`` as FlashAttention's backward does (the forward keeps
none) and reads ``out`` for the row sums ``sum(dout * out)``. Its cost is the exact count
of its five products (``QK^T`` again, ``P^T dO``, ``dO V^T``, ``dS K``, ``dS^T Q``):
``2 B Hq Sq Sk (3 D + 2 Dv)``, which is FlashAttention's 2.5x the forward when ``Dv == D``.

Sharding: batch, heads (query and key/value heads split together, in proportion: a split
of the kv heads that does not divide is refused by the engines, and a local op whose
query heads are not a multiple of its kv heads is a type error) and, when not causal,
the query sequence and ``v``'s feature axis; with one kv head (MQA) the kv head stays
whole on every device while the query heads split. ``D`` and ``Sk`` stay whole (the
softmax normalises over keys).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .. import attr_kinds as kinds
from ..errors import TypeRuleError
from ..registry import Attr, Cost, CostContext, OpDef, TypeContext, attach_rule, register_op
from ..types import DType, TensorType
from . import _factors as fx
from ._common import tensor
from ._examples import ctx, t

_ATTRIBUTES = (
    Attr(
        "causal",
        False,
        "mask keys after each query, diagonal aligned bottom-right: query i attends keys "
        "j <= i + Sk - Sq",
        kind=kinds.BOOL,
    ),
    Attr("scale", None, "factor on q k^T; None is 1/sqrt(D)", kind=kinds.optional(kinds.FINITE)),
)

# -- shapes --------------------------------------------------------------------------------


class AttentionShape(NamedTuple):
    """The problem a fused attention kernel solves: ``batch_heads`` (B * Hq) independent
    ``(Sq, D) x (Sk, D)`` attentions (``Dv`` wide values), causal or not."""

    batch_heads: int
    sq: int
    sk: int
    d: int
    dv: int
    causal: bool


def _head_operand(c: TypeContext, i: int, what: str, axes: str) -> TensorType:
    x = tensor(c, i, what)
    if x.rank != 4:
        raise TypeRuleError(f"{what} must be {axes} (rank 4), got shape {x.shape}")
    if not x.dtype.is_float:
        raise TypeRuleError(f"{what} must have a floating-point dtype, got {x.dtype.value}")
    return x


def _check(c: TypeContext, op: str, fixed: int) -> tuple[TensorType, TensorType, TensorType]:
    """q, k, v checked against each other (and the mask, operand ``fixed``, if any)."""
    if len(c.input_types) > fixed + 1:
        raise TypeRuleError(
            f"{op} takes {fixed} operands and an optional mask, got {len(c.input_types)} operands"
        )
    q = _head_operand(c, 0, "q", "(batch, heads, query_seq, head_dim)")
    k = _head_operand(c, 1, "k", "(batch, kv_heads, key_seq, head_dim)")
    v = _head_operand(c, 2, "v", "(batch, kv_heads, key_seq, value_dim)")
    if not q.dtype is k.dtype is v.dtype:
        raise TypeRuleError(
            f"q, k and v must have one dtype, got {q.dtype.value}, {k.dtype.value}, "
            f"{v.dtype.value}; cast them first"
        )
    if not q.shape[0] == k.shape[0] == v.shape[0]:
        raise TypeRuleError(
            f"q, k and v must have one batch size (axis 0), got {q.shape[0]}, {k.shape[0]}, "
            f"{v.shape[0]}"
        )
    if k.shape[1:3] != v.shape[1:3]:
        raise TypeRuleError(
            f"k {k.shape} and v {v.shape} must have the same kv_heads and key_seq (axes 1, 2)"
        )
    if q.shape[3] != k.shape[3]:
        raise TypeRuleError(
            f"q's head_dim {q.shape[3]} differs from k's {k.shape[3]} (axis 3 of q {q.shape} "
            f"and k {k.shape}): q k^T contracts over it"
        )
    hq, hkv = q.shape[1], k.shape[1]
    if (hkv == 0 and hq != 0) or (hkv and hq % hkv):
        raise TypeRuleError(
            f"q has {hq} heads and k, v have {hkv}: the query heads must be a multiple of the "
            "key/value heads (grouped-query attention: query head h reads kv head "
            "h // (heads / kv_heads)); a tensor-parallel split must divide the kv heads"
        )
    if len(c.input_types) > fixed:
        mask = tensor(c, fixed, "mask")
        if mask.dtype is not DType.bool and mask.dtype is not q.dtype:
            raise TypeRuleError(
                f"mask must be bool (True: attend) or additive in q's dtype {q.dtype.value}, "
                f"got {mask.dtype.value}"
            )
        full = (q.shape[0], hq, q.shape[2], k.shape[2])
        lead = 4 - mask.rank
        if lead < 0 or any(n not in (1, full[lead + i]) for i, n in enumerate(mask.shape)):
            raise TypeRuleError(
                f"mask has shape {mask.shape}, which does not broadcast to (batch, heads, "
                f"query_seq, key_seq) = {full}"
            )
    return q, k, v


def _attention_grad_types(c: TypeContext):
    q, k, v = _check(c, "AttentionGrad", 5)
    want = q.with_shape((*q.shape[:3], v.shape[3]))
    for i, what in ((3, "out"), (4, "dout")):
        x = tensor(c, i, what)
        if x.shape != want.shape or x.dtype is not q.dtype:
            raise TypeRuleError(f"{what} must be like Attention's result {want}, got {x}")
    return [q, k, v]


def _attention_types(c: TypeContext):
    q, _, v = _check(c, "Attention", 3)
    return [q.with_shape((*q.shape[:3], v.shape[3]))]


def _shape(types, attributes) -> AttentionShape:
    q, k, v = types[:3]
    return AttentionShape(
        q.shape[0] * q.shape[1],
        q.shape[2],
        k.shape[2],
        q.shape[3],
        v.shape[3],
        attributes["causal"],
    )


def attention_shape(c: CostContext) -> AttentionShape:
    """The problem shape of an ``Attention`` or ``AttentionGrad`` op:
    ``(B * Hq, Sq, Sk, D, Dv, causal)``."""
    return _shape(c.input_types, c.attributes)


# -- numpy kernels ---------------------------------------------------------------------------


def causal_keep(sq: int, sk: int) -> np.ndarray:
    """``(sq, sk)`` booleans: query ``i`` attends key ``j`` iff ``j <= i + sk - sq``."""
    return np.tril(np.ones((sq, sk), dtype=bool), k=sk - sq)


def attended_pairs(sq: int, sk: int, causal: bool) -> float:
    """(query, key) pairs a kernel computes: all, or for ``causal`` FlashAttention's half of a
    square and the exact count of attended pairs otherwise."""
    if not causal:
        return float(sq * sk)
    if sq == sk:
        return sq * sk / 2.0
    if sq > sk:  # the first sq - sk queries attend nothing, the others 1, 2, ..., sk keys
        return sk * (sk + 1) / 2.0
    return sq * sk - sq * (sq - 1) / 2.0  # query i attends i + sk - sq + 1 keys


def _grouped(x: np.ndarray, hkv: int) -> np.ndarray:
    """``(B, Hq, S, X)`` as ``(B, Hkv, G, S, X)``: the query heads of each kv head."""
    b, hq = x.shape[:2]
    return x.reshape(b, hkv, hq // hkv if hkv else 0, *x.shape[2:])


def _probabilities(q, k, mask, attributes) -> tuple[np.ndarray, float]:
    """``softmax(q k^T * scale + mask)`` as ``(B, Hkv, G, Sq, Sk)``, computed stably; rows
    with no key to attend are zero. Also the scale."""
    d, hkv, sq, sk = q.shape[3], k.shape[1], q.shape[2], k.shape[2]
    scale = attributes["scale"]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    s = np.matmul(_grouped(q, hkv), np.swapaxes(k, -1, -2)[:, :, None]) * q.dtype.type(scale)
    neg = q.dtype.type(-np.inf)
    if mask is not None:
        full = np.broadcast_to(mask, (q.shape[0], q.shape[1], sq, sk))
        full = _grouped(full, hkv)
        s = np.where(full, s, neg) if mask.dtype == bool else s + full
    if attributes["causal"]:
        s = np.where(causal_keep(sq, sk), s, neg)
    top = np.max(s, axis=-1, keepdims=True) if sk else np.zeros((*s.shape[:-1], 1), s.dtype)
    dead = np.isneginf(top)
    e = np.exp(s - np.where(dead, top.dtype.type(0), top))
    total = np.sum(e, axis=-1, keepdims=True)
    return e / np.where(dead, total.dtype.type(1), total), scale


def _ungrouped(x: np.ndarray) -> np.ndarray:
    return x.reshape(x.shape[0], x.shape[1] * x.shape[2], *x.shape[3:])


def _attention(xs, attributes):
    q, k, v = xs[:3]
    p, _ = _probabilities(q, k, xs[3] if len(xs) > 3 else None, attributes)
    out = np.matmul(p, v[:, :, None])
    return [_ungrouped(out).astype(q.dtype, copy=False)]


def _attention_grad(xs, attributes):
    q, k, v, out, dout = xs[:5]
    hkv = k.shape[1]
    p, scale = _probabilities(q, k, xs[5] if len(xs) > 5 else None, attributes)
    do = _grouped(dout, hkv)
    dv = np.sum(np.matmul(np.swapaxes(p, -1, -2), do), axis=2)
    dp = np.matmul(do, np.swapaxes(v, -1, -2)[:, :, None])
    rows = np.sum(do * _grouped(out, hkv), axis=-1, keepdims=True)
    ds = p * (dp - rows) * q.dtype.type(scale)
    dq = np.matmul(ds, k[:, :, None])
    dk = np.sum(np.matmul(np.swapaxes(ds, -1, -2), _grouped(q, hkv)), axis=2)
    return [_ungrouped(dq).astype(q.dtype), dk.astype(q.dtype), dv.astype(q.dtype)]


# -- cost rules ------------------------------------------------------------------------------


def _bytes(types) -> int:
    return sum(x.size_bytes for x in types)


def _fused_cost(c: CostContext, width: int, kernel: str, launches: int) -> Cost:
    """Products of ``width`` summed feature columns (D or Dv each) over the attended (query,
    key) pairs, as one fused kernel: its operands read once, its results written once.
    ``gemms`` is the kernel's problem ``(B * Hq, Sq, Sk, D)`` for the efficiency model (its
    achieved fraction of the matrix peak by head dimension and key length, ``ir.hardware``)."""
    n, sq, sk, d, _, causal = attention_shape(c)
    flops = 2.0 * n * attended_pairs(sq, sk, causal) * width
    read, written = _bytes(c.input_types), _bytes(c.output_types)
    gemms = ((n, sq, sk, d),)
    return Cost(flops, read, written, flops, gemms=gemms, kernel=kernel, launches=launches)


def _attention_cost(c: CostContext) -> Cost:
    s = attention_shape(c)
    return _fused_cost(c, s.d + s.dv, "attention", 1)  # q k^T, then p v


def _attention_grad_cost(c: CostContext) -> Cost:
    s = attention_shape(c)
    # q k^T again (D), dv = p^T do (Dv), dp = do v^T (Dv), dq = ds k (D), dk = ds^T q (D).
    # FlashAttention-2's backward runs three kernels: the row sums of do * o, the main
    # loop, and dq's conversion from its float32 accumulator (flash-attn,
    # csrc/flash_attn/src/flash_bwd_launch_template.h)
    return _fused_cost(c, 3 * s.d + 2 * s.dv, "attention_grad", 3)


def heads_limit(input_types, degree: int) -> str | None:
    """Why tensor parallelism of ``degree`` cannot split this attention by whole heads (its
    query heads and, unless there is one, its kv heads), or None if it can. The SPMD
    engine reads it (the record's ``extra["heads_limit"]``) to refuse, rather than silently
    replicate, an attention it cannot split."""
    hq, hkv = input_types[0].shape[1], input_types[1].shape[1]
    if hq % degree:
        return (
            f"tensor-parallel degree {degree} does not divide the {hq} attention heads: "
            f"attention splits by whole heads; use a degree that divides {hq}"
        )
    if hkv > 1 and hkv % degree:
        return (
            f"tensor-parallel degree {degree} does not divide the {hkv} key/value heads "
            f"(grouped-query attention, {hq} query heads): each device keeps whole kv heads; "
            f"use a degree that divides {hkv}, or a model with more kv_heads (or one: MQA)"
        )
    return None


# -- records ---------------------------------------------------------------------------------


def _examples(s: int, grad: bool = False) -> list[TypeContext]:
    def case(b, hq, hkv, sq, sk, d, dv, mask=None, **attributes):
        types = [t(b, hq, sq, d), t(b, hkv, sk, d), t(b, hkv, sk, dv)]
        if grad:
            types += [t(b, hq, sq, dv), t(b, hq, sq, dv)]
        return ctx(*types, *([mask] if mask is not None else []), **attributes)

    return [
        case(2, 2, 2, 2 * s, 2 * s, 4, 4),
        case(1, 4, 2, 3 * s, 3 * s, 2 * s, 3, causal=True),  # GQA
        case(2, 2, 1, 1, 4 * s, 4, 2, causal=True, scale=0.5),  # MQA decode on a cache
        case(2, 2, 2, 2 * s, 3 * s, 2, 2, mask=t(2, 1, 1, 3 * s, dtype=DType.bool)),  # padding
        case(1, 2, 2, s, 2 * s, 2, 2, mask=t(s, 2 * s)),  # additive bias
    ]


register_op(
    OpDef(
        name="Attention",
        operands=("q", "k", "v", "mask"),
        results=("out",),
        type_rule=_attention_types,
        kernel=_attention,
        cost_rule=_attention_cost,
        attributes=_ATTRIBUTES,
        variadic=True,
        doc="Fused scaled-dot-product attention softmax(q k^T * scale + mask) v over the last "
        "two axes of q (B, Hq, Sq, D), k (B, Hkv, Sk, D), v (B, Hkv, Sk, Dv); mask (optional, "
        "bool keep or additive) broadcasts to (B, Hq, Sq, Sk); Hq a multiple of Hkv (GQA/MQA); "
        "causal aligns the diagonal bottom-right (query i attends keys j <= i + Sk - Sq). "
        "FLOPs of the two products (causal: the attended pairs), IO of one fused kernel.",
        extra={
            "examples": _examples,
            "nondiff_operands": (3,),  # the mask
            "heads_limit": heads_limit,
            # over a sequence in another order, at explicit positions (context parallelism)
            "context_form": lambda *args: _context_form(*args),
        },
    )
)

register_op(
    OpDef(
        name="AttentionGrad",
        operands=("q", "k", "v", "out", "dout", "mask"),
        results=("dq", "dk", "dv"),
        type_rule=_attention_grad_types,
        kernel=_attention_grad,
        cost_rule=_attention_grad_cost,
        attributes=_ATTRIBUTES,
        variadic=True,
        doc="Gradients (dq, dk, dv) of Attention(q, k, v[, mask]) given its out and dout, the "
        "probabilities recomputed as FlashAttention's backward does; FLOPs: its five products "
        "exactly (2.5x the forward's when Dv == D).",
        extra={
            "examples": lambda s: _examples(s, grad=True),
            "nondiff_operands": (5,),
            "heads_limit": heads_limit,
            "context_form": lambda *args: _context_form(*args),
        },
    )
)


# -- sharding rules --------------------------------------------------------------------------
# Batch and heads split (query and kv heads together, in proportion); the query sequence and
# v's feature axis split when not causal (a causal op's diagonal depends on where its queries
# sit in the sequence); D and Sk stay whole. With one kv head (MQA) k and v stay whole while
# the query heads split; their gradients are then partial sums over the query heads.


def _factors(c: TypeContext) -> tuple[str | None, str | None, str | None]:
    """Names of the kv head axis, the query sequence and v's feature axis."""
    q, k = c.input_types[0], c.input_types[1]
    kv_heads = None if k.shape[1] == 1 and q.shape[1] > 1 else "h"
    seq = None if c.attributes["causal"] else "sq"
    return kv_heads, seq, "dv"


def _mask_factors(c: TypeContext, index: int, seq: str | None) -> list[tuple[str | None, ...]]:
    if len(c.input_types) <= index:
        return []
    q, k, mask = c.input_types[0], c.input_types[1], c.input_types[index]
    full = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    names = ("b", "h", seq, None)
    lead = 4 - mask.rank
    return [
        tuple(names[lead + i] if n == full[lead + i] else None for i, n in enumerate(mask.shape))
    ]


def _attention_sharding(c: TypeContext) -> dict:
    kv, seq, dv = _factors(c)
    return fx.rule(
        [
            ("b", "h", seq, None),
            ("b", kv, None, None),
            ("b", kv, None, dv),
            *_mask_factors(c, 3, seq),
        ],
        [("b", "h", seq, dv)],
        linear=[(2,)],  # out = P v
    )


def _attention_grad_sharding(c: TypeContext) -> dict:
    kv, seq, _ = _factors(c)
    rows = ("b", "h", seq, None)
    kv_axes = ("b", kv, None, None)
    reduce = {} if seq is None else {seq: "sum"}  # dk, dv sum over the queries
    if kv is None:
        reduce["h"] = "sum"  # MQA: dk, dv sum over the query heads
    return fx.rule(
        [rows, kv_axes, kv_axes, rows, rows, *_mask_factors(c, 5, seq)],
        [rows, kv_axes, kv_axes],
        reduce=reduce,
        linear=[(4,)],  # every gradient is linear in dout
    )


fx.attach("Attention", _attention_sharding)
fx.attach("AttentionGrad", _attention_grad_sharding)


# -- gradient rule (autodiff) ------------------------------------------------------------------


def _attention_gradient(b, op, ins, outs, dys):
    from ._grad import gname

    (dout,) = dys
    if dout is None:
        return [None] * len(ins)
    q, k, v, *mask = ins
    dq, dk, dv = b.call(
        "AttentionGrad",
        q,
        k,
        v,
        outs[0],
        dout,
        *mask,
        **dict(op.attributes),
        name=[gname(q), gname(k), gname(v)],
    )
    return [dq, dk, dv, *([None] * len(mask))]


attach_rule("Attention", "gradient_rule", _attention_gradient)


def _context_form(b, op, ins, ctx):
    from .context import attention_context_form

    return attention_context_form(b, op, ins, ctx)
