"""Torch implementations of the registry's compute ops, for ranked programs on torch ranks.

Each entry of :data:`TORCH_KERNELS` computes what the op's numpy kernel in
``ir/ops`` computes (same formula, same dtype), on ``torch.Tensor`` operands:
``kernel(inputs, attributes) -> list of results``; one exception: ``Loss`` sums a
float16 or bfloat16 loss in float32 (numpy's float16 total overflows past 65,504,
6,000 tokens at a loss of 11; its bfloat16 total stops growing). Kernels allocate on
their operands' device (CPU or CUDA). The ops covered are those of the MLP and GPT
programs (forward, backward, SGD and Adam) and the ops that lowering adds (``Slice``,
``Concat``, ``Sum``, ``Split``, tuples), ``Conv2D`` (any stride, dilation and groups) for
the halo exchange of a spatially sharded convolution, and some ops of imported models
(``ConvTranspose2D``, comparisons, logic, maxima and minima, logarithms, rounding). An op
without an entry is refused before any process starts (:func:`check_kernels`).

Imported only where torch is used (the backend's workers): it imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from ..errors import ExecutionError
from ..ops.communication import split_sizes
from .torch_llama import LLAMA_KERNELS

Kernel = Callable[[list, Mapping[str, Any]], list]

_GELU_C = math.sqrt(2.0 / math.pi)


def _unary(fn: Callable[[torch.Tensor], torch.Tensor]) -> Kernel:
    return lambda xs, a: [fn(xs[0])]


def _tensors(xs: list) -> list:
    """A variadic op's operands: several tensors, or one tuple of them."""
    return list(xs[0]) if len(xs) == 1 and isinstance(xs[0], tuple) else list(xs)


def _matmul_grad(xs, a):
    x, w, dy = xs
    dx = torch.matmul(dy, w.transpose(-1, -2))
    if w.dim() == 2 and x.dim() > 2:
        dw = torch.tensordot(x, dy, dims=(list(range(x.dim() - 1)), list(range(dy.dim() - 1))))
    else:
        dw = torch.matmul(x.transpose(-1, -2), dy)
    return [dw, dx]


def _gelu(x):
    return 0.5 * x * (1.0 + torch.tanh(_GELU_C * (x + 0.044715 * x**3)))


def _gelu_grad(xs, a):
    x, dy = xs
    t = torch.tanh(_GELU_C * (x + 0.044715 * x**3))
    d_inner = _GELU_C * (1.0 + 3 * 0.044715 * x**2)
    return [dy * (0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * d_inner)]


def _softmax(xs, a):
    x = xs[0]
    scale, causal = a.get("scale", 1.0), a.get("causal", False)
    if scale != 1:
        x = x * scale
    if causal:
        rows, cols = x.shape[-2:]
        above = torch.triu(torch.ones(rows, cols, dtype=torch.bool, device=x.device), 1)
        x = x.masked_fill(above, float("-inf"))
    e = torch.exp(x - torch.amax(x, dim=a["axis"], keepdim=True))
    return [e / torch.sum(e, dim=a["axis"], keepdim=True)]


def _softmax_grad(xs, a):
    y, dy = xs
    dx = y * (dy - torch.sum(dy * y, dim=a["axis"], keepdim=True))
    scale = a.get("scale", 1.0)
    return [dx * scale if scale != 1 else dx]


def _normalise(x, epsilon: float):
    mean = torch.mean(x, dim=-1, keepdim=True)
    var = torch.mean((x - mean) ** 2, dim=-1, keepdim=True)
    inv_std = 1.0 / torch.sqrt(var + epsilon)
    return (x - mean) * inv_std, inv_std


def _layer_norm(xs, a):
    x, gamma, beta = xs
    xhat, _ = _normalise(x, a["epsilon"])
    return [xhat * gamma + beta]


