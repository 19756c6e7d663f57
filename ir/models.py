"""Ready-made models: the seeds' MLP, a GPT-style and a Llama-style transformer, on device 0.

Both are forward programs whose last output is the scalar loss; ``training=True``
returns ``ir.transforms.training(forward)`` (SGD) instead.

>>> import ir
>>> f = ir.models.mlp(8, 4, 6, 3, activation=None)
>>> for v in f.inputs:
...     print(v.name, v.type)
wA Tensor[(4, 6), 0]
wB Tensor[(6, 3), 0]
x Tensor[(8, 4), 0]
z Tensor[(8,), int64, 0]
>>> print(*str(f).splitlines()[1:], sep=chr(10))
    a: Tensor[(8, 6), 0] = MatMul(x, wA)
    y: Tensor[(8, 3), 0] = MatMul(a, wB)
    l: Float[0] = Loss(y, z)
    return y, l
"""

from __future__ import annotations

import math
import string
from collections.abc import Iterable

from .builder import FunctionBuilder, rebuild_op
from .errors import DistIRError
from .function import Function
from .models_moe import MoEConfig, model_loss, moe_mlp
from .types import DType, TensorType
from .value import Value

__all__ = [
    "LLAMA_SHAPES",
    "ModelError",
    "gpt",
    "gpt_layer_activations",
    "gpt_layer_index",
    "gpt_weight_shapes",
    "llama",
    "llama_ffn",
    "llama_preset",
    "llama_weight_shapes",
    "mlp",
    "mlp_weight_names",
    "moe_config",
    "with_loss",
]

ACTIVATIONS = ("relu", "gelu", "tanh")


class ModelError(DistIRError):
    """Bad model sizes or options."""


def _positive(**sizes: int) -> None:
    for name, n in sizes.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ModelError(f"{name} must be a positive integer, got {n!r}")


def _dtype(dtype: DType | str) -> DType:
    floats = ", ".join(d.value for d in DType if d.is_float)
    try:
        d = dtype if isinstance(dtype, DType) else DType(dtype)
    except (ValueError, TypeError):  # a name DistIR has no dtype for ("int8"), or no name
        shown = repr(dtype) if len(repr(dtype)) <= 40 else repr(dtype)[:37] + "..."
        raise ModelError(f"dtype must be one of {floats}, got {shown}") from None
    if not d.is_float:
        raise ModelError(f"dtype must be floating-point ({floats}), got {d.value}")
    return d


def mlp_weight_names(layers: int) -> list[str]:
    """``wA, wB, ...`` (the seeds' names) up to 26 layers, else ``w0, w1, ...``."""
    if layers <= 26:
        return [f"w{string.ascii_uppercase[i]}" for i in range(layers)]
    return [f"w{i}" for i in range(layers)]


def mlp(
    batch: int,
    features: int,
    hidden: int,
    classes: int,
    layers: int = 2,
    training: bool = False,
    activation: str | None = "relu",
    dtype: DType | str = DType.float32,
) -> Function:
    """The seeds' MLP: ``layers`` MatMuls with ``activation`` between them, cross-entropy loss.

    Inputs ``wA (F, H), wB (H, H), ..., (H, C)``, then ``x (B, F)`` and integer
    labels ``z (B,)``; returns ``y, l`` (logits and the mean loss). With
    ``activation=None`` and two layers it is exactly the seed's program.
    """
    _positive(batch=batch, features=features, hidden=hidden, classes=classes, layers=layers)
    if activation is not None and activation not in ACTIVATIONS:
        raise ModelError(f"activation must be one of {ACTIVATIONS} or None, got {activation!r}")
    dt = _dtype(dtype)
    dims = [features] + [hidden] * (layers - 1) + [classes]
    b = FunctionBuilder("mlp")
    ws = [
        b.input(name, TensorType((dims[i], dims[i + 1]), dt, 0))
        for i, name in enumerate(mlp_weight_names(layers))
    ]
    x = b.input("x", TensorType((batch, features), dt, 0))
    z = b.input("z", TensorType((batch,), DType.int64, 0))
    h = x
    for i, w in enumerate(ws):
        last = i == layers - 1
        suffix = "" if layers == 2 else str(i)
        h = b.call("MatMul", h, w, name="y" if last else f"a{suffix}")
        if not last and activation is not None:
            h = b.call(activation.capitalize(), h, name=f"h{suffix}")
    loss = b.call("Loss", h, z, name="l")
    forward = b.finish([h, loss])
    return _maybe_training(forward, training)


