"""Small programs the widget tests draw: built with FunctionBuilder, executed where it matters."""

from __future__ import annotations

import ir
from ir import FunctionBuilder, TensorType
from ir.types import DeviceVar


def data_parallel_matmul(devices: tuple[int, ...] = (1, 2), batch: int = 8) -> ir.Function:
    """Seed 002's matmul: scatter x, broadcast wA, pmap MatMul+Relu, gather on device 0."""
    b = FunctionBuilder("matmul_dp")
    x = b.input("x", TensorType((batch, 4), device=0))
    w = b.input("wA", TensorType((4, 3), device=0))
    xs = b.call("Scatter", x, dim=0, devices=devices, name="xs")
    ws = b.call("Broadcast", w, devices=devices, name="wAs")
    n = len(devices)
    body = FunctionBuilder("body")
    d = DeviceVar("d")
    xi = body.input("xi", TensorType((batch // n, 4), device=d))
    wi = body.input("wAi", TensorType((4, 3), device=d))
    ai = body.call("MatMul", xi, wi, name="ai")
    ri = body.call("Relu", ai, name="ri")
    body_fn = body.finish([ri])
    (rs,) = b.add_op(
        "Pmap", [xs, ws], {"device_var": "d"}, subfunctions=[body_fn], names=["rs"]
    ).outputs
    r = b.call("Gather", rs, dim=0, to_device=0, name="r")
    return b.finish([r])


def deep_mlp(layers: int = 24, device_of_layer=lambda i: 0, width: int = 8) -> ir.Function:
    """``layers`` layers of MatMul, Add (bias), Gelu; layer i on ``device_of_layer(i)``."""
    b = FunctionBuilder(f"mlp{layers}")
    h = b.input("x", TensorType((4, width), device=device_of_layer(0)))
    for i in range(layers):
        dev = device_of_layer(i)
        if h.type.device != dev:
            h = b.call("Send", h, to_device=dev, name=f"h{i}_moved")
        w = b.input(f"w{i}", TensorType((width, width), device=dev))
        bias = b.input(f"b{i}", TensorType((width,), device=dev))
        h = b.call("MatMul", h, w, name=f"m{i}")
        h = b.call("Add", h, bias, name=f"a{i}")
        h = b.call("Gelu", h, name=f"h{i}")
    return b.finish([h])
