"""Mixture-of-experts layers for ``ir.models``: the MLP of a transformer block replaced by
``E`` expert MLPs, each token sent to ``k`` of them by a learned router.

The layer (Shazeer et al. 2017; GShard, Lepikhin et al. 2020; Switch Transformer, Fedus
et al. 2021; as Mixtral and DeepSeek-V3 use it), on the block's normalised input
``x (B, S, H)``:

1. router: ``probs = Softmax(x @ w_router)`` over the experts (``w_router (H, E)``);
2. ``gate, expert = MoETopK(probs, k)``, the gates renormalised to sum to one over the
   ``k`` choices when ``k > 1`` (Mixtral, DeepSeek-V3; Switch's ``k = 1`` keeps the
   probability);
3. capacity ``C = ceil(capacity_factor * S * k / E)`` places per expert and sequence;
   ``MoESlots`` gives each choice its place or drops it (``ir/ops/moe.py``);
4. ``MoEDispatch`` gathers the tokens into the experts' buffer ``(E, B * C, H)``; the
   experts are one batched product each way (``w1 (E, H, F)``, GELU, ``w2 (E, F, H)``):
   a grouped GEMM of ``E`` problems of ``B * C`` rows;
5. ``MoECombine`` sums each token's choices weighted by their gates;
6. optional shared experts (DeepSeek-V3): a dense MLP of ``shared * F`` columns every
   token goes through, added to the routed output;

With ``gated=True`` (``ir.models.llama``: Mixtral, DeepSeek-V3) each expert, and the
shared MLP, is a SwiGLU MLP instead: ``w1`` the gate and ``w3`` the up projection
(``(E, H, F)`` each, Mixtral's names), ``SwiGLU(x w1, x w3) w2``.
7. the auxiliary load-balancing loss ``aux_loss * E * mean_b sum_e f_be P_be``, with
   ``f_be`` the fraction of sequence ``b``'s choices routed to expert ``e`` and ``P_be``
   its mean router probability (Switch Transformer's loss, computed per sequence as
   DeepSeek-V3's sequence-wise balance loss is, so that it does not depend on how the
   batch is split); it is added to the model's loss.

**Assumptions, stated:** the buffers have the static size ``C``, so the predicted time and
memory are those of every expert receiving exactly ``C`` tokens of each sequence. With
``capacity_factor = 1`` (the default) that is uniform routing, every expert receiving
its mean load ``S * k / E``; a skew (the busiest expert receiving ``s`` times the mean,
which every rank then waits for at the all-to-all) is modelled by ``capacity_factor =
s``. The numerics drop the choices past capacity as Megatron-Core's capacity mode and
GShard do; dropless routing (Megatron-Core's default) has data-dependent sizes that a
static program cannot hold, and is costed here as ``capacity_factor`` at its skew.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .builder import FunctionBuilder
from .value import Value


@dataclass(frozen=True)
class MoEConfig:
    """The mixture-of-experts options of a model (see the module docstring)."""

    experts: int
    top_k: int = 2
    capacity_factor: float = 1.0
    expert_hidden: int = 0  # F of each expert; 0: the model's dense MLP width
    shared_experts: int = 0  # DeepSeek-V3's always-on experts, each F wide
    dense_layers: int = 0  # the first layers keep a dense MLP (DeepSeek-V3: 3)
    aux_loss: float = 0.01  # weight of the load-balancing loss (Switch Transformer: 0.01)

    def capacity(self, seq: int) -> int:
        """Places per expert and sequence: ``ceil(capacity_factor * seq * k / E)``."""
        return max(1, math.ceil(self.capacity_factor * seq * self.top_k / self.experts))

    def is_moe(self, layer: int) -> bool:
        return layer >= self.dense_layers

    def weight_shapes(
        self, prefix: str, hidden: int, width: int, gated: bool = False
    ) -> dict[str, tuple[int, ...]]:
        """The MoE layer's weights, ``width`` the dense MLP's (F when ``expert_hidden`` is 0);
        ``gated``: SwiGLU experts, with the up projection ``w3`` beside the gate ``w1``."""
        e, f = self.experts, self.expert_hidden or width
        shapes = {f"{prefix}_moe_router": (hidden, e), f"{prefix}_moe_w1": (e, hidden, f)}
        if gated:
            shapes[f"{prefix}_moe_w3"] = (e, hidden, f)
        shapes[f"{prefix}_moe_w2"] = (e, f, hidden)
        if self.shared_experts:
            fs = self.shared_experts * f
            shapes[f"{prefix}_moe_shared_w1"] = (hidden, fs)
            if gated:
                shapes[f"{prefix}_moe_shared_w3"] = (hidden, fs)
            shapes[f"{prefix}_moe_shared_w2"] = (fs, hidden)
        return shapes


def moe_mlp(
    b: FunctionBuilder,
    w: dict[str, Value],
    x: Value,
    prefix: str,
    config: MoEConfig,
    gated: bool = False,
) -> tuple[Value, Value | None]:
    """The MoE layer on ``x (B, S, H)`` (see the module docstring): its output, and its
    auxiliary loss (a scalar; None when ``aux_loss`` is 0). ``gated``: SwiGLU experts
    (weights ``w1``, ``w3``, ``w2``), else GELU ones (``w1``, ``w2``)."""
    batch, seq, _ = x.type.shape  # type: ignore[union-attr]
    e, k, p = config.experts, config.top_k, f"{prefix}_moe"
    cap = config.capacity(seq)
    logits = b.call("MatMul", x, w[f"{p}_router"], name=f"{p}_logits")
    probs = b.call("Softmax", logits, axis=-1, name=f"{p}_probs")
    gate, expert = b.call("MoETopK", probs, k=k, name=[f"{p}_gate", f"{p}_expert"])
    if k > 1:
        total = b.call("ReduceSum", gate, axes=-1, keepdims=True, name=f"{p}_gate_sum")
        gate = b.call("Div", gate, total, name=f"{p}_gate_norm")
    slot = b.call("MoESlots", expert, experts=e, capacity=cap, name=f"{p}_slot")
    buffer = b.call("MoEDispatch", x, slot, experts=e, capacity=cap, name=f"{p}_dispatched")
    y = _mlp(b, w, buffer, p, f"{p}_expert_out", gated)
    out = b.call("MoECombine", y, slot, gate, name=f"{p}_combined")
    if config.shared_experts:
        s = _mlp(b, w, x, f"{p}_shared", f"{p}_shared_out", gated)
        out = b.call("Add", out, s, name=f"{p}_out")
    if not config.aux_loss:
        return out, None
    weight = config.aux_loss * e / batch
    aux = b.call("MoEAuxLoss", probs, expert, weight=weight, name=f"{p}_aux_loss")
    return out, aux


def _mlp(b: FunctionBuilder, w: dict[str, Value], x: Value, p: str, out: str, gated: bool) -> Value:
    """``x``'s MLP of weights ``<p>_w1``, ``<p>_w2`` (GELU) or ``<p>_w1``, ``<p>_w3``,
    ``<p>_w2`` (SwiGLU), batched over the experts when the weights are ``(E, ...)``."""
    h = b.call("MatMul", x, w[f"{p}_w1"], name=f"{p}_fc")
    if gated:
        up = b.call("MatMul", x, w[f"{p}_w3"], name=f"{p}_up")
        h = b.call("SwiGLU", h, up, name=f"{p}_act")
    else:
        h = b.call("Gelu", h, name=f"{p}_act")
    return b.call("MatMul", h, w[f"{p}_w2"], name=out)


def model_loss(b: FunctionBuilder, logits: Value, labels: Value, aux_losses: list[Value]) -> Value:
    """The model's loss ``l``: the language-model loss, plus the MoE layers' load-balancing
    losses when there are any (the language-model loss then named ``l_lm``)."""
    if not aux_losses:
        return b.call("Loss", logits, labels, name="l")
    loss = b.call("Loss", logits, labels, name="l_lm")
    aux = aux_losses[0] if len(aux_losses) == 1 else b.call("Sum", *aux_losses)
    return b.call("Add", loss, aux, name="l")


__all__ = ["MoEConfig", "model_loss", "moe_mlp"]
