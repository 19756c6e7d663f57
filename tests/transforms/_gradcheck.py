"""Finite-difference checks of the gradients ir.transforms.gradients computes (float64)."""

from __future__ import annotations

import numpy as np

import ir
import ir.transforms


def float64_inputs(f: ir.Function, seed: int = 0, classes: int = 3) -> dict[str, np.ndarray]:
    """Random float64 arrays for float inputs, integers in [0, classes) for the others."""
    rng = np.random.default_rng(seed)
    out = {}
    for v in f.inputs:
        if v.type.dtype.is_float:
            out[v.name] = rng.standard_normal(v.type.shape)
        else:
            out[v.name] = rng.integers(0, classes, v.type.shape)
    return out


def loss_of(f: ir.Function, args: dict, loss: int = -1) -> float:
    return float(ir.execute(f, args)[loss])


def numeric_gradient(f: ir.Function, args: dict, name: str, eps: float = 1e-6) -> np.ndarray:
    """Central differences of f's loss (its last output) for every element of input ``name``."""
    base = args[name]
    grad = np.zeros_like(base)
    for idx in np.ndindex(base.shape):
        values = []
        for sign in (1, -1):
            w = base.copy()
            w[idx] += sign * eps
            values.append(loss_of(f, {**args, name: w}))
        grad[idx] = (values[0] - values[1]) / (2 * eps)
    return grad


def check_gradients(
    f: ir.Function, args: dict, *, elementwise: bool = True, seed: int = 0, eps: float = 1e-6
) -> list[str]:
    """Assert ir.transforms.gradients(f) matches finite differences; return the params checked.

    ``elementwise``: every element; otherwise one random direction per parameter
    (<grad, u> against (L(w + eps u) - L(w - eps u)) / 2 eps), which scales to the GPT.
    """
    g = ir.transforms.gradients(f)
    params = ir.transforms.default_params(f)
    got = ir.execute(g, args)[len(f.outputs) :]
    assert len(got) == len(params)
    rng = np.random.default_rng(seed)
    for p, dp in zip(params, got):
        if elementwise:
            np.testing.assert_allclose(dp, numeric_gradient(f, args, p.name, eps), 1e-5, 1e-8)
            continue
        u = rng.standard_normal(dp.shape)
        plus = loss_of(f, {**args, p.name: args[p.name] + eps * u})
        minus = loss_of(f, {**args, p.name: args[p.name] - eps * u})
        np.testing.assert_allclose(
            float(np.sum(dp * u)), (plus - minus) / (2 * eps), rtol=1e-5, atol=1e-8, err_msg=p.name
        )
    return [p.name for p in params]