def _layer_norm_grad(xs, a):
    x, gamma, dy = xs
    xhat, inv_std = _normalise(x, a["epsilon"])
    lead = tuple(range(x.dim() - 1))
    g = dy * gamma
    dx = inv_std * (
        g - torch.mean(g, dim=-1, keepdim=True) - xhat * torch.mean(g * xhat, dim=-1, keepdim=True)
    )
    dgamma = torch.sum(dy * xhat, dim=lead) if lead else dy * xhat
    dbeta = torch.sum(dy, dim=lead) if lead else dy.clone()
    return [dx, dgamma, dbeta]


def _causal_mask(xs, a):
    x = xs[0]
    rows, cols = x.shape[-2:]
    above = torch.triu(torch.ones((rows, cols), dtype=torch.bool, device=x.device), diagonal=1)
    return [torch.where(above, torch.tensor(a["fill"], dtype=x.dtype, device=x.device), x)]


def _attention_mask(q, k, mask, causal: bool):
    """SDPA's ``attn_mask`` (bool keep, or additive), ``is_causal`` and the rows that attend
    no key (their results are zero, as ``ir/ops/attention.py`` defines; SDPA would give NaN,
    so those rows attend everything and are zeroed after)."""
    sq, sk = q.shape[-2], k.shape[-2]
    if causal and mask is None and sq == sk:
        return None, True, None
    if causal:
        keep = torch.ones((sq, sk), dtype=torch.bool, device=q.device).tril(sk - sq)
        if mask is None:
            mask = keep
        elif mask.dtype == torch.bool:
            mask = mask & keep
        else:
            mask = mask.masked_fill(~keep, float("-inf"))
    if mask is None:
        return None, False, None
    if mask.dtype == torch.bool:
        dead = ~mask.any(dim=-1, keepdim=True)
        return mask | dead, False, dead
    dead = torch.isneginf(mask).all(dim=-1, keepdim=True)
    return mask.masked_fill(dead, 0.0), False, dead


def _sdpa(q, k, v, mask, a):
    attn_mask, is_causal, dead = _attention_mask(q, k, mask, a["causal"])
    out = torch.nn.functional.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=attn_mask,
        is_causal=is_causal,
        scale=a["scale"],
        enable_gqa=q.shape[1] != k.shape[1],
    )
    return out if dead is None else out.masked_fill(dead, 0.0)


def _attention_grad(xs, a):
    # the op's formula (ir/ops/attention.py): the probabilities recomputed from q and k,
    # the row sums from out (as FlashAttention's backward reads O), per kv-head group
    q, k, v, out, dout = xs[:5]
    b, hq, sq, d = q.shape
    hkv, sk = k.shape[1], k.shape[2]
    g = hq // hkv if hkv else 0
    attn_mask, is_causal, dead = _attention_mask(q, k, xs[5] if len(xs) > 5 else None, a["causal"])
    scale = 1.0 / math.sqrt(d) if a["scale"] is None else a["scale"]
    qg = q.reshape(b, hkv, g, sq, d)
    s = torch.matmul(qg, k.unsqueeze(2).transpose(-1, -2)) * scale
    if is_causal:
        attn_mask = torch.ones((sq, sk), dtype=torch.bool, device=q.device).tril(sk - sq)
    if attn_mask is not None:
        full = attn_mask.expand(b, hq, sq, sk).reshape(b, hkv, g, sq, sk)
        s = s.masked_fill(~full, float("-inf")) if full.dtype == torch.bool else s + full
    p = torch.softmax(s, dim=-1)
    if dead is not None:
        p = p.masked_fill(dead.expand(b, hq, sq, 1).reshape(b, hkv, g, sq, 1), 0.0)
    do = dout.reshape(b, hkv, g, sq, -1)
    dv = torch.matmul(p.transpose(-1, -2), do).sum(dim=2)
    dp = torch.matmul(do, v.unsqueeze(2).transpose(-1, -2))
    rows = torch.sum(do * out.reshape(b, hkv, g, sq, -1), dim=-1, keepdim=True)
    ds = p * (dp - rows) * scale
    dq = torch.matmul(ds, k.unsqueeze(2)).reshape(b, hq, sq, d)
    dk = torch.matmul(ds.transpose(-1, -2), qg).sum(dim=2)
    return [dq, dk, dv]


