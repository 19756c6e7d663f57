"""The ATen table's mixture-of-experts part: ``topk`` and Hugging Face's experts.

``aten.topk`` along the last axis is ``MoETopK`` (the ``k`` largest, largest first; the
smallest through a negation), whatever it ranks: a router's top-``k`` experts are the
common case. A renormalisation of the gates over the choices (Mixtral always; Qwen-MoE
and OLMoE when the config's ``norm_topk_prob``) is the model's own division by their
sum, imported as it is written: ``MoETopK`` itself never renormalises.

``distir.moe_experts`` (one node per MoE layer, ``ir.importers._hf_experts``) on the
tokens ``x (T, H)`` of ``B = T / S`` sequences, the router's choices ``index (T, k)``
and gates ``w (T, k)``, the experts' ``gate_up (E, 2F, H)`` and ``down (E, H, F)``
(``Linear`` layout; ``(E, H, 2F)``, ``(E, F, H)`` when transposed) becomes::

    slot  = MoESlots(index (B, S, k), experts=E, capacity=C)
    buf   = MoEDispatch(x (B, S, H), slot)                # (E, B * C, H)
    h     = MatMul(buf, Transpose(gate_up))               # (E, B * C, 2F): one grouped GEMM
    a     = SwiGLU(h[..., :F], h[..., F:])                # silu(gate) * up
    y     = MatMul(a, Transpose(down))                    # (E, B * C, H)
    out   = MoECombine(y, slot, w (B, S, k))              # (B, S, H), reshaped to (T, H)

**Capacity.** Hugging Face routes every token (dropless). ``C = S`` places per expert
and sequence hold every choice (a token picks ``k`` distinct experts, so an expert
receives at most ``S`` tokens of a sequence): the exact import, ``moe_capacity_factor
=None``, named ``<node>_slot_dropless``. The buffer then has ``E * B * S`` rows where the
tokens fill ``k * B * S``: the simulator charges the experts ``E / k`` times their
uniform load. ``moe_capacity_factor=f`` sets ``C = ceil(f * S * k / E)`` (at most ``S``)
as ``ir.models`` builds it (``<node>_slot_capped``): costed as ``f`` times the uniform
load, and the choices past an expert's capacity dropped in the numerics (GShard's
priority), which then differ from torch's wherever the routing is that uneven.

The gates are cast to the tokens' dtype: a bfloat16 model combines in bfloat16 where
transformers multiplies by its float32 gates and sums in float32 (float32 models alike).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ._aten import Lowering, Unsupported, _axis


def _topk(lw: Lowering, node):
    x = lw.value(node.args[0])
    given = [*node.args[1:], *[None] * 4]
    k = given[0]
    dim = given[1] if given[1] is not None else node.kwargs.get("dim", -1)
    largest = given[2] if given[2] is not None else node.kwargs.get("largest", True)
    if not x.type.dtype.is_float:
        raise Unsupported(f"top-k of {x.type.dtype.value} (MoETopK ranks floats)")
    if x.type.rank == 0 or _axis(dim, x.type.rank) != x.type.rank - 1:
        raise Unsupported(f"dim={dim} of a rank-{x.type.rank} tensor (MoETopK ranks the last)")
    # sorted=False leaves the order to the implementation: MoETopK's (largest first) is one
    names = [f"{node.name}_values", f"{node.name}_indices"]
    if largest:
        return lw.b.call("MoETopK", x, k=int(k), name=names)
    negated = lw.b.call("Neg", x, name=f"{node.name}_negated")
    top, index = lw.b.call("MoETopK", negated, k=int(k), name=[f"{node.name}_top", names[1]])
    return lw.b.call("Neg", top, name=names[0]), index


def _scatter_value(lw: Lowering, node):
    """``x.scatter(dim, index, value)`` along the last axis (the group mask of DeepSeek-V3's
    group-limited routing): ``value`` where some index of the row names the place (a
    one-hot comparison with ``Arange``, its largest over the indices), ``x`` elsewhere."""
    x, dim, index, value = node.args[:4]
    x, index = lw.value(x), lw.value(index)
    rank = x.type.rank
    if rank == 0 or _axis(dim, rank) != rank - 1:
        raise Unsupported(f"dim={dim} of a rank-{rank} tensor (the last axis only)")
    if index.type.shape[:-1] != x.type.shape[:-1] or not x.type.dtype.is_float:
        raise Unsupported(f"index {index.type.shape} into a {x.type} (a float tensor's rows)")
    b, name = lw.b, node.name
    places = b.call(
        "Arange",
        n=x.type.shape[-1],
        dtype=index.type.dtype.value,
        device=lw.device,
        name=f"{name}_places",
    )
    column = b.call("Reshape", index, shape=(*index.type.shape, 1), name=f"{name}_column")
    onehot = b.call("Compare", column, places, kind="eq", name=f"{name}_onehot")
    hits = b.call("ReduceMax", lw.cast(onehot, x.type.dtype), axes=(rank - 1,), name=f"{name}_hits")
    hit = b.call("Compare", hits, lw.constant(0.0, x.type.dtype), kind="gt", name=f"{name}_hit")
    return lw.call("Where", hit, lw.constant(value, x.type.dtype), x, node=node)


def capacity(factor: float | None, seq: int, k: int, experts: int) -> int:
    """Places per expert and sequence: ``seq`` (dropless) when ``factor`` is None, else
    ``ceil(factor * seq * k / experts)``, between 1 and ``seq``."""
    if factor is None:
        return seq
    return max(1, min(seq, math.ceil(factor * seq * k / experts)))


def _experts(lw: Lowering, node):
    x, index, gates, gate_up, down = (lw.value(a) for a in node.args[:5])
    seq, transposed = int(node.args[5]), bool(node.args[6])
    tokens, hidden = x.type.shape
    k, experts = index.type.shape[-1], gate_up.type.shape[0]
    batch = tokens // seq
    name = node.name
    cap = capacity(lw.moe_capacity_factor, seq, k, experts)
    kind = "dropless" if lw.moe_capacity_factor is None else "capped"
    b = lw.b
    xs = b.call("Reshape", x, shape=(batch, seq, hidden), name=f"{name}_tokens")
    choices = b.call("Reshape", index, shape=(batch, seq, k), name=f"{name}_choices")
    w = b.call("Reshape", lw.cast(gates, x.type.dtype), shape=(batch, seq, k), name=f"{name}_w")
    slot = b.call("MoESlots", choices, experts=experts, capacity=cap, name=f"{name}_slot_{kind}")
    buf = b.call("MoEDispatch", xs, slot, experts=experts, capacity=cap, name=f"{name}_dispatched")
    if not transposed:  # Linear weights (E, out, in): the products read them (E, in, out)
        gate_up = b.call("Transpose", gate_up, perm=(0, 2, 1), name=f"{name}_gate_up_t")
        down = b.call("Transpose", down, perm=(0, 2, 1), name=f"{name}_down_t")
    h = b.call("MatMul", buf, gate_up, name=f"{name}_gate_up")
    f = h.type.shape[-1] // 2
    gate = b.call("Slice", h, axis=2, start=0, end=f, name=f"{name}_gate")
    up = b.call("Slice", h, axis=2, start=f, end=2 * f, name=f"{name}_up")
    act = b.call("SwiGLU", gate, up, name=f"{name}_act")
    y = b.call("MatMul", act, down, name=f"{name}_expert_out")
    out = b.call("MoECombine", y, slot, w, name=f"{name}_combined")
    return lw.call("Reshape", out, node=node, shape=(tokens, hidden))


TABLE: dict[str, Callable[[Lowering, Any], Any]] = {
    "aten.topk.default": _topk,
    "aten.scatter.value": _scatter_value,
    "distir.moe_experts.default": _experts,
}
