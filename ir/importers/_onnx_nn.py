"""ONNX rules for network layers: convolutions, pooling, normalisations, ``Resize``.

ONNX lays images out NCHW, the registry's window ops NHWC: each convolution or pooling
is wrapped in two ``Transpose`` s, and its weight is transposed to the registry's
layout. One-dimensional convolutions and poolings are the two-dimensional ones on an
image of height 1; three-dimensional ones are refused. Normalisations are written with
the reductions and pointwise ops (``LayerNormalization`` over the last axis is the
registry's ``LayerNorm``), ``LRN`` with shifted slices of the squares.
"""

from __future__ import annotations

import math

import numpy as np

from ._onnx_rules import Refused, Rule, attr, axis_of, float32, known_attributes, scalar

_NHWC, _NCHW = (0, 2, 3, 1), (0, 3, 1, 2)


def _spatial(rd, node, x) -> int:
    dims = x.type.rank - 2
    if dims not in (1, 2):
        raise Refused(f"{dims}-d images (the registry's window ops are 2-d; 1-d is read as 2-d)")
    return dims


def _pairs(values, dims: int, default: int, lead: int = 1) -> list[int]:
    """Two values per image axis: a 1-d image's are ``[lead, value]`` (its height is 1)."""
    values = list(values) if values else [default] * dims
    return [lead, *values] if dims == 1 else values


