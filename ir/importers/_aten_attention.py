"""The ATen table's attention part: ``scaled_dot_product_attention`` (what Hugging Face
models run by default), kept whole by ``from_torch``'s decomposition table.

``softmax(q @ k^T * scale + mask) @ v``: ``scale`` defaults to ``1 / sqrt(D)``; a boolean
mask keeps where it is true, a float mask is added; ``is_causal`` keeps ``j <= i`` (torch
aligns its causal mask top-left); grouped-query attention (fewer key/value heads than
query heads) repeats each key/value head for its group, as ``enable_gqa`` does. Dropout
must be off (eval mode). The ``_scaled_dot_product_*`` kernels that a decomposition may
leave behind are read the same way (their first result).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ._aten import Lowering, Unsupported


def _repeat_heads(lw: Lowering, x, heads: int, name: str):
    b, h, s, d = x.type.shape
    if h == heads:
        return x
    if heads % h:
        raise Unsupported(f"{heads} query heads over {h} key/value heads")
    g = heads // h
    x = lw.b.call("Reshape", x, shape=(b, h, 1, s, d), name=f"{name}_groups")
    x = lw.b.call("BroadcastTo", x, shape=(b, h, g, s, d), name=f"{name}_repeated")
    return lw.b.call("Reshape", x, shape=(b, heads, s, d), name=f"{name}_heads")


def attention(lw: Lowering, node, q, k, v, mask, causal: bool, scale: float | None):
    """The registry ops of one scaled dot-product attention (the last one ``node``'s)."""
    if q.type.rank != 4:
        raise Unsupported(f"rank-{q.type.rank} query (the registry's attention is (B, H, S, D))")
    heads = q.type.shape[1]
    k = _repeat_heads(lw, k, heads, f"{node.name}_k")
    v = _repeat_heads(lw, v, heads, f"{node.name}_v")
    scale = 1.0 / math.sqrt(q.type.shape[-1]) if scale is None else float(scale)
    kt = lw.b.call("Transpose", k, perm=(0, 1, 3, 2), name=f"{node.name}_kt")
    s = lw.b.call("MatMul", q, kt, name=f"{node.name}_scores")
    s = lw.b.call("Scale", s, factor=scale, name=f"{node.name}_scaled")
    if causal:
        s = lw.b.call("CausalMask", s, fill=-math.inf, name=f"{node.name}_causal")
    if mask is not None:
        if mask.type.dtype.value == "bool":
            hidden = lw.constant(-math.inf, s.type.dtype)
            s = lw.b.call("Where", mask, s, hidden, name=f"{node.name}_masked")
        else:
            s = lw.b.call("Add", s, lw.cast(mask, s.type.dtype), name=f"{node.name}_masked")
    p = lw.b.call("Softmax", s, axis=3, name=f"{node.name}_probs")
    return lw.call("MatMul", p, v, node=node)


def _sdpa(lw: Lowering, node):
    q, k, v = (lw.value(a) for a in node.args[:3])
    given = [*node.args[3:], None, 0.0, False][:3]
    mask = node.kwargs.get("attn_mask", given[0])
    if node.kwargs.get("dropout_p", given[1] or 0.0):
        raise Unsupported("dropout_p > 0 (training mode): put the module in eval mode")
    causal = bool(node.kwargs.get("is_causal", given[2]))
    mask = None if mask is None else lw.value(mask)
    return attention(lw, node, q, k, v, mask, causal, node.kwargs.get("scale"))


def _sdpa_kernel(lw: Lowering, node):
    """``_scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, is_causal, *,
    attn_mask, scale)``: the output, and nothing for the log-sum-exp."""
    q, k, v = (lw.value(a) for a in node.args[:3])
    given = [*node.args[3:], 0.0, False][:2]
    if node.kwargs.get("dropout_p", given[0] or 0.0):
        raise Unsupported("dropout_p > 0 (training mode): put the module in eval mode")
    causal = bool(node.kwargs.get("is_causal", given[1]))
    mask = node.kwargs.get("attn_mask")
    mask = None if mask is None else lw.value(mask)
    return (attention(lw, node, q, k, v, mask, causal, node.kwargs.get("scale")), None)


TABLE: dict[str, Callable[[Lowering, Any], Any]] = {
    "aten.scaled_dot_product_attention.default": _sdpa,
    "aten._scaled_dot_product_flash_attention_for_cpu.default": _sdpa_kernel,
}