def _denominator(y, a) -> float:
    if a["denominator"] > 0:
        return float(a["denominator"])
    if a["kind"] == "cross_entropy" or y.dim() >= 2:
        return float(max(math.prod(y.shape[:-1]), 1))
    return float(max(y.numel(), 1))


def _labels(op: str, z, classes: int):
    if z.numel() and (int(z.min()) < 0 or int(z.max()) >= classes):
        raise ExecutionError(f"{op}: class labels z must lie in [0, {classes}), got {z.tolist()}")
    return z.long().unsqueeze(-1)


def _log_softmax(y):
    shifted = y - torch.amax(y, dim=-1, keepdim=True)
    return shifted - torch.log(torch.sum(torch.exp(shifted), dim=-1, keepdim=True))


def _loss(xs, a):
    y, z = xs
    # a half-precision total overflows (16k tokens of a loss near 10 pass float16's 65504):
    # it is summed in float32 and divided there; run_op casts the mean back to y's dtype
    wide = torch.float32 if y.dtype in (torch.float16, torch.bfloat16) else None
    if a["kind"] == "cross_entropy":
        picked = torch.gather(_log_softmax(y), -1, _labels("Loss", z, y.shape[-1]))
        total = -torch.sum(picked, dtype=wide)
    else:
        total = torch.sum((y - z) ** 2, dtype=wide)
    return [total / _denominator(y, a)]


def _loss_grad(xs, a):
    y, z = xs
    factor = a["scale"] / _denominator(y, a)
    if a["kind"] == "cross_entropy":
        dy = torch.exp(_log_softmax(y))
        labels = _labels("LossGrad", z, y.shape[-1])
        dy = dy.scatter(-1, labels, torch.gather(dy, -1, labels) - 1.0)
    else:
        dy = 2.0 * (y - z)
    return [dy * factor]


def _adam(xs, a):
    w, dw, m, v = xs
    if bool(torch.any(v < 0)):
        raise ExecutionError("Adam: the second moment v must be >= 0")
    b1, b2, step = a["beta1"], a["beta2"], a["step"]
    m1 = b1 * m + (1.0 - b1) * dw
    v1 = b2 * v + (1.0 - b2) * dw * dw
    m_hat = m1 / (1.0 - b1**step)
    v_hat = v1 / (1.0 - b2**step)
    return [w - a["lr"] * m_hat / (torch.sqrt(v_hat) + a["epsilon"]), m1, v1]


def _master_adam(xs, a):
    w, dw, master, m, v = xs
    master1, m1, v1 = _adam([master, dw.to(master.dtype), m, v], a)
    return [master1.to(w.dtype), master1, m1, v1]


def _master_sgd(xs, a):
    w, dw, master = xs
    master1 = master - a["lr"] * dw.to(master.dtype)
    return [master1.to(w.dtype), master1]


def _embedding(xs, a):
    table, ids = xs
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= table.shape[0]):
        raise ExecutionError(f"Embedding: ids must lie in [0, {table.shape[0]})")
    return [table[ids.long()]]


def _embedding_grad(xs, a):
    ids, dy = xs
    out = torch.zeros((a["num_embeddings"], dy.shape[-1]), dtype=dy.dtype, device=dy.device)
    out.index_add_(0, ids.reshape(-1).long(), dy.reshape(-1, dy.shape[-1]))
    if a["padding_idx"] is not None:
        out[a["padding_idx"]] = 0
    return [out]


# -- the vocabulary-parallel forms (ir/ops/vocabulary.py): ids of a contiguous run ------


def _positions(ids, index):
    """Positions of ``ids`` in ``index`` (a run of consecutive ids) and where they are
    found; a general ``index`` is compared element by element."""
    n = index.shape[0]
    first = int(index[0]) if n else 0
    if n and int(index[-1]) - first == n - 1 and bool(torch.all(index[1:] - index[:-1] == 1)):
        pos = ids.long() - first
        found = (pos >= 0) & (pos < n)
        return torch.where(found, pos, torch.zeros_like(pos)), found
    return None, None


def _onehot(ids, index, dtype):
    return (ids.long().unsqueeze(-1) == index.long()).to(dtype)


