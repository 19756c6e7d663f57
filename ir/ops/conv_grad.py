"""Gradients of 2-D convolution and pooling (NHWC), so that conv nets train.

``Conv2DGrad(x, w, dy)`` returns ``(dw, dx)`` (the seeds' order, as ``MatMulGrad``);
``Pool2DGrad(x, dy)`` returns ``dx`` of ``MaxPool2D`` (``kind="max"``: each window's
``dy`` goes to its first largest element, as torch does) or ``AvgPool2D``
(``kind="avg"``: spread evenly over the window, zeros of the padding included). Both
take the forward op's geometry (``padding``, ``stride``; ``kernel`` for pooling).
They split over the batch (``dw`` is then a partial sum) and the channels; the spatial
axes stay whole.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .. import attr_kinds as kinds
from ..errors import TypeRuleError
from ..registry import Attr, Cost, CostContext, OpDef, TypeContext, attach_rule, register_op
from ._common import same_dtype, tensor
from ._examples import ctx, t
from ._factors import rule
from .conv import (
    _CONV_ATTRIBUTES,
    _POOL_ATTRIBUTES,
    Geometry,
    _conv_types,
    _pool_types,
    conv_dilation,
    conv_stride,
    grouped,
    window_geometry,
    windows,
)


def _check_dy(c: TypeContext, forward, dy_index: int) -> None:
    (want,) = forward(TypeContext(c.input_types[:dy_index], c.attributes, ()))
    dy = tensor(c, dy_index, "dy")
    if dy.shape != want.shape:
        raise TypeRuleError(f"dy has shape {dy.shape}, but the forward result has {want.shape}")


def _conv_grad_types(c: TypeContext):
    x, w = tensor(c, 0, "x"), tensor(c, 1, "w")
    same_dtype(x, w, tensor(c, 2, "dy"))
    _check_dy(c, _conv_types, 2)
    return [w, x]


def scatter_windows(shape, geometry: Geometry, add_window, dilation=(1, 1)):
    """The padded-input gradient: ``add_window(i, j)`` for every kernel offset, added at
    the rows and columns that offset reads (``i * Dh`` on); then the padding cut off."""
    (kh, kw), (sh, sw), (top, bottom, left, right) = geometry
    dh, dw = dilation
    n, h, w, c = shape
    dxp = None
    for i in range(kh):
        for j in range(kw):
            part = add_window(i, j)
            if dxp is None:
                dxp = np.zeros((n, h + top + bottom, w + left + right, c), part.dtype)
            ho, wo = part.shape[1:3]
            r, q = i * dh, j * dw
            dxp[:, r : r + sh * (ho - 1) + 1 : sh, q : q + sw * (wo - 1) + 1 : sw] += part
    return dxp[:, top : top + h, left : left + w]


def conv_input_gradient(shape, w: np.ndarray, dy: np.ndarray, attributes) -> np.ndarray:
    """dx of ``dy = Conv2D(x, w)`` for an ``x`` of ``shape`` (a transposed convolution)."""
    geometry = window_geometry(attributes, w.shape[:2])
    g = attributes["groups"]
    kh, kw, cg, cout = w.shape
    wg = w.reshape(kh, kw, cg, g, cout // g)
    dyg = dy.reshape(*dy.shape[:3], g, cout // g)

    def part(i: int, j: int) -> np.ndarray:
        p = np.einsum("nhwgo,cgo->nhwgc", dyg, wg[i, j], optimize=True)
        return p.reshape(*p.shape[:3], g * cg)

    return scatter_windows(shape, geometry, part, conv_dilation(attributes))


def _conv_grad_kernel(xs, a):
    x, w, dy = xs
    geometry = window_geometry(a, w.shape[:2])
    g = a["groups"]
    cout = w.shape[3]
    patches = grouped(windows(x, geometry, dilation=conv_dilation(a)), g)
    dyg = dy.reshape(*dy.shape[:3], g, cout // g)
    dw = np.einsum("nhwgcij,nhwgo->ijcgo", patches, dyg, optimize=True).reshape(w.shape)
    dx = conv_input_gradient(x.shape, w, dy, a)
    return [dw.astype(w.dtype), dx.astype(x.dtype)]


def _conv_grad_cost(c: CostContext) -> Cost:
    x, w, dy = c.input_types
    flops = 2.0 * 2.0 * dy.num_elements * w.shape[0] * w.shape[1] * w.shape[2]
    read, written = x.size_bytes + w.size_bytes + dy.size_bytes, x.size_bytes + w.size_bytes
    kh, kw, cin, cout = w.shape  # cin: per group
    g = c.attributes.get("groups", 1)
    rows = dy.num_elements // cout  # n * ho * wo
    # implicit GEMMs per group: dx from dy and w, dw from the input's windows and dy
    gemms = ((g, rows, kh * kw * cin, cout // g), (g, kh * kw * cin, cout // g, rows))
    return Cost(flops, read, written, matrix_flops=flops, gemms=gemms, launches=2)


def _forward_attributes(attributes: tuple[Attr, ...], forward: str) -> tuple[Attr, ...]:
    """The forward op's attributes (names, defaults, kinds: a gradient takes what its
    forward op takes), each documented as the forward op's."""
    return tuple(replace(a, doc=f"the forward {forward}'s {a.name}") for a in attributes)


