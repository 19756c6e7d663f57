"""The ATen table's attention part: ``scaled_dot_product_attention`` (what Hugging Face
models run by default), kept whole by ``from_torch``'s decomposition table and read as
the registry's fused ``Attention`` op (its kernel, cost, head sharding and gradient).

``softmax(q @ k^T * scale + mask) @ v``: a boolean mask keeps where it is true, a float
mask is added; grouped-query attention (fewer key/value heads, ``enable_gqa``) is the
op's own. torch aligns ``is_causal`` top-left (query ``i`` attends keys ``j <= i``), the
registry's ``causal`` bottom-right; they agree for as many queries as keys, and otherwise
the top-left triangle is an explicit boolean mask (a lifted constant). Dropout must be
off (eval mode). The ``_scaled_dot_product_*`` kernels that a decomposition may leave
behind are read the same way (their first result).

The fused op's mask carries no gradient. A float mask computed from the model's weights
(T5's and Swin's learned relative position biases) must train, so that attention is
written unfused instead: ``MatMul``, ``Scale``, the mask added, ``Softmax``, ``MatMul``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..types import DType
from ._aten import Lowering, Unsupported


def _repeat_heads(lw: Lowering, x, heads: int, name: str):
    """Each key/value head repeated for its group of query heads (GQA)."""
    b, h, s, d = x.type.shape
    if h == heads:
        return x
    if heads % h:
        raise Unsupported(f"{heads} query heads over {h} key/value heads")
    x = lw.b.call("Reshape", x, shape=(b, h, 1, s, d), name=f"{name}_groups")
    x = lw.b.call("BroadcastTo", x, shape=(b, h, heads // h, s, d), name=f"{name}_repeated")
    return lw.b.call("Reshape", x, shape=(b, heads, s, d), name=f"{name}_heads")


def unfused(lw: Lowering, node, q, k, v, mask, causal: bool, scale: float | None):
    """Attention as the five ops that compute it (a trained additive mask's gradient)."""
    heads = q.type.shape[1]
    k = _repeat_heads(lw, k, heads, f"{node.name}_k")
    v = _repeat_heads(lw, v, heads, f"{node.name}_v")
    scale = 1.0 / math.sqrt(q.type.shape[-1]) if scale is None else float(scale)
    kt = lw.b.call("Transpose", k, perm=(0, 1, 3, 2), name=f"{node.name}_kt")
    s = lw.b.call("MatMul", q, kt, name=f"{node.name}_scores")
    s = lw.b.call("Scale", s, factor=scale, name=f"{node.name}_scaled")
    if causal:  # top-left, as torch's: keys after the query's index
        s = lw.b.call("CausalMask", s, fill=-math.inf, name=f"{node.name}_causal")
    s = lw.b.call("Add", s, lw.cast(mask, s.type.dtype), name=f"{node.name}_masked")
    p = lw.b.call("Softmax", s, axis=3, name=f"{node.name}_probs")
    return lw.call("MatMul", p, v, node=node)


def _learned(lw: Lowering, arg) -> bool:
    """Whether the fx node ``arg`` is computed from a parameter of the module."""
    seen, todo = set(), [arg]
    while todo:
        n = todo.pop()
        if n in seen or not hasattr(n, "all_input_nodes"):
            continue
        seen.add(n)
        if n in lw.parameters:
            return True
        todo.extend(n.all_input_nodes)
    return False


def attention(lw: Lowering, node, q, k, v, mask, causal: bool, scale: float | None):
    """One registry ``Attention`` op for torch's scaled dot-product attention."""
    if q.type.rank != 4:
        raise Unsupported(f"rank-{q.type.rank} query (the registry's attention is (B, H, S, D))")
    sq, sk = q.type.shape[2], k.type.shape[2]
    if causal and sq != sk:  # torch's top-left triangle, as a mask
        keep = lw.lifted(np.tril(np.ones((sq, sk), bool)), f"{node.name}_causal")
        if mask is None:
            mask = keep
        elif mask.type.dtype is DType.bool:
            mask = lw.b.call("Logical", keep, mask, kind="and", name=f"{node.name}_mask")
        else:
            off = lw.constant(-np.inf, mask.type.dtype)
            mask = lw.b.call("Where", keep, mask, off, name=f"{node.name}_mask")
        causal = False
    if mask is not None and mask.type.dtype not in (DType.bool, q.type.dtype):
        mask = lw.cast(mask, q.type.dtype)
    scale = None if scale is None else float(scale)
    operands = [q, k, v, *([mask] if mask is not None else [])]
    return lw.call("Attention", *operands, node=node, causal=causal, scale=scale)


def _sdpa(lw: Lowering, node):
    q, k, v = (lw.value(a) for a in node.args[:3])
    given = [*node.args[3:], None, 0.0, False][:3]
    mask = node.kwargs.get("attn_mask", given[0])
    if node.kwargs.get("dropout_p", given[1] or 0.0):
        raise Unsupported("dropout_p > 0 (training mode): put the module in eval mode")
    causal = bool(node.kwargs.get("is_causal", given[2]))
    if mask is not None and _learned(lw, mask) and lw.dtype_of(mask) is not DType.bool:
        return unfused(lw, node, q, k, v, lw.value(mask), causal, node.kwargs.get("scale"))
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