def _vocab_embedding(xs, a):
    table, ids, rows = xs
    pos, found = _positions(ids, rows)
    if pos is None:
        return [torch.tensordot(_onehot(ids, rows, table.dtype), table, dims=1)]
    return [table[pos] * found.unsqueeze(-1).to(table.dtype)]


def _vocab_embedding_grad(xs, a):
    ids, dy, rows = xs
    flat_ids, flat_dy = ids.reshape(-1), dy.reshape(-1, dy.shape[-1])
    pos, found = _positions(flat_ids, rows)
    if pos is None:
        out = _onehot(flat_ids, rows, dy.dtype).T @ flat_dy
    else:
        out = torch.zeros((rows.shape[0], dy.shape[-1]), dtype=dy.dtype, device=dy.device)
        out.index_add_(0, pos[found], flat_dy[found])
    if a["padding_idx"] is not None:
        out[rows == a["padding_idx"]] = 0
    return [out]


def _class_pick(xs, a):
    y, z, classes = xs
    pos, found = _positions(z, classes)
    if pos is None:
        return [torch.sum(y * _onehot(z, classes, y.dtype), dim=-1)]
    return [torch.gather(y, -1, pos.unsqueeze(-1)).squeeze(-1) * found.to(y.dtype)]


def _parts_denominator(a, rows: int) -> float:
    return float(a["denominator"]) if a["denominator"] > 0 else float(max(rows, 1))


def _cross_entropy_loss(xs, a):
    m, s, t = xs
    wide = torch.float32 if m.dtype in (torch.float16, torch.bfloat16) else None  # as _loss
    return [torch.sum(m + torch.log(s) - t, dtype=wide) / _parts_denominator(a, m.numel())]


def _cross_entropy_grad(xs, a):
    y, z, classes, m, s = xs
    dy = torch.exp(y - m.unsqueeze(-1)) / s.unsqueeze(-1)
    pos, found = _positions(z, classes)
    if pos is None:
        onehot = _onehot(z, classes, y.dtype)
    else:
        hit = torch.arange(y.shape[-1], device=y.device) == pos.unsqueeze(-1)
        onehot = (hit & found.unsqueeze(-1)).to(y.dtype)
    rows = math.prod(y.shape[:-1])
    return [(dy - onehot) * (a["scale"] / _parts_denominator(a, rows))]


def _reduce(fn):
    def kernel(xs, a):
        x = xs[0]
        axes = tuple(range(x.dim())) if a["axes"] is None else tuple(a["axes"])
        if not axes:
            return [x.clone()]
        return [fn(x, dim=axes, keepdim=bool(a["keepdims"]))]

    return kernel


def _slice(xs, a):
    x = xs[0]
    axis = a["axis"] % x.dim()
    n = x.shape[axis]
    start = a["start"] + n if a["start"] < 0 else a["start"]
    end = n if a["end"] is None else (a["end"] + n if a["end"] < 0 else a["end"])
    return [x.narrow(axis, start, end - start).clone()]


def _split(xs, a):
    x = xs[0]
    dim = a["dim"] % x.dim()
    return [
        tuple(p.clone() for p in torch.split(x, split_sizes(x.shape[dim], a["partitions"]), dim))
    ]


def _conv2d(xs, a):
    from ..ops.conv import conv_dilation, conv_stride, window_geometry

    x, w = xs  # NHWC and (Kh, Kw, Cin / groups, Cout), as ir/ops/conv.py
    top, bottom, left, right = window_geometry(a, tuple(w.shape[:2]))[2]
    xp = torch.nn.functional.pad(x.permute(0, 3, 1, 2), (left, right, top, bottom))
    y = torch.nn.functional.conv2d(
        xp,
        w.permute(3, 2, 0, 1),
        stride=conv_stride(a["stride"]),
        dilation=conv_dilation(a),
        groups=a["groups"],
    )
    return [y.permute(0, 2, 3, 1).contiguous()]