def _maybe_training(forward: Function, training: bool) -> Function:
    if not training:
        return forward
    from .transforms import training as make_training

    return make_training(forward)


def with_loss(
    f: Function, kind: str = "cross_entropy", output: int = 0, labels: str = "labels"
) -> Function:
    """``f`` (an imported language model, say) with a ``Loss`` of its output ``output``
    appended: a new input ``labels`` (int64 class indices of the output's leading shape
    for ``cross_entropy``, a tensor like the output for ``mse``), and the loss as the last
    output. The mean over rows is torch's ``cross_entropy`` (``mse_loss`` sums the
    squares of a row first), and ``ir.transforms.training`` can take it from there.

    >>> import ir
    >>> b = ir.FunctionBuilder("lm")
    >>> x = b.input("x", ir.TensorType((2, 4)))
    >>> w = b.input("w", ir.TensorType((4, 5)))
    >>> f = with_loss(b.finish([b.call("MatMul", x, w, name="logits")]))
    >>> [v.name for v in f.inputs], [v.name for v in f.outputs]
    (['x', 'w', 'labels'], ['logits', 'l'])
    """
    if not -len(f.outputs) <= output < len(f.outputs):
        raise ModelError(f"{f.name} has {len(f.outputs)} output(s); there is no output {output}")
    if labels in {v.name for v in f.inputs}:
        raise ModelError(f"{f.name} already has an input {labels!r}; name the labels otherwise")
    y = f.outputs[output]
    if not isinstance(y.type, TensorType) or not y.type.dtype.is_float:
        raise ModelError(f"output {output} of {f.name} ({y.type}) is not a float tensor")
    b = FunctionBuilder(f.name)
    env = {v: b.input(v.name, v.type) for v in f.inputs}
    if kind == "cross_entropy":
        z_type = TensorType(y.type.shape[:-1], DType.int64, y.type.device)
    else:
        z_type = y.type
    z = b.input(labels, z_type)
    for op in f.ops:
        for old, new in zip(op.outputs, rebuild_op(b, op, [env[v] for v in op.inputs])):
            env[old] = new
    loss = b.call("Loss", env[y], z, kind=kind, name="l")
    return b.finish([*(env[v] for v in f.outputs), loss])


# -- GPT -----------------------------------------------------------------------------


