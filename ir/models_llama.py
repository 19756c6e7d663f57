"""A Llama-style decoder (``ir.models.llama``) and the shapes of published Llama models.

Llama (Touvron et al. 2023) differs from the GPT of ``ir.models.gpt`` where serving
notices it: RMSNorm instead of LayerNorm, rotary position embeddings instead of a
learned position table, a SwiGLU MLP (gate and up projections, their gated product,
a down projection), grouped-query attention (fewer key/value heads than query heads),
and no biases. Each of those is one registry op (``ir/ops/llama.py``), and attention is
the fused ``Attention`` op.

>>> import ir
>>> f = ir.models.llama(2, 16, 64, 8, 100, 2, kv_heads=2, ffn=96)
>>> [v.name for v in f.inputs][:10]
['wte', 'h0_attn_norm_g', 'h0_attn_wq', 'h0_attn_wk', 'h0_attn_wv', 'h0_attn_wo', \
'h0_mlp_norm_g', 'h0_mlp_w_gate', 'h0_mlp_w_up', 'h0_mlp_w_down']
>>> f.inputs[3].type.shape  # wk: 2 kv heads of 64 / 8 = 8 channels
(64, 16)
"""

from __future__ import annotations

import math
from types import MappingProxyType

from .builder import FunctionBuilder
from .function import Function
from .models import ModelError, _dtype, _maybe_training, _positive, moe_config
from .models_moe import MoEConfig, model_loss, moe_mlp
from .types import DType, TensorType
from .value import Value

__all__ = ["LLAMA_SHAPES", "llama", "llama_ffn", "llama_preset", "llama_weight_shapes"]

#: Published Llama shapes, from each model's ``config.json`` on the Hugging Face Hub
#: (meta-llama/Llama-2-7b-hf, Llama-2-70b-hf, Meta-Llama-3-8B, Meta-Llama-3-70B):
#: hidden_size, num_attention_heads, num_key_value_heads, intermediate_size, vocab_size,
#: num_hidden_layers, max_position_embeddings, rope_theta.
LLAMA_SHAPES = MappingProxyType(
    {
        "llama-2-7b": dict(
            hidden=4096, heads=32, kv_heads=32, ffn=11008, vocab=32000, layers=32, seq=4096,
            theta=10000.0,
        ),
        "llama-2-70b": dict(
            hidden=8192, heads=64, kv_heads=8, ffn=28672, vocab=32000, layers=80, seq=4096,
            theta=10000.0,
        ),
        "llama-3-8b": dict(
            hidden=4096, heads=32, kv_heads=8, ffn=14336, vocab=128256, layers=32, seq=8192,
            theta=500000.0,
        ),
        "llama-3-70b": dict(
            hidden=8192, heads=64, kv_heads=8, ffn=28672, vocab=128256, layers=80, seq=8192,
            theta=500000.0,
        ),
    }
)  # fmt: skip


def llama_ffn(hidden: int, multiple_of: int = 256) -> int:
    """The MLP width of Llama's reference code: two thirds of ``4 * hidden``, rounded up to
    a multiple of ``multiple_of`` (11008 for hidden 4096)."""
    return multiple_of * math.ceil(int(2 * 4 * hidden / 3) / multiple_of)