def _conv_transpose2d(xs, a):
    from ..ops.conv import conv_dilation, conv_stride, window_geometry
    from ..ops.conv_transpose import output_shape

    x, w = xs  # NHWC and (Kh, Kw, Cout / groups, Cin), as ir/ops/conv_transpose.py
    top, _, left, _ = window_geometry(a, tuple(w.shape[:2]))[2]
    full = torch.nn.functional.conv_transpose2d(
        x.permute(0, 3, 1, 2),
        w.permute(3, 2, 0, 1),
        stride=conv_stride(a["stride"]),
        dilation=conv_dilation(a),
        groups=a["groups"],
    )
    _, h, wd, _ = output_shape(tuple(x.shape), tuple(w.shape), a)
    # cut the padding off the full result (negative pads), add output_padding's zeros
    y = torch.nn.functional.pad(
        full, (-left, wd - full.shape[3] + left, -top, h - full.shape[2] + top)
    )
    return [y.permute(0, 2, 3, 1).contiguous()]


def _compare(xs, a):
    ops = {"eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt}
    return [ops.get(a["kind"], torch.ge)(xs[0], xs[1])]


def _logical(xs, a):
    ops = {"and": torch.logical_and, "or": torch.logical_or}
    return [ops.get(a["kind"], torch.logical_xor)(xs[0], xs[1])]


def _transpose(xs, a):
    x = xs[0]
    perm = tuple(reversed(range(x.dim()))) if a["perm"] is None else tuple(a["perm"])
    return [x.permute(perm).contiguous()]


def _sum(xs, a):
    parts = _tensors(xs)
    out = parts[0].clone()
    for p in parts[1:]:
        out = out + p
    return [out]


_M32 = 0xFFFFFFFF
_INT_VIEW = {8: torch.int64, 4: torch.int32, 2: torch.int16}


def _mix32(h):
    from ..ops.dropout import _MIX

    h = ((h ^ (h >> 16)) * _MIX) & _M32
    h = ((h ^ (h >> 16)) * _MIX) & _M32
    return h ^ (h >> 16)


def _keep_mask(x, p: float, seed: int):
    """ir.ops.dropout.keep_mask in torch int64 arithmetic: the same mask, bit for bit."""
    from ..ops.dropout import _GOLDEN, DROPPED_BITS

    size = x.element_size()
    bits = x.contiguous().view(_INT_VIEW[size]).to(torch.int64)
    if size < 8:  # the word, unsigned
        bits = bits & ((1 << (8 * size)) - 1)
    dropped = DROPPED_BITS[size]
    # a logical shift: mask away the sign bits an arithmetic shift copies in
    bits = (bits >> dropped) & ((1 << (8 * size - dropped)) - 1)
    lo = bits & _M32
    hi = (bits >> 32) & _M32
    h = _mix32(lo ^ ((seed * _GOLDEN) & _M32))
    h = _mix32(h ^ hi)
    return h >= int(p * 2**32)


def _dropout(xs, a):
    x = xs[0]
    keep = _keep_mask(x, a["p"], a["seed"])
    return [torch.where(keep, x / (1 - a["p"]), torch.zeros_like(x)), keep]


TORCH_KERNELS: dict[str, Kernel] = {
    "Add": lambda xs, a: [xs[0] + xs[1]],
    "Sub": lambda xs, a: [xs[0] - xs[1]],
    "Mul": lambda xs, a: [xs[0] * xs[1]],
    "Div": lambda xs, a: [xs[0] / xs[1]],
    "Neg": _unary(torch.neg),
    "Identity": lambda xs, a: [xs[0]],  # values are never written in place
    "Relu": _unary(torch.relu),
    "ReluGrad": lambda xs, a: [xs[1] * (xs[0] > 0).to(xs[1].dtype)],
    "Gelu": _unary(_gelu),
    "GeluGrad": _gelu_grad,
    "Tanh": _unary(torch.tanh),
    "TanhGrad": lambda xs, a: [xs[1] * (1.0 - xs[0] * xs[0])],
    "Exp": _unary(torch.exp),
    "Sqrt": _unary(torch.sqrt),
    "Scale": lambda xs, a: [xs[0] * a["factor"]],
    "MatMul": lambda xs, a: [torch.matmul(xs[0], xs[1])],
    "MatMulGrad": _matmul_grad,
    "Conv2D": _conv2d,
    "ConvTranspose2D": _conv_transpose2d,
    "Log": _unary(torch.log),
    "Abs": _unary(torch.abs),
    "Sign": _unary(torch.sign),
    "Floor": _unary(torch.floor),
    "Ceil": _unary(torch.ceil),
    "Round": _unary(torch.round),
    "Power": lambda xs, a: [torch.pow(xs[0], xs[1])],
    "Maximum": lambda xs, a: [torch.maximum(xs[0], xs[1])],
    "Minimum": lambda xs, a: [torch.minimum(xs[0], xs[1])],
    "Compare": _compare,
    "Logical": _logical,
    "Not": _unary(torch.logical_not),
    "ReduceMax": _reduce(torch.amax),
    "ReduceMin": _reduce(torch.amin),
    "Softmax": _softmax,
    "SoftmaxGrad": _softmax_grad,
    "LayerNorm": _layer_norm,
    "LayerNormGrad": _layer_norm_grad,
    "CausalMask": _causal_mask,
    "Dropout": _dropout,
    "DropoutGrad": lambda xs, a: [
        torch.where(xs[1], xs[0] / (1 - a["p"]), torch.zeros_like(xs[0]))
    ],
    "Attention": lambda xs, a: [_sdpa(*xs[:3], xs[3] if len(xs) > 3 else None, a)],
    "AttentionGrad": _attention_grad,
    "Loss": _loss,
    "LossGrad": _loss_grad,
    "SGDOptimizer": lambda xs, a: [xs[0] - a["lr"] * xs[1]],
    "Adam": _adam,
    "MasterAdam": _master_adam,
    "MasterSGD": _master_sgd,
    "Embedding": _embedding,
    "EmbeddingGrad": _embedding_grad,
    "Arange": lambda xs, a: [torch.arange(a["n"], dtype=getattr(torch, a["dtype"]))],
    "VocabEmbedding": _vocab_embedding,
    "VocabEmbeddingGrad": _vocab_embedding_grad,
    "ClassMax": lambda xs, a: [torch.amax(xs[0], dim=-1)],
    "ClassSumExp": lambda xs, a: [torch.sum(torch.exp(xs[0] - xs[1].unsqueeze(-1)), dim=-1)],
    "ClassPick": _class_pick,
    "CrossEntropyLoss": _cross_entropy_loss,
    "CrossEntropyGrad": _cross_entropy_grad,
    "ReduceSum": _reduce(torch.sum),
    "ReduceMean": _reduce(torch.mean),
    "Reshape": lambda xs, a: [xs[0].reshape(tuple(a["shape"]))],
    "Transpose": _transpose,
    "Slice": _slice,
    "Concat": lambda xs, a: [torch.cat(_tensors(xs), dim=a["dim"])],
    "Split": _split,
    "Sum": _sum,
    "MakeTuple": lambda xs, a: [tuple(xs)],
    "TupleGet": lambda xs, a: [xs[0][a["index"]]],
    **LLAMA_KERNELS,  # RMSNorm, Rotary, SwiGLU, their gradients, CacheAppend
}


def check_kernels(
    ops: Iterable[Any],
    where: str,
    instead: str = "run the program with ir.sharding.run_ranked (numpy)",
) -> None:
    """Refuse, naming it and printing it, the first op without a torch kernel
    (communication ops of ranked programs are the runner's own); ``instead`` says what to
    do other than adding a kernel."""
    from ..verify import describe_op
    from .torch_dist import BackendError

    for op in ops:
        t = op.op_type
        if t not in TORCH_KERNELS and t not in ("SendTo", "RecvFrom", "RankCollective"):
            raise BackendError(
                f"{where}: {t} has no torch kernel in ir.backends.torch_kernels "
                f"(covered: {', '.join(sorted(TORCH_KERNELS))}); add one there or {instead}"
                f"\n  in: {describe_op(op)}"
            )


__all__ = ["TORCH_KERNELS", "check_kernels"]
