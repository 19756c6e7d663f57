"""ONNX's ``Attention`` (opset 23) as the registry's fused ``Attention`` op.

4-D ``(B, H, S, D)`` operands are read as they are; 3-D ``(B, S, H * D)`` ones are split
into heads by ``q_num_heads`` and ``kv_num_heads`` (and the result merged back). A KV
cache (``past_key``, ``past_value``) is concatenated before the new keys and values,
and the concatenations are the ``present_key`` and ``present_value`` outputs. A mask
shorter than the keys is padded (with False, or ``-inf``), as onnx's reference does.
``is_causal`` is aligned to the cache, bottom-right, as the registry's ``causal``; with
no cache and fewer or more queries than keys ONNX aligns it top-left, which is read as
an explicit mask. Float16 operands are computed in float32, with the scale ONNX's
function body gives them: ``sqrt(scale)`` rounded to float16, squared; bfloat16 ones are
refused (onnx's reference rounds every step to bfloat16, further from the fused kernel
than its own tolerance). A ``softcap``, the ``qk_matmul_output`` output, sliding windows and
``nonpad_kv_seqlen`` are refused.
"""

from __future__ import annotations

import numpy as np

from ._onnx_rules import Refused, Rule, attr, float32, known_attributes


def _heads(rd, x, heads: int, name: str):
    b, s, width = x.type.shape
    if heads < 1 or width % heads:
        raise Refused(f"{x.name} has width {width}, not a multiple of its {heads} heads")
    r = rd.b.call("Reshape", x, shape=(b, s, heads, width // heads), name=name)
    return rd.b.call("Transpose", r, perm=(0, 2, 1, 3), name=f"{name}_t")


def _padded_mask(rd, mask, keys: int):
    """The mask padded to ``keys`` along its last axis (the keys it does not cover off)."""
    short = keys - mask.type.shape[-1]
    if short <= 0:
        return mask
    fill = False if mask.type.dtype.value == "bool" else -np.inf
    return rd.b.call("Pad", mask, axis=-1, after=short, value=fill, name="mask_padded")


def _top_left(rd, mask, sq: int, sk: int, dtype):
    """``mask`` combined with ONNX's top-left causal mask (keys ``j <= i``)."""
    key = f"{rd.node.output[0]}::causal"
    rd.constants[key] = np.tril(np.ones((sq, sk), bool))
    keep = rd.tensor(key)
    if mask is None:
        return keep
    if mask.type.dtype.value == "bool":
        return rd.b.call("Logical", keep, mask, kind="and", name="causal_mask")
    off = rd.constant(-np.inf, dtype)
    return rd.b.call("Where", keep, mask, off, name="causal_mask")


def _attention(rd, node):
    known_attributes(
        node, "is_causal", "kv_num_heads", "q_num_heads", "qk_matmul_output_mode", "scale",
        "softcap", "softmax_precision", "left_window_size", "right_window_size",
    )  # fmt: skip
    if attr(rd, node, "softcap", 0.0):
        raise Refused(f"softcap={attr(rd, node, 'softcap')} (only 0 is read)")
    if (attr(rd, node, "left_window_size", -1), attr(rd, node, "right_window_size", -1)) != (
        -1,
        -1,
    ):
        raise Refused("a sliding window")
    if len(node.input) > 6 and node.input[6]:
        raise Refused("nonpad_kv_seqlen (a static cache)")
    if len(node.output) > 3 and node.output[3]:
        raise Refused("the qk_matmul_output output")
    if rd.narrow is not None and rd.narrow.value == "bfloat16":
        raise Refused(
            "bfloat16 operands: onnx defines them by rounding every step to bfloat16, which "
            "the registry's float32-accumulating kernel differs from by more than onnx's "
            "tolerance (1e-3); cast the model to float32 or float16"
        )
    q, k, v = (rd.input(node, i) for i in range(3))
    mask, past_k, past_v = (rd.input(node, i) for i in (3, 4, 5))
    if (past_k is None) != (past_v is None):
        raise Refused("past_key without past_value (or the other way round)")
    flat = q.type.rank == 3
    if flat:
        hq, hkv = attr(rd, node, "q_num_heads"), attr(rd, node, "kv_num_heads")
        if hq is None or hkv is None:
            raise Refused("3-d operands without q_num_heads and kv_num_heads")
        q, k, v = (_heads(rd, x, h, f"{x.name}_heads") for x, h in ((q, hq), (k, hkv), (v, hkv)))
    if past_k is not None:  # the cache first, then the new keys and values: the present
        k, v = (
            rd.call("Concat", past, new, out=i, dim=2)
            if len(node.output) > i and node.output[i]
            else rd.b.call("Concat", past, new, dim=2, name="present")
            for i, past, new in ((1, past_k, k), (2, past_v, v))
        )
    sq, sk = q.type.shape[2], k.type.shape[2]
    if mask is not None:
        mask = _padded_mask(rd, mask, sk)
    causal = bool(attr(rd, node, "is_causal", 0))
    if causal and past_k is None and sq != sk:  # ONNX: top-left; the registry: bottom-right
        mask, causal = _top_left(rd, mask, sq, sk, q.type.dtype), False
    scale = attr(rd, node, "scale")
    scale = float(1.0 / np.sqrt(q.type.shape[-1])) if scale is None else float32(scale)
    if rd.narrow is not None:  # ONNX scales q and k by sqrt(scale) cast to their dtype
        scale = float(np.float32(np.asarray(np.sqrt(scale), rd.narrow.numpy))) ** 2
    operands = [q, k, v, *([mask] if mask is not None else [])]
    if not flat:
        y = rd.call("Attention", *operands, causal=causal, scale=scale)
    else:
        y = rd.b.call("Attention", *operands, causal=causal, scale=scale, name="attention")
        b, h, s, dv = y.type.shape
        t = rd.b.call("Transpose", y, perm=(0, 2, 1, 3), name="attention_t")
        y = rd.call("Reshape", t, shape=(b, s, h * dv))
    outputs = [y]
    if len(node.output) > 1:
        outputs += [k if node.output[1] else None]
    if len(node.output) > 2:
        outputs += [v if node.output[2] else None]
    return outputs


RULES: dict[str, Rule] = {"Attention": Rule(_attention, wide=True)}