def gpt_weight_shapes(
    seq: int,
    hidden: int,
    vocab: int,
    layers: int,
    heads: int | None = None,
    kv_heads: int | None = None,
    moe: MoEConfig | None = None,
) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every GPT weight, in input order. With ``kv_heads`` (and ``heads``)
    ``wk`` and ``wv`` are ``(H, kv_heads * H / heads)`` (grouped-query attention); with
    ``moe`` (``ir.models_moe.MoEConfig``) a MoE layer's router and experts replace the
    MLP of each layer from ``moe.dense_layers`` on."""
    H = hidden
    kv = H if kv_heads is None or heads is None else kv_heads * (H // heads)
    shapes: dict[str, tuple[int, ...]] = {"wte": (vocab, H), "wpe": (seq, H)}
    for i in range(layers):
        p = f"h{i}"
        shapes.update({f"{p}_ln1_g": (H,), f"{p}_ln1_b": (H,)})
        shapes.update({f"{p}_attn_w{c}": (H, H if c in "qo" else kv) for c in "qkvo"})
        shapes.update({f"{p}_ln2_g": (H,), f"{p}_ln2_b": (H,)})
        if moe is not None and moe.is_moe(i):
            shapes.update(moe.weight_shapes(p, H, 4 * H))
            continue
        shapes.update({f"{p}_mlp_w1": (H, 4 * H), f"{p}_mlp_w2": (4 * H, H)})
    shapes.update({"lnf_g": (H,), "lnf_b": (H,), "w_head": (H, vocab)})
    return shapes


ATTENTION_FORMS = ("fused", "fused_softmax", "unfused")


class _Gpt:
    """Builds the GPT's ops; ``w`` holds the weight inputs by name."""

    def __init__(
        self,
        b: FunctionBuilder,
        w: dict[str, Value],
        sizes: tuple[int, int, int, int],
        form: str,
        dropout: tuple[float, float] = (0.0, 0.0),
        moe: MoEConfig | None = None,
    ) -> None:
        self.b, self.w, self.form, self.moe = b, w, form, moe
        self.aux_losses: list[Value] = []
        self.hidden_p, self.attention_p = dropout
        self.B, self.S, self.nh, self.nkv = sizes
        self.H = w["wte"].type.shape[1]
        self.dh = self.H // self.nh

    def layer_norm(self, x: Value, prefix: str) -> Value:
        g, beta = self.w[f"{prefix}_g"], self.w[f"{prefix}_b"]
        return self.b.call("LayerNorm", x, g, beta, name=f"{prefix}_y")

    def heads(self, x: Value, name: str, heads: int, perm: tuple[int, ...]) -> Value:
        """(B, S, heads * dh) -> (B, heads, S, dh) with perm (0, 2, 1, 3), K^T with (0, 2, 3, 1)."""
        shape = (self.B, self.S, heads, self.dh)
        r = self.b.call("Reshape", x, shape=shape, name=f"{name}_r")
        return self.b.call("Transpose", r, perm=perm, name=f"{name}_h")

    def repeat_kv(self, x: Value, name: str) -> Value:
        """(B, kv_heads, a, b) -> (B, heads, a, b), each kv head repeated for its group of
        query heads (query head h reads kv head h // group), for the unfused form."""
        if self.nkv == self.nh:
            return x
        group, (_, _, a, c) = self.nh // self.nkv, x.type.shape  # type: ignore[union-attr]
        one = self.b.call("Reshape", x, shape=(self.B, self.nkv, 1, a, c), name=f"{name}_g")
        wide = (self.B, self.nkv, group, a, c)
        rep = self.b.call("BroadcastTo", one, shape=wide, name=f"{name}_rep")
        return self.b.call("Reshape", rep, shape=(self.B, self.nh, a, c), name=f"{name}_all")

    def attention(self, x: Value, p: str) -> Value:
        b, w = self.b, self.w
        xn = self.layer_norm(x, f"{p}_ln1")
        straight = (0, 2, 1, 3)
        q = self.heads(
            b.call("MatMul", xn, w[f"{p}_attn_wq"], name=f"{p}_q"), f"{p}_q", self.nh, straight
        )
        k_in = b.call("MatMul", xn, w[f"{p}_attn_wk"], name=f"{p}_k")
        v_in = b.call("MatMul", xn, w[f"{p}_attn_wv"], name=f"{p}_v")
        if self.form == "fused":
            k = self.heads(k_in, f"{p}_k", self.nkv, straight)
            v = self.heads(v_in, f"{p}_v", self.nkv, straight)
            o = b.call("Attention", q, k, v, causal=True, name=f"{p}_ctx")
        else:
            kt = self.repeat_kv(self.heads(k_in, f"{p}_k", self.nkv, (0, 2, 3, 1)), f"{p}_k")
            v = self.repeat_kv(self.heads(v_in, f"{p}_v", self.nkv, straight), f"{p}_v")
            s = b.call("MatMul", q, kt, name=f"{p}_scores")
            scale = 1.0 / math.sqrt(self.dh)
            if self.form == "fused_softmax":  # Megatron-LM's scale-mask-softmax kernel
                probs = b.call("Softmax", s, axis=-1, scale=scale, causal=True, name=f"{p}_probs")
            else:
                s = b.call("Scale", s, factor=scale, name=f"{p}_scaled")
                s = b.call("CausalMask", s, name=f"{p}_masked")
                probs = b.call("Softmax", s, axis=-1, name=f"{p}_probs")
            probs = self.dropout(probs, self.attention_p, f"{p}_probs_drop", p, 0)
            o = b.call("MatMul", probs, v, name=f"{p}_ctx")
        o = b.call("Transpose", o, perm=straight, name=f"{p}_ctx_t")
        o = b.call("Reshape", o, shape=(self.B, self.S, self.H), name=f"{p}_merged")
        o = b.call("MatMul", o, w[f"{p}_attn_wo"], name=f"{p}_attn_out")
        o = self.dropout(o, self.hidden_p, f"{p}_attn_drop", p, 1)
        return b.call("Add", x, o, name=f"{p}_res1")

    def dropout(self, x: Value, prob: float, name: str, layer: str, site: int) -> Value:
        """``x`` through Dropout (a distinct seed per layer and site), or ``x`` if ``prob`` is 0."""
        if prob == 0:
            return x
        seed = 3 * int(layer[1:]) + site
        y, _ = self.b.call("Dropout", x, p=prob, seed=seed, name=[name, f"{name}_mask"])
        return y

    def mlp(self, x: Value, p: str) -> Value:
        b, w = self.b, self.w
        xn = self.layer_norm(x, f"{p}_ln2")
        if self.moe is not None and self.moe.is_moe(int(p[1:])):
            h, aux = moe_mlp(b, w, xn, p, self.moe)
            if aux is not None:
                self.aux_losses.append(aux)
            h = self.dropout(h, self.hidden_p, f"{p}_mlp_drop", p, 2)
            return b.call("Add", x, h, name=f"{p}_res2")
        h = b.call("Gelu", b.call("MatMul", xn, w[f"{p}_mlp_w1"], name=f"{p}_fc"), name=f"{p}_gelu")
        h = b.call("MatMul", h, w[f"{p}_mlp_w2"], name=f"{p}_proj")
        h = self.dropout(h, self.hidden_p, f"{p}_mlp_drop", p, 2)
        return b.call("Add", x, h, name=f"{p}_res2")


