"""2-D convolution and pooling, NHWC (seed 004's spatial-sharding example).

``Conv2D(x, w)``: ``x`` is ``(N, H, W, Cin)``, ``w`` is ``(Kh, Kw, Cin / groups, Cout)``,
``stride`` ``[Sh, Sw]`` (default 1), ``dilation`` ``[Dh, Dw]`` (default 1: a dilated kernel
reads every Dh-th row, spanning ``(Kh - 1) * Dh + 1`` rows), ``groups`` (default 1: the
channels split into ``groups`` groups convolved apart; ``groups = Cin`` is a depthwise
convolution). ``padding`` is ``"valid"`` (no padding), ``"same"`` (the zeros a stride-1
window needs to keep H, W; the extra row or column of an even kernel goes at the bottom /
right), or explicit zero rows and columns ``[top, bottom, left, right]`` (what a
spatially sharded device uses at the edges of the whole image). Output
``H' = (H + top + bottom - (Kh - 1) * Dh - 1) // Sh + 1``.

Sharding: batch and output channels split; input channels give a partial sum;
height or width split with a halo exchange (``ir.sharding.halo``), at any stride. A
grouped convolution splits over the batch and the image only.
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


def conv_stride(stride) -> tuple[int, int]:
    """(Sh, Sw) of a stride attribute (an int or a pair)."""
    pair = (stride, stride) if isinstance(stride, int) else tuple(stride)
    if len(pair) != 2 or min(pair) < 1:
        raise TypeRuleError(f"stride must be a positive integer or [Sh, Sw], got {stride!r}")
    return int(pair[0]), int(pair[1])


Geometry = tuple[tuple[int, int], tuple[int, int], tuple[int, int, int, int]]


def conv_dilation(attributes) -> tuple[int, int]:
    """(Dh, Dw) of a window op (pooling has no dilation: 1)."""
    return conv_stride(attributes.get("dilation", 1))


def spanned(kernel: tuple[int, int], dilation: tuple[int, int]) -> tuple[int, int]:
    """The rows and columns a dilated kernel spans."""
    return ((kernel[0] - 1) * dilation[0] + 1, (kernel[1] - 1) * dilation[1] + 1)


def window_geometry(attributes, kernel: tuple[int, int] | None = None) -> Geometry:
    """``((Kh, Kw), (Sh, Sw), (top, bottom, left, right))`` of a window op: ``kernel``
    given (a convolution's, from its weight's shape) or its ``kernel`` attribute (pooling);
    a ``stride`` of None steps by the kernel; "same" pads for the dilated kernel's span."""
    kh, kw = conv_stride(attributes["kernel"]) if kernel is None else kernel
    stride = attributes["stride"]
    sh, sw = (kh, kw) if stride is None else conv_stride(stride)
    eh, ew = spanned((kh, kw), conv_dilation(attributes))
    return (kh, kw), (sh, sw), conv_pads(attributes["padding"], eh, ew)


def windows(
    x: np.ndarray, geometry: Geometry, fill: float = 0.0, dilation: tuple[int, int] = (1, 1)
) -> np.ndarray:
    """The windows of ``x`` (N, H, W, C) padded with ``fill``, one every stride, each
    reading every ``dilation``-th row and column: ``(N, H', W', C, Kh, Kw)``."""
    kernel, (sh, sw), (top, bottom, left, right) = geometry
    xp = np.pad(x, ((0, 0), (top, bottom), (left, right), (0, 0)), constant_values=fill)
    view = np.lib.stride_tricks.sliding_window_view(xp, spanned(kernel, dilation), axis=(1, 2))
    return view[:, ::sh, ::sw, :, :: dilation[0], :: dilation[1]]


def _conv_types(c: TypeContext):
    x, w = tensor(c, 0, "x"), tensor(c, 1, "w")
    same_dtype(x, w)
    if x.rank != 4 or w.rank != 4:
        raise TypeRuleError(
            f"Conv2D needs x (N, H, W, Cin) and w (Kh, Kw, Cin / groups, Cout), got {x} {w}"
        )
    n, h, wd, cin = x.shape
    kh, kw, wcin, cout = w.shape
    g = c.attributes["groups"]
    if wcin * g != cin or cout % g:
        raise TypeRuleError(
            f"x has {cin} input channels and w {wcin} per group of {g} with {cout} outputs: "
            "groups must divide both channel counts and w hold Cin / groups"
        )
    (sh, sw), (top, bottom, left, right) = window_geometry(c.attributes, (kh, kw))[1:]
    eh, ew = spanned((kh, kw), conv_dilation(c.attributes))
    if h + top + bottom < eh or wd + left + right < ew:
        raise TypeRuleError(f"a {eh}x{ew} (dilated) kernel does not fit a padded {h}x{wd} image")
    ho, wo = (h + top + bottom - eh) // sh + 1, (wd + left + right - ew) // sw + 1
    return [x.with_shape((n, ho, wo, cout))]


