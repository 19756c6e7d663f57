"""The exporter's op table: each registry op as standard ONNX op(s), and the dtypes.

``EXPORTS`` maps a registry op to a function that appends its ONNX node(s) to an
:class:`Emitter`. Attributes that ONNX takes as operands (shapes, axes,
exponents) become ``Constant`` nodes; ops without a standard counterpart are
written as the few standard ops that compute them (``Rsqrt`` as ``Sqrt`` then
``Reciprocal``, ``Scale`` as ``Mul`` by a constant, ``CausalMask`` as ``Where``).
``Attention`` is ONNX's own fused ``Attention`` (opset 23: a program with one is written
at opset 23, the others at the exporter's opset 20).
The importer's table is ``_onnx_import``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..errors import DistIRError
from ..types import DType, TensorType
from ..value import Value

_ELEM = {
    DType.float32: "FLOAT",
    DType.float64: "DOUBLE",
    DType.float16: "FLOAT16",
    DType.bfloat16: "BFLOAT16",
    DType.int64: "INT64",
    DType.int32: "INT32",
    DType.bool: "BOOL",
}


def elem_type(onnx, dtype: DType) -> int:
    return getattr(onnx.TensorProto, _ELEM[dtype])


def dtype_of(onnx, elem: int) -> DType:
    for dtype, name in _ELEM.items():
        if getattr(onnx.TensorProto, name) == elem:
            return dtype
    name = onnx.TensorProto.DataType.Name(elem) if elem else "UNDEFINED"
    raise error(f"element type {name} has no DistIR dtype (one of {sorted(_ELEM.values())})")


def error(message: str) -> DistIRError:
    from .onnx import OnnxError

    return OnnxError(message)


# -- export --------------------------------------------------------------------------


class Emitter:
    """Collects the ONNX nodes of a program; helper tensors are named ``onnx::<hint>_<k>``."""

    def __init__(self, onnx, name_of: Callable[[Value], str]) -> None:
        self.onnx = onnx
        self.name_of = name_of
        self.nodes: list = []
        self.count = 0

    def fresh(self, hint: str) -> str:
        self.count += 1
        return f"onnx::{hint}_{self.count}"

    def node(self, op_type: str, inputs: list[str], outputs: list[str], **attrs) -> None:
        self.nodes.append(
            self.onnx.helper.make_node(op_type, inputs, outputs, name=outputs[0], **attrs)
        )

    def const(self, array: np.ndarray, hint: str) -> str:
        name = self.fresh(hint)
        tensor = self.onnx.numpy_helper.from_array(np.asarray(array), name)
        self.node("Constant", [], [name], value=tensor)
        return name


def _same(op_type: str):
    def emit(em: Emitter, op, ins: list[str], outs: list[str]) -> None:
        em.node(op_type, ins, outs)

    return emit


def _np(t: TensorType):
    return t.dtype.numpy


def _emit_gelu(em, op, ins, outs):
    em.node("Gelu", ins, outs, approximate="tanh")


def _emit_rsqrt(em, op, ins, outs):
    root = em.fresh("sqrt")
    em.node("Sqrt", ins, [root])
    em.node("Reciprocal", [root], outs)


def _emit_pow(em, op, ins, outs):
    e = em.const(np.asarray(op.attributes["exponent"], _np(op.inputs[0].type)), "exponent")
    em.node("Pow", [ins[0], e], outs)


def _emit_scale(em, op, ins, outs):
    f = em.const(np.asarray(op.attributes["factor"], _np(op.inputs[0].type)), "factor")
    em.node("Mul", [ins[0], f], outs)


def _emit_shape_op(op_type: str):
    def emit(em, op, ins, outs):
        shape = em.const(np.asarray(op.outputs[0].type.shape, np.int64), "shape")
        em.node(op_type, [ins[0], shape], outs)

    return emit


def _emit_reduce(op_type: str):
    def emit(em, op, ins, outs):
        rank = op.inputs[0].type.rank
        axes = op.attributes["axes"]
        axes = list(range(rank)) if axes is None else [a % rank for a in np.atleast_1d(axes)]
        a = em.const(np.asarray(axes, np.int64), "axes")
        em.node(op_type, [ins[0], a], outs, keepdims=int(bool(op.attributes["keepdims"])))

    return emit


def _emit_slice(em, op, ins, outs):
    x = op.inputs[0].type
    axis = op.attributes["axis"] % x.rank
    n = x.shape[axis]
    start = op.attributes["start"] % n if op.attributes["start"] < 0 else op.attributes["start"]
    end = start + op.outputs[0].type.shape[axis]
    parts = [em.const(np.asarray([v], np.int64), h) for v, h in ((start, "starts"), (end, "ends"))]
    em.node("Slice", [ins[0], *parts, em.const(np.asarray([axis], np.int64), "axes")], outs)


def _emit_pad(em, op, ins, outs):
    rank = op.inputs[0].type.rank
    pads = [0] * (2 * rank)
    axis = op.attributes["axis"] % rank
    pads[axis], pads[rank + axis] = op.attributes["before"], op.attributes["after"]
    operands = [ins[0], em.const(np.asarray(pads, np.int64), "pads")]
    if op.attributes["value"] != 0:
        value = np.asarray(op.attributes["value"], _np(op.inputs[0].type))
        operands.append(em.const(value, "value"))
    em.node("Pad", operands, outs)


def _nchw(em, op, ins, outs, onnx_op: str, weights: list[str], **attrs) -> None:
    """An NHWC window op as ONNX's NCHW one, between two Transposes."""
    x = em.fresh("nchw")
    em.node("Transpose", [ins[0]], [x], perm=[0, 3, 1, 2])
    y = em.fresh("nchw_out")
    em.node(onnx_op, [x, *weights], [y], **attrs)
    em.node("Transpose", [y], outs, perm=[0, 2, 3, 1])


