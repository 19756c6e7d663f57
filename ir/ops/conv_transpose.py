"""Transposed 2-D convolution (NHWC): the upsampling layer of decoders and segmentation
heads (torch's ``ConvTranspose2d``, ONNX's ``ConvTranspose``).

``ConvTranspose2D(x, w)`` is the input gradient of a ``Conv2D`` with the same weight and
attributes: ``x`` is ``(N, H, W, Cin)`` and ``w`` is ``(Kh, Kw, Cout / groups, Cin)``,
the weight of the convolution from ``Cout`` channels to ``Cin`` that it transposes (torch
and ONNX store it ``(Cin, Cout / groups, Kh, Kw)``). Each input element adds its kernel,
scaled, into the output at ``stride`` steps; ``padding`` ``[top, bottom, left, right]``
cuts rows and columns off the full result and ``output_padding`` ``[Oh, Ow]`` adds some
at the bottom and right: ``H' = (H - 1) * Sh - top - bottom + (Kh - 1) * Dh + 1 + Oh``.

Its gradients are that convolution's: ``dx = Conv2D(dy, w)`` and ``dw`` the weight
gradient of ``Conv2D(dy, w)`` against ``x`` (``Conv2DGrad``). It splits over the batch
and, without groups, over the output channels (input channels give a partial sum).
"""

from __future__ import annotations

from .. import attr_kinds as kinds
from ..errors import TypeRuleError
from ..registry import Attr, Cost, CostContext, OpDef, TypeContext, attach_rule, register_op
from ._common import same_dtype, tensor
from ._examples import ctx, t
from ._factors import rule
from .conv import _CONV_ATTRIBUTES, conv_dilation, conv_stride, spanned, window_geometry
from .conv_grad import conv_input_gradient

_PAIR = kinds.either(kinds.NONNEG_INT, kinds.sequence_of(kinds.NONNEG_INT, 2))
_ATTRIBUTES = (
    Attr(
        "padding",
        "valid",
        '"valid" or [top, bottom, left, right]: rows and columns cut off the result',
        kind=kinds.either(kinds.one_of("valid"), kinds.PADS),
    ),
    *(a for a in _CONV_ATTRIBUTES if a.name != "padding"),
    Attr("output_padding", 0, "rows and columns added at the bottom and right", kind=_PAIR),
)


def _output_padding(attributes) -> tuple[int, int]:
    v = attributes["output_padding"]
    pair = (v, v) if isinstance(v, int) else tuple(v)
    return int(pair[0]), int(pair[1])


def output_shape(x_shape, w_shape, attributes) -> tuple[int, int, int, int]:
    """``(N, H', W', Cout)`` of a transposed convolution of ``x_shape`` by ``w_shape``."""
    n, h, wd, _ = x_shape
    kh, kw, cg, _ = w_shape
    (sh, sw), (top, bottom, left, right) = window_geometry(attributes, (kh, kw))[1:]
    eh, ew = spanned((kh, kw), conv_dilation(attributes))
    oh, ow = _output_padding(attributes)
    ho = (h - 1) * sh - top - bottom + eh + oh
    wo = (wd - 1) * sw - left - right + ew + ow
    return n, ho, wo, cg * attributes["groups"]


def _types(c: TypeContext):
    x, w = tensor(c, 0, "x"), tensor(c, 1, "w")
    same_dtype(x, w)
    if x.rank != 4 or w.rank != 4:
        raise TypeRuleError(
            f"ConvTranspose2D needs x (N, H, W, Cin) and w (Kh, Kw, Cout / groups, Cin), "
            f"got {x} {w}"
        )
    g = c.attributes["groups"]
    if w.shape[3] != x.shape[3] or x.shape[3] % g:
        raise TypeRuleError(
            f"x has {x.shape[3]} channels, w's last axis {w.shape[3]}; they must agree and "
            f"divide into {g} groups"
        )
    stride, dilation = conv_stride(c.attributes["stride"]), conv_dilation(c.attributes)
    oh, ow = _output_padding(c.attributes)
    if oh >= max(stride[0], dilation[0]) or ow >= max(stride[1], dilation[1]):
        raise TypeRuleError(
            f"output_padding {[oh, ow]} must be below the stride or the dilation on each axis"
        )
    shape = output_shape(x.shape, w.shape, c.attributes)
    if min(shape[1:3]) < 1:
        raise TypeRuleError(f"padding cuts the whole {shape[1]}x{shape[2]} result away")
    return [x.with_shape(shape)]


def _kernel(xs, a):
    x, w = xs
    return [conv_input_gradient(output_shape(x.shape, w.shape, a), w, x, a).astype(x.dtype)]


def _cost(c: CostContext) -> Cost:
    x, w = c.input_types
    (y,) = c.output_types
    kh, kw, cg, cin = w.shape
    flops = 2.0 * x.num_elements * kh * kw * cg
    g = c.attributes["groups"]
    rows = x.num_elements // cin  # n * h * w: one implicit GEMM per group, as a conv's dx
    gemm = (g, rows, kh * kw * cg, cin // g)
    read = x.size_bytes + w.size_bytes
    return Cost(flops, read, y.size_bytes, matrix_flops=flops, gemms=(gemm,))


register_op(
    OpDef(
        name="ConvTranspose2D",
        operands=("x", "w"),
        results=("y",),
        type_rule=_types,
        kernel=_kernel,
        cost_rule=_cost,
        attributes=_ATTRIBUTES,
        doc="Transposed 2-D convolution, NHWC with (Kh, Kw, Cout / groups, Cin) weights.",
        extra={
            "weight_operands": (1,),
            "examples": lambda s: [
                ctx(t(1, 2 + s, 3, 3), t(3, 3, 2 * s, 3)),
                ctx(t(s, 3, 4, 2), t(2, 3, 3, 2), stride=(2, 1), padding=(1, 0, 0, 1)),
                ctx(
                    t(2, 2 + s, 3, 4),
                    t(3, 2, 1, 4),
                    stride=2,
                    dilation=(1, 2),
                    groups=2,
                    output_padding=(1, 0),
                ),
            ],
        },
    )
)


def _sharding(c: TypeContext) -> dict:
    if c.attributes["groups"] != 1:
        return rule([("n", None, None, None), (None,) * 4], [("n", None, None, None)])
    return rule(
        [("n", None, None, "ci"), (None, None, "co", "ci")],
        [("n", None, None, "co")],
        reduce={"ci": "sum"},
        linear=[(0,), (1,)],
    )


def _gradient(b, op, ins, outs, dys):
    from ._grad import gname

    (dy,) = dys
    if dy is None:
        return [None, None]
    x, w = ins
    conv = {k: v for k, v in op.attributes.items() if k != "output_padding"}
    dx = b.call("Conv2D", dy, w, **conv, name=gname(x))
    dw, _ = b.call("Conv2DGrad", dy, w, x, **conv, name=[gname(w), f"{gname(x)}_unused"])
    return [dx, dw]


attach_rule("ConvTranspose2D", "sharding_rule", _sharding)
attach_rule("ConvTranspose2D", "gradient_rule", _gradient)

__all__ = ["output_shape"]