def gpt(
    batch: int,
    seq: int,
    hidden: int,
    heads: int,
    vocab: int,
    layers: int,
    training: bool = False,
    dtype: DType | str = DType.float32,
    *,
    attention: str = "fused",
    kv_heads: int | None = None,
    dropout: float = 0.0,
    attention_dropout: float = 0.0,
    experts: int = 0,
    top_k: int = 2,
    capacity_factor: float = 1.0,
    expert_hidden: int = 0,
    shared_experts: int = 0,
    dense_layers: int = 0,
    aux_loss: float = 0.01,
) -> Function:
    """A GPT-style decoder: token + learned position embedding, ``layers`` pre-LN blocks, head.

    Inputs (in order, see ``gpt_weight_shapes``): ``wte (V, H)``, ``wpe (S, H)``,
    per block ``h<i>_ln1_g/_b``, ``h<i>_attn_wq/wk/wv/wo (H, H)``,
    ``h<i>_ln2_g/_b``, ``h<i>_mlp_w1 (H, 4H)``, ``h<i>_mlp_w2 (4H, H)``; then
    ``lnf_g/_b``, ``w_head (H, V)``, ``tokens (B, S)`` and ``labels (B, S)`` (the
    next tokens; both int64). Head ``j`` is the column block ``j*dh:(j+1)*dh`` of
    ``wq``, ``wk`` and ``wv`` (dh = H / heads). Returns ``logits (B, S, V), l``.

    ``attention="fused"`` (the default) computes each layer's attention as one
    ``Attention`` op (causal), as the fused kernels that users run (FlashAttention,
    torch's ``scaled_dot_product_attention``) do: the predicted time and memory are
    theirs, and no ``(B, heads, S, S)`` tensor is kept for the backward.
    ``attention="unfused"`` writes it out for teaching: ``h<i>_scores = MatMul(q, k^T)``,
    ``Scale``, ``CausalMask``, ``h<i>_probs = Softmax``, ``MatMul`` by v.
    ``attention="fused_softmax"`` is attention as Megatron-LM ran it before FlashAttention:
    the two batched products around one fused scale-mask-softmax kernel
    (``Softmax(scale=, causal=True)``). All name the attention's result ``h<i>_ctx``
    ``(B, heads, S, dh)`` and compute the same function.

    ``kv_heads`` (grouped-query attention, as Llama 2/3 use; 1 is multi-query): ``wk`` and
    ``wv`` are ``(H, kv_heads * dh)`` and query head ``j`` reads key/value head
    ``j // (heads / kv_heads)``; ``heads`` must be a multiple of ``kv_heads``. The unfused
    form repeats each key/value head for its group (``BroadcastTo``).

    ``dropout``: Megatron-LM's hidden dropout, on each layer's attention projection and
    MLP output before their residual adds; ``attention_dropout``: on the attention
    probabilities (the unfused form only: a fused kernel's dropout is not modelled).
    Megatron-LM's defaults are 0.1 and 0.1; 0 (the default here) adds no op. Each is a
    ``Dropout`` op whose mask every sharding draws alike (``ir/ops/dropout.py``).

    ``experts=E`` (a mixture of experts, ``ir.models_moe``): the MLP of every layer from
    ``dense_layers`` on is ``E`` experts of ``expert_hidden`` columns (0: ``4 * hidden``),
    each token routed to ``top_k`` of them with ``capacity_factor`` places per expert
    (``ceil(capacity_factor * seq * top_k / E)`` per sequence), ``shared_experts`` dense
    ones beside (DeepSeek-V3), and the load-balancing loss weighted ``aux_loss`` added to
    the loss. Weights ``h<i>_moe_router (H, E)``, ``h<i>_moe_w1 (E, H, F)``,
    ``h<i>_moe_w2 (E, F, H)`` (and ``h<i>_moe_shared_w1/_w2``) replace ``h<i>_mlp_w1/_w2``.
    """
    _positive(batch=batch, seq=seq, hidden=hidden, heads=heads, vocab=vocab, layers=layers)
    moe = moe_config(
        experts, top_k, capacity_factor, expert_hidden, shared_experts, dense_layers, aux_loss
    )
    if hidden % heads:
        raise ModelError(f"hidden {hidden} is not divisible by heads {heads}")
    if attention not in ATTENTION_FORMS:
        raise ModelError(f"attention must be one of {ATTENTION_FORMS}, got {attention!r}")
    if kv_heads is not None:
        _positive(kv_heads=kv_heads)
        if heads % kv_heads:
            raise ModelError(
                f"heads {heads} is not a multiple of kv_heads {kv_heads} (each key/value head "
                "serves a group of heads / kv_heads query heads)"
            )
    for name, prob in (("dropout", dropout), ("attention_dropout", attention_dropout)):
        if isinstance(prob, bool) or not isinstance(prob, (int, float)) or not 0 <= prob < 1:
            raise ModelError(f"{name} must be a probability in [0, 1), got {prob!r}")
    if attention_dropout and attention == "fused":
        raise ModelError(
            "attention_dropout needs attention='unfused' or 'fused_softmax': the fused "
            "Attention op has no dropout (FlashAttention's in-kernel dropout is not modelled)"
        )
    dt = _dtype(dtype)
    b = FunctionBuilder("gpt")
    w = {
        name: b.input(name, TensorType(shape, dt, 0))
        for name, shape in gpt_weight_shapes(
            seq, hidden, vocab, layers, heads, kv_heads, moe
        ).items()
    }
    tokens = b.input("tokens", TensorType((batch, seq), DType.int64, 0))
    labels = b.input("labels", TensorType((batch, seq), DType.int64, 0))
    sizes = (batch, seq, heads, heads if kv_heads is None else kv_heads)
    m = _Gpt(b, w, sizes, attention, dropout=(dropout, attention_dropout), moe=moe)
    h = b.call("Embedding", w["wte"], tokens, name="tok_emb")
    h = b.call("Add", h, w["wpe"], name="emb")
    for i in range(layers):
        h = m.mlp(m.attention(h, f"h{i}"), f"h{i}")
    h = m.layer_norm(h, "lnf")
    logits = b.call("MatMul", h, w["w_head"], name="logits")
    loss = model_loss(b, logits, labels, m.aux_losses)
    return _maybe_training(b.finish([logits, loss]), training)