def _window_attributes(op, kernel: tuple[int, int]) -> dict:
    from ..ops.conv import conv_dilation, window_geometry

    _, stride, (top, bottom, left, right) = window_geometry(op.attributes, kernel)
    out = {"pads": [top, left, bottom, right], "strides": list(stride)}
    if "groups" in op.attributes:  # convolutions
        out["dilations"] = list(conv_dilation(op.attributes))
        out["group"] = op.attributes["groups"]
    return out


def _emit_conv(em, op, ins, outs):
    kernel = op.inputs[1].type.shape[:2]
    w = em.fresh("oihw")
    em.node("Transpose", [ins[1]], [w], perm=[3, 2, 0, 1])
    _nchw(em, op, ins, outs, "Conv", [w], **_window_attributes(op, kernel))


def _emit_conv_transpose(em, op, ins, outs):
    from ..ops.conv_transpose import _output_padding

    kernel = op.inputs[1].type.shape[:2]
    w = em.fresh("iohw")  # (Kh, Kw, Cout / groups, Cin) -> ONNX's (Cin, Cout / groups, Kh, Kw)
    em.node("Transpose", [ins[1]], [w], perm=[3, 2, 0, 1])
    attrs = _window_attributes(op, kernel)
    attrs["output_padding"] = list(_output_padding(op.attributes))
    _nchw(em, op, ins, outs, "ConvTranspose", [w], **attrs)


_COMPARISONS = {"eq": "Equal", "lt": "Less", "le": "LessOrEqual", "gt": "Greater"}


def _emit_compare(em, op, ins, outs):
    kind = op.attributes["kind"]
    if kind == "ne":
        same = em.fresh("equal")
        em.node("Equal", ins, [same])
        em.node("Not", [same], outs)
        return
    em.node(_COMPARISONS.get(kind, "GreaterOrEqual"), ins, outs)


def _emit_power(em, op, ins, outs):
    em.node("Pow", ins, outs)


def _emit_pool(onnx_op: str, **extra):
    def emit(em, op, ins, outs):
        from ..ops.conv import conv_stride

        kernel = conv_stride(op.attributes["kernel"])
        attrs = _window_attributes(op, kernel)
        _nchw(em, op, ins, outs, onnx_op, [], kernel_shape=list(kernel), **attrs, **extra)

    return emit


def _emit_concat(em, op, ins, outs):
    if any(not isinstance(v.type, TensorType) for v in op.inputs):
        raise error(f"Concat {outs[0]!r} reads a tuple: export the logical program")
    em.node("Concat", ins, outs, axis=op.attributes["dim"])


def _emit_constant(em, op, ins, outs):
    t = op.outputs[0].type
    array = np.full(t.shape, op.attributes["value"], dtype=_np(t))
    em.node("Constant", [], outs, value=em.onnx.numpy_helper.from_array(array, outs[0]))


def _emit_softmax(em, op, ins, outs):
    """Softmax; a fused scale or causal mask (Megatron-LM's kernel) as Mul and Where first."""
    t = op.inputs[0].type
    x = ins[0]
    if op.attributes["scale"] != 1:
        f = em.const(np.asarray(op.attributes["scale"], _np(t)), "scale")
        scaled = em.fresh("scaled")
        em.node("Mul", [x, f], [scaled])
        x = scaled
    if op.attributes["causal"]:
        rows, cols = t.shape[-2:]
        above = em.const(np.triu(np.ones((rows, cols), dtype=bool), k=1), "above_diagonal")
        fill = em.const(np.asarray(-np.inf, _np(t)), "minus_infinity")
        masked = em.fresh("masked")
        em.node("Where", [above, fill, x], [masked])
        x = masked
    em.node("Softmax", [x], outs, axis=op.attributes["axis"])


def _emit_causal_mask(em, op, ins, outs):
    t = op.inputs[0].type
    rows, cols = t.shape[-2:]
    above = em.const(np.triu(np.ones((rows, cols), dtype=bool), k=1), "above_diagonal")
    fill = em.const(np.asarray(op.attributes["fill"], _np(t)), "fill")
    em.node("Where", [above, fill, ins[0]], outs)


