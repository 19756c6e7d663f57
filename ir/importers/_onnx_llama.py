"""ONNX translations of the Llama-style layer ops and the KV cache (``ir/ops/llama.py``,
``ir/ops/kv_cache.py``), part of the exporter's table (``_onnx_export.EXPORTS``).

``RMSNorm`` is ONNX's ``RMSNormalization`` and ``Rotary`` (of a rank-4 ``(batch, heads,
positions, head_dim)`` tensor) its ``RotaryEmbedding`` (both opset 23), with the cosine and
sine tables of the op's positions as constants and position ids ``offset ..``; ``Rotary`` of
another rank is written as the rotate-half formula (``Slice``, ``Neg``, ``Concat``, ``Mul``,
``Add``). ``SwiGLU`` is ``Sigmoid`` and two ``Mul``; ``CacheAppend`` is ``Concat`` (the
value the in-place append computes).
"""

from __future__ import annotations

import numpy as np

from ..ops.llama import rotary_tables


def _np(t):
    return t.dtype.numpy


def _emit_rms_norm(em, op, ins, outs):
    eps = float(op.attributes["epsilon"])
    em.node("RMSNormalization", ins, outs, axis=-1, epsilon=eps)


def _tables(op):
    x = op.inputs[0].type
    s, d = x.shape[-2:]
    cos, sin = rotary_tables(s, d, op.attributes["theta"], op.attributes["offset"])
    if op.attributes["inverse"]:
        sin = -sin
    return x, cos.astype(_np(x)), sin.astype(_np(x))


def _emit_rotary(em, op, ins, outs):
    x, cos, sin = _tables(op)
    d = x.shape[-1]
    if x.rank == 4:  # ONNX's RotaryEmbedding: caches indexed by position ids
        b, _, s, _ = x.shape
        offset = op.attributes["offset"]
        full_cos, full_sin = (
            np.zeros((offset + s, d // 2), cos.dtype),
            np.zeros((offset + s, d // 2), sin.dtype),
        )
        full_cos[offset:], full_sin[offset:] = cos[:, : d // 2], sin[:, : d // 2]
        ids = np.broadcast_to(np.arange(offset, offset + s, dtype=np.int64), (b, s))
        c, n, p = (
            em.const(full_cos, "cos_cache"),
            em.const(full_sin, "sin_cache"),
            em.const(ids, "position_ids"),
        )
        em.node("RotaryEmbedding", [ins[0], c, n, p], outs)
        return
    half = d // 2
    axis = em.const(np.asarray([-1], np.int64), "axes")
    parts = []
    for lo, hi in ((half, d), (0, half)):
        piece = em.fresh("half")
        start, end = (
            em.const(np.asarray([lo], np.int64), "starts"),
            em.const(np.asarray([hi], np.int64), "ends"),
        )
        em.node("Slice", [ins[0], start, end, axis], [piece])
        parts.append(piece)
    negated = em.fresh("negated")
    em.node("Neg", [parts[0]], [negated])
    rotated = em.fresh("rotated")
    em.node("Concat", [negated, parts[1]], [rotated], axis=-1)
    a, b_ = em.fresh("x_cos"), em.fresh("rotated_sin")
    em.node("Mul", [ins[0], em.const(cos, "cos")], [a])
    em.node("Mul", [rotated, em.const(sin, "sin")], [b_])
    em.node("Add", [a, b_], outs)


def _emit_swiglu(em, op, ins, outs):
    s, silu = em.fresh("sigmoid"), em.fresh("silu")
    em.node("Sigmoid", [ins[0]], [s])
    em.node("Mul", [ins[0], s], [silu])
    em.node("Mul", [silu, ins[1]], outs)


def _emit_cache_append(em, op, ins, outs):
    em.node("Concat", ins, outs, axis=op.attributes["axis"])


LLAMA_EXPORTS = {
    "RMSNorm": _emit_rms_norm,
    "Rotary": _emit_rotary,
    "SwiGLU": _emit_swiglu,
    "CacheAppend": _emit_cache_append,
}

# RMSNormalization and RotaryEmbedding are opset 23
LLAMA_OPSET = {"RMSNorm": 23, "Rotary": 23}