def moe_config(
    experts: int,
    top_k: int = 2,
    capacity_factor: float = 1.0,
    expert_hidden: int = 0,
    shared_experts: int = 0,
    dense_layers: int = 0,
    aux_loss: float = 0.01,
) -> MoEConfig | None:
    """The checked mixture-of-experts options of a model builder (None for ``experts=0``:
    a dense model); a ``ModelError`` names a bad one."""
    if isinstance(experts, bool) or not isinstance(experts, int) or experts < 0:
        raise ModelError(f"experts must be an integer >= 0 (0: a dense MLP), got {experts!r}")
    if experts == 0:
        return None
    _positive(top_k=top_k)
    if top_k > experts:
        raise ModelError(f"top_k={top_k} is more than the {experts} experts; choose k <= {experts}")
    for name, n in (
        ("expert_hidden", expert_hidden),
        ("shared_experts", shared_experts),
        ("dense_layers", dense_layers),
    ):
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ModelError(f"{name} must be an integer >= 0, got {n!r}")
    for name, x in (("capacity_factor", capacity_factor), ("aux_loss", aux_loss)):
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not 0 <= x < math.inf:
            raise ModelError(f"{name} must be a finite number >= 0, got {x!r}")
    if capacity_factor <= 0:
        raise ModelError(f"capacity_factor must be > 0, got {capacity_factor!r}")
    return MoEConfig(
        experts,
        top_k,
        float(capacity_factor),
        expert_hidden,
        shared_experts,
        dense_layers,
        float(aux_loss),
    )