def _emit_attention(em, op, ins, outs):
    """ONNX's Attention (opset 23). Its ``is_causal`` aligns the diagonal top-left, so a
    causal op with ``Sq != Sk`` (bottom-right) writes its mask as a constant instead."""
    from ..ops.attention import causal_keep

    q, k = op.inputs[0].type, op.inputs[1].type
    sq, sk = q.shape[2], k.shape[2]
    attrs = {} if op.attributes["scale"] is None else {"scale": float(op.attributes["scale"])}
    mask = ins[3] if len(ins) > 3 else None
    if op.attributes["causal"] and sq == sk and mask is None:
        attrs["is_causal"] = 1
    elif op.attributes["causal"]:
        keep = em.const(causal_keep(sq, sk), "causal_keep")
        if mask is None:
            mask = keep
        else:  # onnxruntime's Where selects numbers only: a bool mask becomes additive
            off = em.const(np.asarray(-np.inf, _np(q)), "off")
            if op.inputs[3].type.dtype is DType.bool:
                bias = em.fresh("mask_bias")
                em.node("Where", [mask, em.const(np.asarray(0.0, _np(q)), "on"), off], [bias])
                mask = bias
            both = em.fresh("causal_mask")
            em.node("Where", [keep, mask, off], [both])
            mask = both
    em.node("Attention", [*ins[:3], *([mask] if mask else [])], outs, **attrs)


# The opset a program needs when it has these ops (the exporter writes OPSET otherwise).
NEEDS_OPSET = {"Attention": 23}


# Ops that ONNX and the registry name alike, with the same operands and no attributes:
# exported and imported one to one.
SAME_NAMES = (
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Neg",
    "Relu",
    "Tanh",
    "Sigmoid",
    "Exp",
    "Sqrt",
    "Sin",
    "Cos",
    "Erf",
    "Identity",
    "MatMul",
    "Where",
    "Log",
    "Abs",
    "Sign",
    "Floor",
    "Ceil",
    "Round",
    "Not",
)

EXPORTS: dict[str, Callable[..., None]] = {
    **{name: _same(name) for name in SAME_NAMES},
    "Gelu": _emit_gelu,
    "Rsqrt": _emit_rsqrt,
    "Pow": _emit_pow,
    "Scale": _emit_scale,
    "Softmax": _emit_softmax,
    "LayerNorm": lambda em, op, ins, outs: em.node(
        "LayerNormalization", ins, outs, axis=-1, epsilon=float(op.attributes["epsilon"])
    ),
    "Transpose": lambda em, op, ins, outs: em.node(
        "Transpose",
        ins,
        outs,
        perm=list(op.attributes["perm"] or reversed(range(op.inputs[0].type.rank))),
    ),
    "Reshape": _emit_shape_op("Reshape"),
    "BroadcastTo": _emit_shape_op("Expand"),
    "Cast": lambda em, op, ins, outs: em.node(
        "Cast", ins, outs, to=elem_type(em.onnx, op.outputs[0].type.dtype)
    ),
    "ReduceSum": _emit_reduce("ReduceSum"),
    "ReduceMean": _emit_reduce("ReduceMean"),
    "ReduceMax": _emit_reduce("ReduceMax"),
    "ReduceMin": _emit_reduce("ReduceMin"),
    "Maximum": lambda em, op, ins, outs: em.node("Max", ins, outs),
    "Minimum": lambda em, op, ins, outs: em.node("Min", ins, outs),
    "Compare": _emit_compare,
    "Logical": lambda em, op, ins, outs: em.node(op.attributes["kind"].capitalize(), ins, outs),
    "Power": _emit_power,
    "ConvTranspose2D": _emit_conv_transpose,
    "Slice": _emit_slice,
    "Pad": _emit_pad,
    "Conv2D": _emit_conv,
    "MaxPool2D": _emit_pool("MaxPool"),
    "AvgPool2D": _emit_pool("AveragePool", count_include_pad=1),
    "Concat": _emit_concat,
    "Embedding": lambda em, op, ins, outs: em.node("Gather", ins, outs, axis=0),
    "TakeAlongAxis": lambda em, op, ins, outs: em.node(
        "GatherElements", ins, outs, axis=op.attributes["axis"]
    ),
    "Constant": _emit_constant,
    "CausalMask": _emit_causal_mask,
    "Attention": _emit_attention,
}


from ._onnx_llama import LLAMA_EXPORTS, LLAMA_OPSET  # noqa: E402  (RMSNorm, Rotary, ...)

EXPORTS.update(LLAMA_EXPORTS)
NEEDS_OPSET.update(LLAMA_OPSET)


def export_op(em: Emitter, op) -> None:
    ins = [em.name_of(v) for v in op.inputs]
    outs = [em.name_of(v) for v in op.outputs]
    EXPORTS[op.op_type](em, op, ins, outs)