register_op(
    OpDef(
        name="Conv2DGrad",
        operands=("x", "w", "dy"),
        results=("dw", "dx"),
        type_rule=_conv_grad_types,
        kernel=_conv_grad_kernel,
        cost_rule=_conv_grad_cost,
        attributes=_forward_attributes(_CONV_ATTRIBUTES, "Conv2D"),
        doc="Gradients of y = Conv2D(x, w) given dy: returns (dw, dx), the seeds' order.",
        extra={
            "weight_operands": (1,),
            "examples": lambda s: [
                ctx(t(1, 3 + s, 5, 3), t(3, 3, 3, 2 * s), t(1, 1 + s, 3, 2 * s)),
                ctx(
                    t(s, 6, 5, 2),
                    t(3, 3, 2, 2),
                    t(s, 3, 2, 2),
                    padding=(1, 1, 0, 1),
                    stride=(2, 2),
                ),
                ctx(t(2, 3 + s, 6, 4), t(3, 2, 2, 6), t(2, 1 + s, 4, 6), groups=2, dilation=(1, 2)),
            ],
        },
    )
)


def _pool_grad_types(c: TypeContext):
    x = tensor(c, 0, "x")
    same_dtype(x, tensor(c, 1, "dy"))
    if c.attributes["kind"] not in ("max", "avg"):
        raise TypeRuleError(f'kind must be "max" or "avg", got {c.attributes["kind"]!r}')
    _check_dy(c, _pool_types, 1)
    return [x]


def _pool_grad_kernel(xs, a):
    x, dy = xs
    geometry = window_geometry(a)
    kh, kw = geometry[0]
    if a["kind"] == "avg":
        share = dy / (kh * kw)
        return [scatter_windows(x.shape, geometry, lambda i, j: share)]
    candidates = windows(x, geometry, -np.inf)
    biggest = candidates.max(axis=(-2, -1))
    taken = np.zeros(biggest.shape, bool)
    routed = {}
    for i in range(kh):
        for j in range(kw):
            hit = (candidates[..., i, j] == biggest) & ~taken
            taken |= hit
            routed[i, j] = np.where(hit, dy, 0).astype(dy.dtype)
    return [scatter_windows(x.shape, geometry, lambda i, j: routed[i, j])]


def _pool_grad_cost(c: CostContext) -> Cost:
    x, dy = c.input_types
    kh, kw = conv_stride(c.attributes["kernel"])
    return Cost(float(dy.num_elements * kh * kw), x.size_bytes + dy.size_bytes, x.size_bytes)


register_op(
    OpDef(
        name="Pool2DGrad",
        operands=("x", "dy"),
        results=("dx",),
        type_rule=_pool_grad_types,
        kernel=_pool_grad_kernel,
        cost_rule=_pool_grad_cost,
        attributes=(
            Attr(
                "kind", doc='"max" or "avg": the forward pooling', kind=kinds.one_of("max", "avg")
            ),
            *_forward_attributes(_POOL_ATTRIBUTES, "pooling"),
        ),
        doc="Gradient of MaxPool2D or AvgPool2D (kind) of x given dy.",
        extra={
            "examples": lambda s: [
                ctx(t(1, 4 * s, 4, 2), t(1, 2 * s, 2, 2), kind="max", kernel=2),
                ctx(
                    t(s, 5, 7, 3),
                    t(s, 3, 4, 3),
                    kind="avg",
                    kernel=3,
                    stride=2,
                    padding=(1, 1, 1, 1),
                ),
            ]
        },
    )
)


# -- sharding rules ------------------------------------------------------------------
# Over the batch dw is a partial sum; over output channels dx is; input channels split
# both. Pooling's gradient splits over batch and channels.


def _conv_grad_sharding(c: TypeContext) -> dict:
    if c.attributes["groups"] != 1:  # a channel shard would hold pieces of groups
        return rule(
            [("n", None, None, None), (None,) * 4, ("n", None, None, None)],
            [(None,) * 4, ("n", None, None, None)],
            reduce={"n": "sum"},
            linear=[(2,)],
        )
    return rule(
        [("n", None, None, "ci"), (None, None, "ci", "co"), ("n", None, None, "co")],
        [(None, None, "ci", "co"), ("n", None, None, "ci")],
        reduce={"n": "sum", "co": "sum"},
        linear=[(2,)],
    )


attach_rule("Conv2DGrad", "sharding_rule", _conv_grad_sharding)
attach_rule(
    "Pool2DGrad",
    "sharding_rule",
    lambda c: rule(
        [("n", None, None, "c"), ("n", None, None, "c")], [("n", None, None, "c")], linear=[(1,)]
    ),
)


# -- gradient rules (autodiff) -------------------------------------------------------


def _conv_gradient(b, op, ins, outs, dys):
    from ._grad import gname

    (dy,) = dys
    if dy is None:
        return [None, None]
    x, w = ins
    dw, dx = b.call("Conv2DGrad", x, w, dy, **op.attributes, name=[gname(w), gname(x)])
    return [dx, dw]


def _pool_gradient(kind: str):
    def gradient(b, op, ins, outs, dys):
        from ._grad import gname

        (dy,) = dys
        if dy is None:
            return [None]
        (x,) = ins
        return [b.call("Pool2DGrad", x, dy, kind=kind, **op.attributes, name=gname(x))]

    return gradient


attach_rule("Conv2D", "gradient_rule", _conv_gradient)
attach_rule("MaxPool2D", "gradient_rule", _pool_gradient("max"))
attach_rule("AvgPool2D", "gradient_rule", _pool_gradient("avg"))
