"""Torch kernels of the Llama-style layer ops and the KV cache (``ir/ops/llama.py``,
``ir/ops/kv_cache.py``), the same formulas as their numpy kernels; part of
``ir.backends.torch_kernels.TORCH_KERNELS``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..ops.llama import rotary_tables

Kernel = Callable[[list, Mapping[str, Any]], list]


def _inv_rms(x, epsilon: float):
    return torch.rsqrt(torch.mean(x * x, dim=-1, keepdim=True) + epsilon)


def _rms_norm(xs, a):
    x, gamma = xs
    return [x * _inv_rms(x, a["epsilon"]) * gamma]


def _rms_norm_grad(xs, a):
    x, gamma, dy = xs
    inv = _inv_rms(x, a["epsilon"])
    xhat = x * inv
    g = dy * gamma
    dx = inv * (g - xhat * torch.mean(g * xhat, dim=-1, keepdim=True))
    lead = tuple(range(x.dim() - 1))
    dgamma = torch.sum(dy * xhat, dim=lead) if lead else dy * xhat
    return [dx, dgamma]


def _rotary(xs, a):
    x = xs[0]
    s, d = x.shape[-2:]
    cos, sin = rotary_tables(s, d, a["theta"], a["offset"])  # float64, as numpy's kernel
    cos = torch.as_tensor(cos, device=x.device).to(x.dtype)
    sin = torch.as_tensor(-sin if a["inverse"] else sin, device=x.device).to(x.dtype)
    half = d // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return [x * cos + rotated * sin]


def _swiglu(xs, a):
    gate, up = xs
    return [gate * torch.sigmoid(gate) * up]


def _swiglu_grad(xs, a):
    gate, up, dy = xs
    s = torch.sigmoid(gate)
    return [dy * up * s * (1.0 + gate * (1.0 - s)), dy * gate * s]


LLAMA_KERNELS: dict[str, Kernel] = {
    "RMSNorm": _rms_norm,
    "RMSNormGrad": _rms_norm_grad,
    "Rotary": _rotary,
    "SwiGLU": _swiglu,
    "SwiGLUGrad": _swiglu_grad,
    # a serving engine writes the new rows into its preallocated cache; the value is this
    "CacheAppend": lambda xs, a: [torch.cat(xs, dim=a["axis"])],
}
