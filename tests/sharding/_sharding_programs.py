"""Small programs the sharding tests share, and ``flat`` to compare nested outputs."""

from __future__ import annotations

import ir
from ir import DType, FunctionBuilder, TensorType


def mlp(batch=8, features=6, hidden=10, out=4, training=False) -> ir.Function:
    """x @ w1 -> relu -> @ w2 (and, for training, the loss and both weight gradients)."""
    b = FunctionBuilder("mlp")
    x = b.input("x", TensorType((batch, features), device=0))
    w1 = b.input("w1", TensorType((features, hidden), device=0))
    w2 = b.input("w2", TensorType((hidden, out), device=0))
    h = b.call("MatMul", x, w1, name="h")
    a = b.call("Relu", h, name="a")
    y = b.call("MatMul", a, w2, name="y")
    if not training:
        return b.finish([y])
    z = b.input("z", TensorType((batch,), DType.int64, device=0))
    loss = b.call("Loss", y, z, name="l")
    dy = b.call("LossGrad", y, z, name="dy")
    dw2, da = b.call("MatMulGrad", a, w2, dy, name=["dw2", "da"])
    dh = b.call("ReluGrad", h, da, name="dh")
    dw1, _ = b.call("MatMulGrad", x, w1, dh, name=["dw1", "dx"])
    return b.finish([loss, dw1, dw2])


def flat(values) -> list:
    """The leaves of nested tuples (a program's outputs), in order."""
    out = []
    for v in values:
        out += flat(v) if isinstance(v, tuple) else [v]
    return out
