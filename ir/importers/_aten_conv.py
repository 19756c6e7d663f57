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

import numpy as np

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
    stride, padding, dilation, transposed, output_padding, groups = node.args[3:9]
    if x.type.rank not in (3, 4):
        raise Unsupported(f"{x.type.rank - 2}-d convolutions (1-d and 2-d are read)")
    flat = x.type.rank == 3  # 1-d: a 2-d convolution of an image of height 1
    if flat:
        x = lw.b.call("Reshape", x, shape=(*x.type.shape[:2], 1, x.type.shape[2]))
        w = lw.b.call("Reshape", w, shape=(*w.type.shape[:2], 1, w.type.shape[2]))
        stride, padding, dilation = (1, stride[0]), (0, padding[0]), (1, dilation[0])
        output_padding = (0, output_padding[0])
    if isinstance(padding, str):
        raise Unsupported(f"padding={padding!r} (torch passes explicit pads after export)")
    p, q = w.type.shape[2:]
    h, wd = x.type.shape[2:]
    plain = not transposed and groups == 1 and all(d == 1 for d in _pair(dilation))
    if plain and _pair(stride) == (p, q) and not any(padding) and h % p == 0 and wd % q == 0:
        y = _patches(lw, node, x, w)  # NHWC
    else:
        ph, pw = _pair(padding)
        xs = lw.b.call("Transpose", x, perm=_NHWC, name=f"{node.name}_nhwc")
        # (Cout, Cin / g, Kh, Kw), or transposed (Cin, Cout / g, Kh, Kw): both to (Kh, Kw, ., .)
        ws = lw.b.call("Transpose", w, perm=(2, 3, 1, 0), name=f"{node.name}_hwio")
        attrs = dict(
            padding=[ph, ph, pw, pw],
            stride=list(_pair(stride)),
            dilation=list(_pair(dilation)),
            groups=int(groups),
        )
        if transposed:
            attrs["output_padding"] = list(_pair(output_padding))
        op = "ConvTranspose2D" if transposed else "Conv2D"
        y = lw.b.call(op, xs, ws, name=f"{node.name}_conv", **attrs)
    if bias is not None:
        y = lw.b.call("Add", y, lw.value(bias), name=f"{node.name}_bias")
    if not flat:
        return lw.call("Transpose", y, node=node, perm=_NCHW)
    y = lw.b.call("Transpose", y, perm=_NCHW, name=f"{node.name}_nchw")
    n, c, _, length = y.type.shape
    return lw.call("Reshape", y, node=node, shape=(n, c, length))


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


def _overhang(size: int, kernel: int, stride: int, pad: int) -> int:
    """Rows a ``ceil_mode`` pooling reads past the padded input (torch's output size: the
    last window must start inside the input or its left padding)."""
    out = -(-(size + 2 * pad - kernel) // stride) + 1
    if (out - 1) * stride >= size + pad:
        out -= 1
    return max((out - 1) * stride + kernel - size - 2 * pad, 0)


def _pool(
    op_type: str, lw: Lowering, node, kernel, stride, padding, ceil_mode, counted=True
) -> Value:
    """NHWC pooling between Transposes. ``ceil_mode`` pads the bottom and right with the
    window's overhang (-inf for max); an average then divides by the elements each
    window covers (padding counted when ``counted``, the overhang never), a mask's
    average over the same windows."""
    x = lw.value(node.args[0])
    kernel, stride = _pair(kernel), _pair(stride if stride else kernel)
    ph, pw = _pair(padding) if padding else (0, 0)
    h, w = x.type.shape[2:]
    extra = (0, 0)
    if ceil_mode:
        extra = (_overhang(h, kernel[0], stride[0], ph), _overhang(w, kernel[1], stride[1], pw))
    xs = lw.b.call("Transpose", x, perm=_NHWC, name=f"{node.name}_nhwc")
    exact = op_type == "MaxPool2D" or (not any(extra) and (counted or not (ph or pw)))
    if exact:
        pads = [ph, ph + extra[0], pw, pw + extra[1]]
        y = lw.b.call(op_type, xs, kernel=list(kernel), stride=list(stride), padding=pads)
        return lw.call("Transpose", y, node=node, perm=_NCHW)
    full = (h + 2 * ph + extra[0], w + 2 * pw + extra[1])
    mask = np.zeros((1, *full, 1), x.type.dtype.numpy)
    if counted:
        mask[:, : h + 2 * ph, : w + 2 * pw] = 1
    else:
        mask[:, ph : ph + h, pw : pw + w] = 1
    xp = lw.b.call("Pad", xs, axis=1, before=ph, after=ph + extra[0], name=f"{node.name}_h")
    xp = lw.b.call("Pad", xp, axis=2, before=pw, after=pw + extra[1], name=f"{node.name}_w")
    window = dict(kernel=list(kernel), stride=list(stride))
    total = lw.b.call("AvgPool2D", xp, name=f"{node.name}_sum", **window)
    count = lw.b.call("AvgPool2D", lw.lifted(mask, f"{node.name}_counted"), **window)
    y = lw.b.call("Div", total, count, name=f"{node.name}_mean")
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
    if divisor is not None:
        raise Unsupported("divisor_override")
    return _pool("AvgPool2D", lw, node, kernel, stride, padding, ceil_mode, count_include_pad)


def _adaptive_avg_pool1d(lw: Lowering, node):
    """Windows of ``L / out`` (it must divide): a 1-d average pooling as a 2-d one."""
    x = lw.value(node.args[0])
    (out,) = node.args[1]
    n, c, length = x.type.shape
    if length % out:
        raise Unsupported(f"adaptive pooling of {length} into {out} (uneven windows)")
    if out == 1:
        return lw.call("ReduceMean", x, node=node, axes=(2,), keepdims=True)
    rows = lw.b.call("Transpose", x, perm=(0, 2, 1), name=f"{node.name}_rows")
    image = lw.b.call("Reshape", rows, shape=(n, 1, length, c), name=f"{node.name}_nhwc")
    k = length // out
    y = lw.b.call("AvgPool2D", image, kernel=[1, k], stride=[1, k], name=f"{node.name}_pool")
    y = lw.b.call("Reshape", y, shape=(n, out, c), name=f"{node.name}_pooled")
    return lw.call("Transpose", y, node=node, perm=(0, 2, 1))


TABLE: dict[str, Callable[[Lowering, Any], Any]] = {
    "aten.convolution.default": _convolution,
    "aten._native_batch_norm_legit_no_training.default": _batch_norm,
    "aten.max_pool2d_with_indices.default": _max_pool,
    "aten.avg_pool2d.default": _avg_pool,
    "aten.adaptive_avg_pool1d.default": _adaptive_avg_pool1d,
}
