"""Helpers of the serving tests: small models, and inputs named like a forward's."""

from __future__ import annotations

import numpy as np

import ir

F64 = ir.DType.float64


def llama(batch: int = 2, seq: int = 10, layers: int = 2, **kw) -> ir.Function:
    kw = {"kv_heads": 2, "ffn": 48, "dtype": F64, **kw}
    return ir.models.llama(batch, seq, 32, 4, 50, layers, **kw)


def gpt(batch: int = 2, seq: int = 10, layers: int = 2, **kw) -> ir.Function:
    kw = {"kv_heads": 2, "dtype": F64, **kw}
    return ir.models.gpt(batch, seq, 32, 4, 50, layers, **kw)


def forward_values(f: ir.Function, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs of ``f`` by name (token ids in range)."""
    return {v.name: x for v, x in zip(f.inputs, ir.random_inputs(f, seed=seed))}


def step_inputs(step: ir.Function, values: dict, tokens: np.ndarray, cache=()) -> list:
    """The inputs of ``step``: weights from ``values``, ``tokens``, then ``cache`` (the
    past keys and values in the step's input order)."""
    cache = iter(cache)
    out = []
    for v in step.inputs:
        if v.name == "tokens":
            out.append(tokens)
        elif v.name.startswith("past_"):
            out.append(next(cache))
        else:
            out.append(values[v.name])
    return out


def empty_cache(step: ir.Function) -> list[np.ndarray]:
    return [
        np.zeros(v.type.shape, v.type.dtype.numpy)
        for v in step.inputs
        if v.name.startswith("past_")
    ]