def _auto_pads(mode: str, size: int, kernel: int, stride: int, dilation: int) -> tuple[int, int]:
    span = (kernel - 1) * dilation + 1
    total = max((-(-size // stride) - 1) * stride + span - size, 0)
    small = total // 2
    return (small, total - small) if mode == "SAME_UPPER" else (total - small, small)


def _window(rd, node, x, kernel: list[int], dims: int):
    """(strides, dilations, [top, bottom, left, right]) of a conv or pool node, 2-d."""
    strides = _pairs(attr(rd, node, "strides"), dims, 1)
    dilations = _pairs(attr(rd, node, "dilations"), dims, 1)
    mode = attr(rd, node, "auto_pad", "NOTSET")
    sizes = [1, *x.type.shape[2:]] if dims == 1 else list(x.type.shape[2:])
    if mode in ("SAME_UPPER", "SAME_LOWER"):
        pairs = [_auto_pads(mode, *a) for a in zip(sizes, kernel, strides, dilations)]
    elif mode in ("NOTSET", "VALID"):
        pads = attr(rd, node, "pads") if mode == "NOTSET" else None
        pads = list(pads) if pads else [0] * (2 * dims)
        pairs = list(zip(pads[:dims], pads[dims:]))
        pairs = [(0, 0), *pairs] if dims == 1 else pairs
    else:
        raise Refused(f"auto_pad {mode!r}")
    if min(min(p) for p in pairs) < 0:
        raise Refused("negative pads")
    return strides, dilations, [pairs[0][0], pairs[0][1], pairs[1][0], pairs[1][1]]


def _to_nhwc(rd, x, dims: int):
    if dims == 1:
        n, c, length = x.type.shape
        x = rd.b.call("Reshape", x, shape=(n, c, 1, length), name="image")
    return rd.b.call("Transpose", x, perm=_NHWC, name="nhwc")


def _from_nhwc(rd, y, dims: int, bias=None):
    if bias is not None:
        y = rd.b.call("Add", y, bias, name="biased")
    if dims == 2:
        return rd.call("Transpose", y, perm=_NCHW)
    y = rd.b.call("Transpose", y, perm=_NCHW, name="nchw")
    n, c, _, length = y.type.shape
    return rd.call("Reshape", y, shape=(n, c, length))


def _weight(rd, w, dims: int, perm=(2, 3, 1, 0)):
    if dims == 1:
        a, b, k = w.type.shape
        w = rd.b.call("Reshape", w, shape=(a, b, 1, k), name="kernel2d")
    return rd.b.call("Transpose", w, perm=perm, name="hwio")


def _conv(rd, node):
    known_attributes(node, "auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")
    x, w, bias = rd.input(node, 0), rd.input(node, 1), rd.input(node, 2)
    dims = _spatial(rd, node, x)
    kernel = _pairs(w.type.shape[2:], dims, 1)
    strides, dilations, pads = _window(rd, node, x, kernel, dims)
    y = rd.b.call(
        "Conv2D",
        _to_nhwc(rd, x, dims),
        _weight(rd, w, dims),
        padding=pads,
        stride=strides,
        dilation=dilations,
        groups=attr(rd, node, "group", 1),
        name="conv",
    )
    return [_from_nhwc(rd, y, dims, bias)]


def _conv_transpose(rd, node):
    x, w, bias = rd.input(node, 0), rd.input(node, 1), rd.input(node, 2)
    dims = _spatial(rd, node, x)
    kernel = _pairs(w.type.shape[2:], dims, 1)
    strides = _pairs(attr(rd, node, "strides"), dims, 1)
    dilations = _pairs(attr(rd, node, "dilations"), dims, 1)
    extra = _pairs(attr(rd, node, "output_padding"), dims, 0, lead=0)
    sizes = [1, *x.type.shape[2:]] if dims == 1 else list(x.type.shape[2:])
    full = [s * (n - 1) + (k - 1) * d + 1 for s, n, k, d in zip(strides, sizes, kernel, dilations)]
    mode = attr(rd, node, "auto_pad", "NOTSET")
    wanted = attr(rd, node, "output_shape")
    pads = attr(rd, node, "pads")
    if pads is None and mode in ("SAME_UPPER", "SAME_LOWER"):
        wanted = wanted or [n * s for n, s in zip(x.type.shape[2:], strides[-dims:])]
        wanted = _pairs(wanted, dims, 1)
        pairs = []
        for f, o, want in zip(full, extra, wanted):
            total = f + o - want
            if total < 0:
                raise Refused("an output_shape larger than the full transposed convolution")
            small = total // 2
            pairs.append((small, total - small) if mode == "SAME_UPPER" else (total - small, small))
        extra = [0, 0]
    else:
        pads = list(pads) if pads else [0] * (2 * dims)
        pairs = list(zip(pads[:dims], pads[dims:]))
        pairs = [(0, 0), *pairs] if dims == 1 else pairs
        if wanted:  # the rows beyond the padded result are output padding
            wanted = _pairs(wanted, dims, 1)
            extra = [want - (f - a - b) for want, f, (a, b) in zip(wanted, full, pairs)]
    y = rd.b.call(
        "ConvTranspose2D",
        _to_nhwc(rd, x, dims),
        _weight(rd, w, dims),
        padding=[pairs[0][0], pairs[0][1], pairs[1][0], pairs[1][1]],
        stride=strides,
        dilation=dilations,
        groups=attr(rd, node, "group", 1),
        output_padding=extra,
        name="deconv",
    )
    return [_from_nhwc(rd, y, dims, bias)]


def _per_channel(rd, v, rank: int):
    return rd.b.call("Reshape", v, shape=(v.type.shape[0],) + (1,) * (rank - 2), name="channel")


def _batch_norm(rd, node):
    if attr(rd, node, "training_mode", 0) or any(node.output[1:]):
        raise Refused("training mode (batch statistics): export the model in eval mode")
    x, scale, bias, mean, var = (rd.input(node, i) for i in range(5))
    eps = float32(attr(rd, node, "epsilon", 1e-5))
    rank = x.type.rank
    rstd = rd.b.call("Rsqrt", rd.b.call("Add", var, scalar(rd, eps, var)), name="rstd")
    y = rd.b.call("Sub", x, _per_channel(rd, mean, rank), name="centred")
    y = rd.b.call("Mul", y, _per_channel(rd, rstd, rank), name="normed")
    y = rd.b.call("Mul", y, _per_channel(rd, scale, rank), name="scaled")
    return [rd.call("Add", y, _per_channel(rd, bias, rank))]


def normalised(rd, x, axes: tuple[int, ...], eps: float):
    """``(x - mean) * rsqrt(var + eps)`` over ``axes``, and the mean and 1 / std."""
    mean = rd.b.call("ReduceMean", x, axes=axes, keepdims=True, name="mean")
    centred = rd.b.call("Sub", x, mean, name="centred")
    var = rd.b.call("ReduceMean", rd.b.call("Mul", centred, centred), axes=axes, keepdims=True)
    rstd = rd.b.call("Rsqrt", rd.b.call("Add", var, scalar(rd, eps, x)), name="rstd")
    return rd.b.call("Mul", centred, rstd, name="normed"), mean, rstd


def _instance_norm(rd, node):
    x, scale, bias = rd.inputs(node)
    y, _, _ = normalised(
        rd, x, tuple(range(2, x.type.rank)), float32(attr(rd, node, "epsilon", 1e-5))
    )
    y = rd.b.call("Mul", y, _per_channel(rd, scale, x.type.rank), name="scaled")
    return [rd.call("Add", y, _per_channel(rd, bias, x.type.rank))]


def _group_norm(rd, node):
    x, scale, bias = rd.inputs(node)
    g = attr(rd, node, "num_groups")
    n, c, *rest = x.type.shape
    if c % g:
        raise Refused(f"{c} channels in {g} groups")
    grouped = rd.b.call("Reshape", x, shape=(n, g, c // g, *rest), name="groups")
    eps = float32(attr(rd, node, "epsilon", 1e-5))
    y, _, _ = normalised(rd, grouped, tuple(range(2, grouped.type.rank)), eps)
    if rd.version(node) < 21:  # scale and bias per group
        per = (g,) + (1,) * (grouped.type.rank - 2)
        y = rd.b.call("Mul", y, rd.b.call("Reshape", scale, shape=per), name="scaled")
        y = rd.b.call("Add", y, rd.b.call("Reshape", bias, shape=per), name="shifted")
        return [rd.call("Reshape", y, shape=x.type.shape)]
    y = rd.b.call("Reshape", y, shape=x.type.shape, name="ungrouped")
    y = rd.b.call("Mul", y, _per_channel(rd, scale, x.type.rank), name="scaled")
    return [rd.call("Add", y, _per_channel(rd, bias, x.type.rank))]


def _layer_norm(rd, node):
    x, scale, bias = rd.input(node, 0), rd.input(node, 1), rd.input(node, 2)
    rank = x.type.rank
    axis = axis_of(attr(rd, node, "axis", -1), rank)
    eps = float32(attr(rd, node, "epsilon", 1e-5))
    if not x.type.dtype.is_float:
        raise Refused(f"a {x.type.dtype.value} input")
    axes = tuple(range(axis, rank))
    normal = x.type.shape[axis:]
    if axis == rank - 1 and not any(node.output[1:]) and scale.type.shape == normal:
        beta = bias if bias is not None else rd.constant(0.0, x.type.dtype, normal)
        if beta.type.shape == normal:
            return [rd.call("LayerNorm", x, scale, beta, epsilon=eps)]
    y, mean, rstd = normalised(rd, x, axes, eps)
    y = rd.b.call("Mul", y, scale, name="scaled")
    y = rd.call("Add", y, bias) if bias is not None else rd.call("Identity", y)
    return [y, rd.call("Identity", mean, out=1), rd.call("Identity", rstd, out=2)][
        : len(node.output)
    ]


def _rms_norm(rd, node):
    x, scale = rd.input(node, 0), rd.input(node, 1)
    axis = axis_of(attr(rd, node, "axis", -1), x.type.rank)
    eps = float32(attr(rd, node, "epsilon", 1e-5))
    axes = tuple(range(axis, x.type.rank))
    square = rd.b.call("ReduceMean", rd.b.call("Mul", x, x), axes=axes, keepdims=True)
    rstd = rd.b.call("Rsqrt", rd.b.call("Add", square, scalar(rd, eps, x)), name="rstd")
    return [rd.call("Mul", rd.b.call("Mul", x, rstd, name="normed"), scale)]


def _lrn(rd, node):
    x = rd.input(node, 0)
    size = attr(rd, node, "size")
    alpha, beta = float32(attr(rd, node, "alpha", 1e-4)), float32(attr(rd, node, "beta", 0.75))
    bias = float32(attr(rd, node, "bias", 1.0))
    c = x.type.shape[1]
    before, after = (size - 1) // 2, math.ceil((size - 1) / 2)
    square = rd.b.call("Mul", x, x, name="square")
    padded = rd.b.call("Pad", square, axis=1, before=before, after=after, name="padded")
    window = [rd.b.call("Slice", padded, axis=1, start=k, end=k + c) for k in range(size)]
    total = window[0]
    for part in window[1:]:
        total = rd.b.call("Add", total, part, name="window")
    scaled = rd.b.call("Add", rd.b.call("Scale", total, factor=alpha / size), scalar(rd, bias, x))
    return [rd.call("Div", x, rd.b.call("Pow", scaled, exponent=beta, name="denominator"))]


def _pool(kind: str):
    def read(rd, node):
        known_attributes(
            node, "auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads", "strides",
            "storage_order", "count_include_pad",
        )  # fmt: skip
        if len(node.output) > 1 and node.output[1]:
            raise Refused("the Indices output")
        x = rd.input(node, 0)
        dims = _spatial(rd, node, x)
        kernel = _pairs(attr(rd, node, "kernel_shape"), dims, 1)
        strides, dilations, pads = _window(rd, node, x, kernel, dims)
        if dilations != [1, 1]:
            raise Refused("dilated pooling")
        sizes = [1, *x.type.shape[2:]] if dims == 1 else list(x.type.shape[2:])
        extra = [0, 0]
        if attr(rd, node, "ceil_mode", 0):
            for i, (n, k, s) in enumerate(zip(sizes, kernel, strides)):
                before, after = pads[2 * i], pads[2 * i + 1]
                out = math.ceil((n + before + after - k) / s + 1)
                if (out - 1) * s >= n + before:
                    out -= 1
                extra[i] = max((out - 1) * s + k - n - before - after, 0)
        xs = _to_nhwc(rd, x, dims)
        if kind == "max":
            grown = [pads[0], pads[1] + extra[0], pads[2], pads[3] + extra[1]]
            y = rd.b.call(
                "MaxPool2D", xs, kernel=kernel, stride=strides, padding=grown, name="pool"
            )
            return [_from_nhwc(rd, y, dims)]
        counted = attr(rd, node, "count_include_pad", 0)
        if not any(extra) and (counted or not any(pads)):
            y = rd.b.call("AvgPool2D", xs, kernel=kernel, stride=strides, padding=pads, name="pool")
            return [_from_nhwc(rd, y, dims)]
        # sum over the window / elements counted: padding counted or not, overhang never
        h, w = sizes
        full = (h + pads[0] + pads[1] + extra[0], w + pads[2] + pads[3] + extra[1])
        mask = np.zeros((1, *full, 1), x.type.dtype.numpy)
        if counted:
            mask[:, : h + pads[0] + pads[1], : w + pads[2] + pads[3]] = 1
        else:
            mask[:, pads[0] : pads[0] + h, pads[2] : pads[2] + w] = 1
        key = f"{node.output[0]}::counted"
        rd.constants[key] = mask
        xp = rd.b.call("Pad", xs, axis=1, before=pads[0], after=pads[1] + extra[0])
        xp = rd.b.call("Pad", xp, axis=2, before=pads[2], after=pads[3] + extra[1])
        total = rd.b.call("AvgPool2D", xp, kernel=kernel, stride=strides, name="pool")
        count = rd.b.call("AvgPool2D", rd.tensor(key), kernel=kernel, stride=strides)
        return [_from_nhwc(rd, rd.b.call("Div", total, count, name="mean"), dims)]

    return read


def _global_pool(op_type: str):
    def read(rd, node):
        (x,) = rd.inputs(node)
        return [rd.call(op_type, x, axes=tuple(range(2, x.type.rank)), keepdims=True)]

    return read


def _lp_norm(rd, node):
    (x,) = rd.inputs(node)
    axis = axis_of(attr(rd, node, "axis", -1), x.type.rank)
    p = attr(rd, node, "p", 2)
    if p not in (1, 2):
        raise Refused(f"p = {p}")
    size = rd.b.call("Abs", x) if p == 1 else rd.b.call("Mul", x, x)
    norm = rd.b.call("ReduceSum", size, axes=(axis,), keepdims=True, name="norm")
    if p == 2:
        norm = rd.b.call("Sqrt", norm, name="norm")
    # 0 / 0 is 0, as onnx's reference has it: divide by 1 where the norm is 0
    zero = rd.b.call("Compare", norm, scalar(rd, 0.0, norm), kind="eq", name="zero")
    safe = rd.b.call("Where", zero, scalar(rd, 1.0, norm), norm, name="safe")
    return [rd.call("Div", x, safe)]


RULES: dict[str, Rule] = {
    "Conv": Rule(_conv),
    "ConvTranspose": Rule(_conv_transpose),
    "BatchNormalization": Rule(_batch_norm, wide=True),
    "InstanceNormalization": Rule(_instance_norm, wide=True),
    "GroupNormalization": Rule(_group_norm, wide=True),
    "LayerNormalization": Rule(_layer_norm, wide=True),
    "RMSNormalization": Rule(_rms_norm, wide=True),
    "LRN": Rule(_lrn, wide=True),
    "MaxPool": Rule(_pool("max")),
    "AveragePool": Rule(_pool("avg")),
    "GlobalAveragePool": Rule(_global_pool("ReduceMean")),
    "GlobalMaxPool": Rule(_global_pool("ReduceMax")),
    "LpNormalization": Rule(_lp_norm, wide=True),
}