def gpt_layer_index(v: Value) -> int | None:
    """The transformer layer ``v`` belongs to by its name (``h<i>_...``, as
    :func:`gpt` names a layer's values), or None."""
    head = v.name.split("_", 1)[0]
    return int(head[1:]) if head[:1] == "h" and head[1:].isdigit() and "_" in v.name else None


def gpt_layer_activations(t: Function, layers: Iterable[int] | None = None) -> list[Value]:
    """Every forward value inside a transformer layer of ``ir.models.gpt``'s training step
    that the backward needs, with whatever it is recomputed from, except each layer's
    output (``h<i>_res2``), the checkpoint the next layer starts from. ``layers``: only
    those layers (by index; default all).

    ``ir.transforms.recompute(t, gpt_layer_activations(t))`` then replays each layer's
    forward from its input before the layer's backward, as Megatron-LM's per-layer
    activation checkpointing does, but for the layer's last projection (``h<i>_proj``)
    and residual add: nothing in the backward reads them, so the transform does not
    replay them, while Megatron-LM's checkpointed function runs the layer whole.
    """
    from .transforms.recompute import backward_start

    start = backward_start(t)
    producer = {v: op for op in t.ops[:start] for v in op.outputs}

    wanted = None if layers is None else set(layers)

    def in_layer(v: Value) -> bool:
        i = gpt_layer_index(v)
        return i is not None and (wanted is None or i in wanted) and not v.name.endswith("_res2")

    read_by_backward = {v for op in t.ops[start:] for v in op.inputs}
    chosen = {v for v in producer if in_layer(v) and v in read_by_backward}
    frontier = list(chosen)
    while frontier:
        for u in producer[frontier.pop()].inputs:
            if u in producer and in_layer(u) and u not in chosen:
                chosen.add(u)
                frontier.append(u)
    return [v for v in producer if v in chosen]


from .models_llama import (  # noqa: E402  (it builds on the helpers above)
    LLAMA_SHAPES,
    llama,
    llama_ffn,
    llama_preset,
    llama_weight_shapes,
)