def grouped(patches: np.ndarray, groups: int) -> np.ndarray:
    """``(N, H', W', C, Kh, Kw)`` windows as ``(N, H', W', groups, C / groups, Kh, Kw)``."""
    n, h, w, c, kh, kw = patches.shape
    return patches.reshape(n, h, w, groups, c // groups, kh, kw)


def _conv_kernel(xs, a):
    x, w = xs
    patches = windows(x, window_geometry(a, w.shape[:2]), dilation=conv_dilation(a))
    g = a["groups"]
    if g == 1:  # one product of im2col rows with the kernel (BLAS)
        y = np.tensordot(patches, w, axes=([3, 4, 5], [2, 0, 1]))
        return [y.astype(x.dtype)]
    kh, kw, cg, cout = w.shape
    wg = w.reshape(kh, kw, cg, g, cout // g)
    y = np.einsum("nhwgcij,ijcgo->nhwgo", grouped(patches, g), wg, optimize=True)
    return [y.reshape(*y.shape[:3], cout).astype(x.dtype)]


def _conv_cost(c: CostContext) -> Cost:
    x, w = c.input_types
    (y,) = c.output_types
    flops = 2.0 * y.num_elements * w.shape[0] * w.shape[1] * w.shape[2]
    n, ho, wo, cout = y.shape
    g = c.attributes.get("groups", 1)  # one implicit GEMM per group
    gemm = (g, n * ho * wo, cout // g, w.shape[0] * w.shape[1] * w.shape[2])
    return Cost(flops, x.size_bytes + w.size_bytes, y.size_bytes, matrix_flops=flops, gemms=(gemm,))


_CONV_ATTRIBUTES = (
    Attr(
        "padding",
        "valid",
        '"valid", "same" or [top, bottom, left, right]',
        kind=kinds.either(kinds.one_of("valid", "same"), kinds.PADS),
    ),
    Attr(
        "stride",
        1,
        "window step: one for both axes, or [Sh, Sw]",
        kind=kinds.either(kinds.POS_INT, kinds.sequence_of(kinds.POS_INT, 2)),
    ),
    Attr(
        "dilation",
        1,
        "kernel step: one for both axes, or [Dh, Dw]",
        kind=kinds.either(kinds.POS_INT, kinds.sequence_of(kinds.POS_INT, 2)),
    ),
    Attr("groups", 1, "channel groups convolved apart (Cin: depthwise)", kind=kinds.POS_INT),
)

register_op(
    OpDef(
        name="Conv2D",
        operands=("x", "w"),
        results=("y",),
        type_rule=_conv_types,
        kernel=_conv_kernel,
        cost_rule=_conv_cost,
        attributes=_CONV_ATTRIBUTES,
        aliases=("conv2d",),
        doc="2-D convolution, NHWC with (Kh, Kw, Cin / groups, Cout) weights.",
        extra={
            "weight_operands": (1,),  # the kernel is a weight
            "examples": lambda s: [
                ctx(t(1, 3 + s, 5, 3), t(3, 3, 3, 2 * s)),
                ctx(t(s, 4, 4 * s, 2), t(3, 2, 2, 3), padding="same"),
                ctx(t(1, 2 * s, 3, 1), t(2, 2, 1, 1), padding=(1, 0, 0, 1)),
                ctx(t(1, 4 * s, 5, 2), t(3, 3, 2, 2), padding=(1, 1, 1, 1), stride=(2, 2)),
                ctx(t(2, 3 + s, 6, 4), t(3, 2, 2, 6), groups=2, dilation=(1, 2)),
                ctx(t(1, 5, 2 + 2 * s, 3), t(3, 3, 1, 3), groups=3, padding="same"),
            ],
        },
    )
)

# -- sharding rules ------------------------------------------------------------------


def _conv_sharding(c: TypeContext) -> dict:
    halo = window_halos(
        window_geometry(c.attributes, c.input_types[1].shape[:2]), conv_dilation(c.attributes)
    )
    if c.attributes["groups"] != 1:  # a channel shard would hold pieces of groups
        return rule([("n", None, None, None), (None,) * 4], [("n", None, None, None)], halo=halo)
    return rule(
        [("n", None, None, "ci"), (None, None, "ci", "co")],
        [("n", None, None, "co")],
        reduce={"ci": "sum"},
        linear=[(0,), (1,)],
        halo=halo,
    )


def window_halos(geometry: Geometry, dilation: tuple[int, int] = (1, 1)) -> list[dict]:
    """The ``halo`` list of a sliding-window op's sharding rule: rows (axis 1) and columns
    (axis 2), each window the rows a (dilated) kernel spans; a device's op gets its own
    zeros before and after in ``padding``."""
    kernel, (sh, sw), (top, bottom, left, right) = geometry
    kh, kw = spanned(kernel, dilation)

    def rows_pads(attrs, pad_top: int, pad_bottom: int) -> dict:
        return {**dict(attrs), "padding": [pad_top, pad_bottom, left, right]}

    def columns_pads(attrs, pad_left: int, pad_right: int) -> dict:
        return {**dict(attrs), "padding": [top, bottom, pad_left, pad_right]}

    return [
        window_axis(1, kh, sh, (top, bottom), rows_pads),
        window_axis(2, kw, sw, (left, right), columns_pads),
    ]


def window_axis(axis: int, window: int, stride: int, pads: tuple[int, int], local) -> dict:
    """One window axis of a sliding-window op's sharding rule (its ``halo`` list): operand 0's
    and the result's ``axis``, the window and its step, the zeros before and after, and
    ``local(attributes, zeros_before, zeros_after)``: a device's op attributes."""
    return {
        "operand": 0,
        "axis": axis,
        "result_axis": axis,
        "window": window,
        "stride": stride,
        "pads": pads,
        "local_attributes": local,
    }


attach_rule("Conv2D", "sharding_rule", _conv_sharding)


# -- pooling -------------------------------------------------------------------------
# MaxPool2D and AvgPool2D: NHWC windows of ``kernel`` rows and columns every ``stride``,
# explicit ``padding`` [top, bottom, left, right] (-inf for max, zeros counted in the
# average as torch's ``count_include_pad``). Batch and channels split freely; height
# or width split with a halo exchange, as Conv2D.


def _pool_types(c: TypeContext):
    x = tensor(c, 0, "x")
    if x.rank != 4:
        raise TypeRuleError(f"pooling needs x (N, H, W, C), got {x}")
    (kh, kw), (sh, sw), (top, bottom, left, right) = window_geometry(c.attributes)
    n, h, w, ch = x.shape
    if h + top + bottom < kh or w + left + right < kw:
        raise TypeRuleError(f"a {kh}x{kw} window does not fit a padded {h}x{w} image")
    ho, wo = (h + top + bottom - kh) // sh + 1, (w + left + right - kw) // sw + 1
    return [x.with_shape((n, ho, wo, ch))]


def _pool_kernel(reduce, fill: float):
    def kernel(xs, a):
        (x,) = xs
        return [reduce(windows(x, window_geometry(a), fill), axis=(-2, -1)).astype(x.dtype)]

    return kernel


def _pool_cost(c: CostContext) -> Cost:
    (x,) = c.input_types
    (y,) = c.output_types
    kh, kw = conv_stride(c.attributes["kernel"])
    return Cost(float(y.num_elements * kh * kw), x.size_bytes, y.size_bytes)


def _pool_sharding(c: TypeContext) -> dict:
    return rule(
        [("n", None, None, "c")],
        [("n", None, None, "c")],
        halo=window_halos(window_geometry(c.attributes)),
    )


_POOL_ATTRIBUTES = (
    Attr(
        "kernel",
        doc="window: one size for both axes, or [Kh, Kw]",
        kind=kinds.either(kinds.POS_INT, kinds.sequence_of(kinds.POS_INT, 2)),
    ),
    Attr(
        "stride",
        None,
        "window step (None: the kernel), one for both axes or [Sh, Sw]",
        kind=kinds.optional(kinds.either(kinds.POS_INT, kinds.sequence_of(kinds.POS_INT, 2))),
    ),
    Attr(
        "padding",
        "valid",
        '"valid" or [top, bottom, left, right]',
        kind=kinds.either(kinds.one_of("valid"), kinds.PADS),
    ),
)

for _name, _reduce, _fill, _what in (
    ("MaxPool2D", np.max, -np.inf, "largest"),
    ("AvgPool2D", np.mean, 0.0, "mean"),
):
    register_op(
        OpDef(
            name=_name,
            operands=("x",),
            results=("y",),
            type_rule=_pool_types,
            kernel=_pool_kernel(_reduce, _fill),
            cost_rule=_pool_cost,
            attributes=_POOL_ATTRIBUTES,
            doc=f"The {_what} value of each window of x (N, H, W, C), per channel.",
            extra={
                "examples": lambda s: [
                    ctx(t(1, 4 * s, 4, 2), kernel=2),
                    ctx(t(s, 5, 7, 3), kernel=3, stride=2, padding=(1, 1, 1, 1)),
                ]
            },
        )
    )
    attach_rule(_name, "sharding_rule", _pool_sharding)
