"""The ATen table's conv-net part: convolutions, eval-mode batch norm and pooling.

torch lays images out NCHW, the registry's ``Conv2D`` and pooling ops NHWC, so each
op is wrapped in two ``Transpose`` s (consecutive ones cancel in cost only, not in
the program: the importer keeps torch's layout at every node). A convolution whose
kernel tiles the image (kernel = stride, no padding: a ViT's patch embedding) is a
``MatMul`` of flattened patches instead, which every transform (and autodiff) knows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..value import Value
from ._aten import Lowering, Unsupported

_NHWC = (0, 2, 3, 1)
_NCHW = (0, 3, 1, 2)


def _pair(v) -> tuple[int, int]:
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return (int(v[0]), int(v[-1]))


def _patches(lw: Lowering, node, x: Value, w: Value) -> Value:
    cout, cin, p, q = w.type.shape
    n, c, h, wd = x.type.shape
    rows, cols = h // p, wd // q
    name = node.name
    tiles = lw.b.call("Reshape", x, shape=(n, c, rows, p, cols, q), name=f"{name}_tiles")
    tiles = lw.b.call("Transpose", tiles, perm=(0, 2, 4, 1, 3, 5), name=f"{name}_patches")
    tiles = lw.b.call("Reshape", tiles, shape=(n, rows, cols, c * p * q), name=f"{name}_rows")
    flat = lw.b.call("Reshape", w, shape=(cout, cin * p * q), name=f"{name}_w")
    flat = lw.b.call("Transpose", flat, perm=(1, 0), name=f"{name}_wt")
    return lw.b.call("MatMul", tiles, flat, name=f"{name}_mm")


def _convolution(lw: Lowering, node):
    x, w = lw.value(node.args[0]), lw.value(node.args[1])
    bias = node.args[2]
    stride, padding, dilation, transposed, _, groups = node.args[3:9]
    if x.type.rank != 4 or transposed or groups != 1 or any(d != 1 for d in dilation):
        raise Unsupported("only 2-d convolutions without groups, dilation or transposition")
    p, q = w.type.shape[2:]
    h, wd = x.type.shape[2:]
    if _pair(stride) == (p, q) and not any(padding) and h % p == 0 and wd % q == 0:
        y = _patches(lw, node, x, w)  # NHWC
    else:
        ph, pw = _pair(padding)
        xs = lw.b.call("Transpose", x, perm=_NHWC, name=f"{node.name}_nhwc")
        ws = lw.b.call("Transpose", w, perm=(2, 3, 1, 0), name=f"{node.name}_hwio")
        y = lw.b.call(
            "Conv2D",
            xs,
            ws,
            padding=[ph, ph, pw, pw],
            stride=list(_pair(stride)),
            name=f"{node.name}_conv",
        )
    if bias is not None:
        y = lw.b.call("Add", y, lw.value(bias), name=f"{node.name}_bias")
    return lw.call("Transpose", y, node=node, perm=_NCHW)


def _batch_norm(lw: Lowering, node):
    """Eval-mode batch norm: ``(x - mean) * rsqrt(var + eps) * weight + bias`` per channel,
    normalised first and scaled after (as a layer norm), so that the weight's gradient
    is a sum over the batch, as under data parallelism, with nothing after it."""
    x, weight, bias, mean, var = (lw.value(a) if a is not None else None for a in node.args[:5])
    eps = node.args[-1]
    per_channel = (x.type.shape[1],) + (1,) * (x.type.rank - 2)

    def column(v: Value, label: str) -> Value:
        return lw.b.call("Reshape", v, shape=per_channel, name=f"{node.name}_{label}")

    rstd = lw.b.call("Add", var, lw.constant(float(eps), x.type.dtype), name=f"{node.name}_var")
    rstd = lw.b.call("Rsqrt", rstd, name=f"{node.name}_rstd")
    y = lw.b.call("Sub", x, column(mean, "mean"), name=f"{node.name}_centred")
    y = lw.b.call("Mul", y, column(rstd, "r"), name=f"{node.name}_normed")
    if weight is not None:
        y = lw.b.call("Mul", y, column(weight, "w"), name=f"{node.name}_scaled")
    if bias is not None:
        y = lw.b.call("Add", y, column(bias, "b"), name=f"{node.name}_shift")
    return (y, None, None)


def _pool(op_type: str, lw: Lowering, node, kernel, stride, padding, ceil_mode) -> Value:
    x = lw.value(node.args[0])
    if ceil_mode:
        raise Unsupported("ceil_mode")
    ph, pw = _pair(padding) if padding else (0, 0)
    xs = lw.b.call("Transpose", x, perm=_NHWC, name=f"{node.name}_nhwc")
    y = lw.b.call(
        op_type,
        xs,
        kernel=list(_pair(kernel)),
        stride=list(_pair(stride if stride else kernel)),
        padding=[ph, ph, pw, pw],
        name=f"{node.name}_pool",
    )
    return lw.call("Transpose", y, node=node, perm=_NCHW)


def _arguments(node, defaults: list) -> list:
    """The node's arguments after its input, torch's defaults where the graph omits them."""
    given = list(node.args[1:])
    return given + defaults[len(given) :]


def _max_pool(lw: Lowering, node):
    kernel, stride, padding, dilation, ceil_mode = _arguments(node, [None, [], 0, 1, False])
    if any(d != 1 for d in _pair(dilation)):
        raise Unsupported("dilation")
    return (_pool("MaxPool2D", lw, node, kernel, stride, padding, ceil_mode), None)


def _avg_pool(lw: Lowering, node):
    kernel, stride, padding, ceil_mode, count_include_pad, divisor = _arguments(
        node, [None, [], 0, False, True, None]
    )
    if divisor is not None or (any(_pair(padding)) and not count_include_pad):
        raise Unsupported("divisor_override or count_include_pad=False")
    return _pool("AvgPool2D", lw, node, kernel, stride, padding, ceil_mode)


TABLE: dict[str, Callable[[Lowering, Any], Any]] = {
    "aten.convolution.default": _convolution,
    "aten._native_batch_norm_legit_no_training.default": _batch_norm,
    "aten.max_pool2d_with_indices.default": _max_pool,
    "aten.avg_pool2d.default": _avg_pool,
}
