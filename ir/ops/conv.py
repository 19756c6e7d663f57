"""2-D convolution, NHWC (seed 004's spatial-sharding example).

``Conv2D(x, w)``: ``x`` is ``(N, H, W, Cin)``, ``w`` is ``(Kh, Kw, Cin, Cout)``,
stride 1. ``padding`` is ``"valid"`` (no padding), ``"same"`` (output H, W equal
the input's; the extra row or column of an even kernel goes at the bottom /
right), or explicit zero rows and columns ``[top, bottom, left, right]`` (what
a spatially sharded device uses at the edges of the whole image).
"""

from __future__ import annotations

import numpy as np

from .. import attr_kinds as kinds
from ..errors import TypeRuleError
from ..registry import Attr, Cost, CostContext, OpDef, TypeContext, attach_rule, register_op
from ._common import same_dtype, tensor
from ._examples import ctx, t
from ._factors import rule


def conv_pads(padding, kh: int, kw: int) -> tuple[int, int, int, int]:
    """(top, bottom, left, right) zero rows/columns for a padding attribute."""
    if padding == "valid":
        return (0, 0, 0, 0)
    if padding == "same":
        return ((kh - 1) // 2, kh - 1 - (kh - 1) // 2, (kw - 1) // 2, kw - 1 - (kw - 1) // 2)
    if isinstance(padding, (tuple, list)) and len(padding) == 4:
        pads = tuple(int(p) for p in padding)
        if min(pads) < 0:
            raise TypeRuleError(f"padding {list(padding)} has a negative entry")
        return pads  # type: ignore[return-value]
    raise TypeRuleError(
        f'padding must be "valid", "same" or [top, bottom, left, right], got {padding!r}'
    )


def _conv_types(c: TypeContext):
    x, w = tensor(c, 0, "x"), tensor(c, 1, "w")
    same_dtype(x, w)
    if x.rank != 4 or w.rank != 4:
        raise TypeRuleError(f"Conv2D needs x (N, H, W, Cin) and w (Kh, Kw, Cin, Cout), got {x} {w}")
    n, h, wd, cin = x.shape
    kh, kw, wcin, cout = w.shape
    if wcin != cin:
        raise TypeRuleError(f"x has {cin} input channels, w expects {wcin}")
    top, bottom, left, right = conv_pads(c.attributes["padding"], kh, kw)
    ho, wo = h + top + bottom - kh + 1, wd + left + right - kw + 1
    if ho < 1 or wo < 1:
        raise TypeRuleError(f"a {kh}x{kw} kernel does not fit a padded {h}x{wd} image")
    return [x.with_shape((n, ho, wo, cout))]


def _conv_kernel(xs, a):
    x, w = xs
    kh, kw = w.shape[:2]
    top, bottom, left, right = conv_pads(a["padding"], kh, kw)
    xp = np.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)))
    windows = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(1, 2))
    return [np.einsum("nhwcij,ijco->nhwo", windows, w).astype(x.dtype)]


def _conv_cost(c: CostContext) -> Cost:
    x, w = c.input_types
    (y,) = c.output_types
    flops = 2.0 * y.num_elements * w.shape[0] * w.shape[1] * w.shape[2]
    return Cost(flops, x.size_bytes + w.size_bytes, y.size_bytes, matrix_flops=flops)


register_op(
    OpDef(
        name="Conv2D",
        operands=("x", "w"),
        results=("y",),
        type_rule=_conv_types,
        kernel=_conv_kernel,
        cost_rule=_conv_cost,
        attributes=(
            Attr(
                "padding",
                "valid",
                '"valid", "same" or [top, bottom, left, right]',
                kind=kinds.either(kinds.one_of("valid", "same"), kinds.PADS),
            ),
        ),
        aliases=("conv2d",),
        doc="2-D convolution, NHWC with (Kh, Kw, Cin, Cout) weights, stride 1.",
        extra={
            "examples": lambda s: [
                ctx(t(1, 3 + s, 5, 3), t(3, 3, 3, 2 * s)),
                ctx(t(s, 4, 4 * s, 2), t(3, 2, 2, 3), padding="same"),
                ctx(t(1, 2 * s, 3, 1), t(2, 2, 1, 1), padding=(1, 0, 0, 1)),
            ]
        },
    )
)

# -- sharding rules ------------------------------------------------------------------


def _conv_sharding(c: TypeContext) -> dict:
    kh, kw = c.input_types[1].shape[:2]
    top, bottom, left, right = conv_pads(c.attributes["padding"], kh, kw)

    def local_pads(attrs, pad_top: int, pad_bottom: int) -> dict:
        return {**dict(attrs), "padding": [pad_top, pad_bottom, left, right]}

    return rule(
        [("n", None, None, "ci"), (None, None, "ci", "co")],
        [("n", None, None, "co")],
        reduce={"ci": "sum"},
        linear=[(0,), (1,)],
        halo={
            "operand": 0,
            "axis": 1,
            "result_axis": 1,
            "window": kh,
            "pads": (top, bottom),
            "local_attributes": local_pads,
        },
    )


attach_rule("Conv2D", "sharding_rule", _conv_sharding)