def llama_weight_shapes(
    hidden: int,
    heads: int,
    vocab: int,
    layers: int,
    kv_heads: int | None = None,
    ffn: int = 0,
    moe: MoEConfig | None = None,
) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every Llama weight, in input order (``ffn`` 0: :func:`llama_ffn`);
    with ``moe`` SwiGLU experts' router and ``w1``, ``w3``, ``w2`` replace the MLP of each
    layer from ``moe.dense_layers`` on (``ir.models_moe``)."""
    H, F = hidden, ffn or llama_ffn(hidden)
    kv = (kv_heads or heads) * (H // heads)
    shapes: dict[str, tuple[int, ...]] = {"wte": (vocab, H)}
    for i in range(layers):
        p = f"h{i}"
        shapes[f"{p}_attn_norm_g"] = (H,)
        shapes.update({f"{p}_attn_w{c}": (H, H if c in "qo" else kv) for c in "qkvo"})
        shapes[f"{p}_mlp_norm_g"] = (H,)
        if moe is not None and moe.is_moe(i):
            shapes.update(moe.weight_shapes(p, H, F, gated=True))
            continue
        shapes.update({f"{p}_mlp_w_gate": (H, F), f"{p}_mlp_w_up": (H, F)})
        shapes[f"{p}_mlp_w_down"] = (F, H)
    shapes.update({"norm_g": (H,), "w_head": (H, vocab)})
    return shapes


class _Llama:
    """Builds the ops of one Llama; ``w`` holds the weight inputs by name."""

    def __init__(
        self,
        b: FunctionBuilder,
        w: dict[str, Value],
        sizes: tuple[int, int, int, int],
        moe: MoEConfig | None = None,
        **opts,
    ) -> None:
        self.b, self.w, self.moe = b, w, moe
        self.aux_losses: list[Value] = []
        self.B, self.S, self.nh, self.nkv = sizes
        self.H = w["wte"].type.shape[1]
        self.dh = self.H // self.nh
        self.theta, self.eps = opts["theta"], opts["epsilon"]

    def norm(self, x: Value, name: str) -> Value:
        return self.b.call("RMSNorm", x, self.w[f"{name}_g"], epsilon=self.eps, name=f"{name}_y")

    def heads(self, x: Value, name: str, heads: int) -> Value:
        r = self.b.call("Reshape", x, shape=(self.B, self.S, heads, self.dh), name=f"{name}_r")
        return self.b.call("Transpose", r, perm=(0, 2, 1, 3), name=f"{name}_h")

    def attention(self, x: Value, p: str) -> Value:
        b, w = self.b, self.w
        xn = self.norm(x, f"{p}_attn_norm")
        q = self.heads(b.call("MatMul", xn, w[f"{p}_attn_wq"], name=f"{p}_q"), f"{p}_q", self.nh)
        k = self.heads(b.call("MatMul", xn, w[f"{p}_attn_wk"], name=f"{p}_k"), f"{p}_k", self.nkv)
        v = self.heads(b.call("MatMul", xn, w[f"{p}_attn_wv"], name=f"{p}_v"), f"{p}_v", self.nkv)
        q = b.call("Rotary", q, theta=self.theta, name=f"{p}_q_rot")
        k = b.call("Rotary", k, theta=self.theta, name=f"{p}_k_rot")
        o = b.call("Attention", q, k, v, causal=True, name=f"{p}_ctx")
        o = b.call("Transpose", o, perm=(0, 2, 1, 3), name=f"{p}_ctx_t")
        o = b.call("Reshape", o, shape=(self.B, self.S, self.H), name=f"{p}_merged")
        o = b.call("MatMul", o, w[f"{p}_attn_wo"], name=f"{p}_attn_out")
        return b.call("Add", x, o, name=f"{p}_res1")

    def mlp(self, x: Value, p: str) -> Value:
        b, w = self.b, self.w
        xn = self.norm(x, f"{p}_mlp_norm")
        if self.moe is not None and self.moe.is_moe(int(p[1:])):
            h, aux = moe_mlp(b, w, xn, p, self.moe, gated=True)
            if aux is not None:
                self.aux_losses.append(aux)
            return b.call("Add", x, h, name=f"{p}_res2")
        gate = b.call("MatMul", xn, w[f"{p}_mlp_w_gate"], name=f"{p}_gate")
        up = b.call("MatMul", xn, w[f"{p}_mlp_w_up"], name=f"{p}_up")
        h = b.call("SwiGLU", gate, up, name=f"{p}_swiglu")
        h = b.call("MatMul", h, w[f"{p}_mlp_w_down"], name=f"{p}_down")
        return b.call("Add", x, h, name=f"{p}_res2")


def llama(
    batch: int,
    seq: int,
    hidden: int,
    heads: int,
    vocab: int,
    layers: int,
    training: bool = False,
    dtype: DType | str = DType.float32,
    *,
    kv_heads: int | None = None,
    ffn: int | None = None,
    theta: float = 10000.0,
    epsilon: float = 1e-5,
    experts: int = 0,
    top_k: int = 2,
    capacity_factor: float = 1.0,
    expert_hidden: int = 0,
    shared_experts: int = 0,
    dense_layers: int = 0,
    aux_loss: float = 0.01,
) -> Function:
    """A Llama-style decoder: token embedding, ``layers`` pre-norm blocks, final norm, head.

    Inputs (in order, see :func:`llama_weight_shapes`): ``wte (V, H)``, per block
    ``h<i>_attn_norm_g (H,)``, ``h<i>_attn_wq (H, H)``, ``h<i>_attn_wk`` and ``_wv``
    ``(H, kv_heads * dh)``, ``h<i>_attn_wo (H, H)``, ``h<i>_mlp_norm_g (H,)``,
    ``h<i>_mlp_w_gate`` and ``_w_up`` ``(H, ffn)``, ``h<i>_mlp_w_down (ffn, H)``; then
    ``norm_g (H,)``, ``w_head (H, V)`` (untied), ``tokens (B, S)`` and ``labels (B, S)``
    (int64). Returns ``logits (B, S, V), l`` as ``ir.models.gpt`` does.

    Each block: ``RMSNorm``, the q, k, v projections split into heads, ``Rotary`` on q
    and k (positions ``0 .. S-1``, wavelengths from ``theta``: 10000 for Llama 2, 500000
    for Llama 3), causal fused ``Attention`` (grouped-query with ``kv_heads``; None: as
    many as ``heads``), the output projection and a residual add; then ``RMSNorm``, the
    gate and up projections, ``SwiGLU``, the down projection and a residual add.
    ``ffn`` (None: :func:`llama_ffn`, two thirds of ``4 * hidden`` rounded up to 256).
    ``seq`` is the longest sequence the model takes (``ir.inference`` serves prompts and
    contexts up to it). :func:`llama_preset` builds published shapes.

    ``experts=E`` (a mixture of experts as Mixtral and DeepSeek-V3 build it; the options
    and their checks are ``ir.models.gpt``'s, the layer ``ir.models_moe.moe_mlp``): the MLP
    of every layer from ``dense_layers`` on is ``E`` SwiGLU experts of ``expert_hidden``
    columns (0: ``ffn``), each token routed to ``top_k`` of them, with ``shared_experts``
    SwiGLU ones beside and the load-balancing loss weighted ``aux_loss`` added to the
    loss. Weights ``h<i>_moe_router (H, E)``, ``h<i>_moe_w1`` (gate) and ``_w3`` (up)
    ``(E, H, F)``, ``h<i>_moe_w2 (E, F, H)`` (and ``h<i>_moe_shared_w1/_w3/_w2``) replace
    ``h<i>_mlp_w_gate/_w_up/_w_down``.
    """
    _positive(batch=batch, seq=seq, hidden=hidden, heads=heads, vocab=vocab, layers=layers)
    moe = moe_config(
        experts, top_k, capacity_factor, expert_hidden, shared_experts, dense_layers, aux_loss
    )
    if hidden % heads or (hidden // heads) % 2:
        raise ModelError(
            f"hidden {hidden} must split into {heads} heads of an even size (rotary "
            "embeddings rotate channel pairs)"
        )
    kv = heads if kv_heads is None else kv_heads
    _positive(kv_heads=kv)
    if heads % kv:
        raise ModelError(
            f"heads {heads} is not a multiple of kv_heads {kv} (each key/value head serves "
            "a group of heads / kv_heads query heads)"
        )
    if ffn is not None:
        _positive(ffn=ffn)
    for name, x, low in (("theta", theta, 1.0), ("epsilon", epsilon, 0.0)):
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not low < x < math.inf:
            raise ModelError(f"{name} must be a finite number > {low:g}, got {x!r}")
    dt = _dtype(dtype)
    b = FunctionBuilder("llama")
    shapes = llama_weight_shapes(hidden, heads, vocab, layers, kv, ffn or 0, moe)
    w = {name: b.input(name, TensorType(shape, dt, 0)) for name, shape in shapes.items()}
    tokens = b.input("tokens", TensorType((batch, seq), DType.int64, 0))
    labels = b.input("labels", TensorType((batch, seq), DType.int64, 0))
    m = _Llama(b, w, (batch, seq, heads, kv), moe, theta=float(theta), epsilon=float(epsilon))
    h = b.call("Embedding", w["wte"], tokens, name="tok_emb")
    for i in range(layers):
        h = m.mlp(m.attention(h, f"h{i}"), f"h{i}")
    h = m.norm(h, "norm")
    logits = b.call("MatMul", h, w["w_head"], name="logits")
    loss = model_loss(b, logits, labels, m.aux_losses)
    return _maybe_training(b.finish([logits, loss]), training)


def llama_preset(
    name: str,
    batch: int = 1,
    seq: int | None = None,
    dtype: DType | str = DType.bfloat16,
    *,
    layers: int | None = None,
) -> Function:
    """The forward program of a published Llama shape (:data:`LLAMA_SHAPES`), ``batch``
    sequences of up to ``seq`` tokens (None: the model's maximum positions), in ``dtype``
    (bfloat16, as it is served, by default); ``layers`` builds fewer blocks.

    >>> f = llama_preset("llama-3-70b", batch=4)
    >>> f.inputs[-2].type.shape, len([op for op in f.ops if op.op_type == "Attention"])
    ((4, 8192), 80)
    """
    shape = LLAMA_SHAPES.get(str(name).lower())
    if shape is None:
        raise ModelError(f"unknown Llama shape {name!r}; known: {', '.join(LLAMA_SHAPES)}")
    s = dict(shape)
    max_seq = s.pop("seq")
    if seq is not None and seq > max_seq:
        raise ModelError(
            f"{name} takes at most {max_seq} positions; seq {seq} exceeds them by {seq - max_seq}"
        )
    if layers is not None:
        s["layers"] = layers
    return llama(
        batch,
        seq or max_seq,
        s.pop("hidden"),
        s.pop("heads"),
        s.pop("vocab"),
        s.pop("layers"),
        dtype=dtype,
        **s,
    )
