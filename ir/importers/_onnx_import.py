"""The importer's op table: each standard ONNX op as registry op(s), and the graph walk.

``IMPORTS`` maps an ONNX op type to a function that adds the registry op(s)
computing it to a :class:`Reader`'s builder. Operands that ONNX passes as
constants but the registry keeps as attributes (``STATIC``: shapes, axes,
exponents) are read from initializers or ``Constant`` nodes.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

from ..builder import FunctionBuilder
from ..errors import DistIRError
from ..types import DType, TensorType
from ..value import Value
from ._onnx_export import SAME_NAMES, _error, dtype_of

# Operand positions that must be constants and become attributes.
STATIC = {
    "Reshape": (1,),
    "Expand": (1,),
    "Slice": (1, 2, 3, 4),
    "ReduceSum": (1,),
    "ReduceMean": (1,),
    "Pow": (1,),
}


def _identifier(name: str) -> str:
    out = re.sub(r"\W", "_", name) or "v"
    return f"v_{out}" if out[0].isdigit() else out


class Reader:
    """Builds the registry program of an ONNX graph (annotations are read elsewhere)."""

    def __init__(self, onnx, model, where: str) -> None:
        self.onnx = onnx
        self.graph = model.graph
        self.where = where
        self.b = FunctionBuilder(_identifier(self.graph.name or "onnx_model"))
        self.values: dict[str, Value] = {}  # ONNX tensor name -> value
        self.constants: dict[str, np.ndarray] = {}
        self.taken: set[str] = set()

    def ir_name(self, onnx_name: str) -> str:
        base = _identifier(onnx_name)
        name, k = base, 1
        while name in self.taken:
            name, k = f"{base}_{k}", k + 1
        self.taken.add(name)
        return name

    def array(self, tensor) -> np.ndarray:
        return self.onnx.numpy_helper.to_array(tensor)

    def static(self, node, i: int) -> np.ndarray | None:
        if i >= len(node.input) or not node.input[i]:
            return None
        name = node.input[i]
        if name not in self.constants:
            raise _error(
                f"node {node.name or node.op_type!r} input {i} ({name!r}) must be a constant "
                f"(an initializer or a Constant node) for {node.op_type}"
            )
        return self.constants[name]

    def tensor(self, name: str) -> Value:
        if name not in self.values:  # a uniform constant: a Constant op at first use
            array = self.constants[name]
            first = array.reshape(-1)[0].item() if array.size else 0
            self.values[name] = self.b.call(
                "Constant",
                value=first,
                shape=tuple(array.shape),
                dtype=DType.from_numpy(array.dtype).value,
                device=0,
                name=self.ir_name(name),
            )
        return self.values[name]

    def call(self, op_type: str, *inputs: Value, node=None, out: int = 0, **attrs) -> Value:
        name = self.ir_name(node.output[out]) if node is not None else "t"
        return self.b.call(op_type, *inputs, name=name, **attrs)

    def _constant_node(self, node) -> np.ndarray:
        attr = node.attribute[0]
        value = self.onnx.helper.get_attribute_value(attr)
        if attr.name == "value":
            return self.array(value)
        return np.asarray(value, np.float32 if "float" in attr.name else np.int64)

    def build(self) -> tuple[Any, dict[str, np.ndarray]]:
        graph = self.graph
        initializers = {t.name: self.array(t) for t in graph.initializer}
        self.constants.update(initializers)
        for node in graph.node:
            if node.op_type == "Constant":
                self.constants[node.output[0]] = self._constant_node(node)
        tensor_uses = {o.name for o in graph.output}
        for node in graph.node:
            static = STATIC.get(node.op_type, ())
            tensor_uses.update(n for i, n in enumerate(node.input) if n and i not in static)
        weights: dict[str, np.ndarray] = {}
        declared = [(v.name, v.type.tensor_type) for v in graph.input]
        names = {n for n, _ in declared}
        declared += [(n, None) for n in initializers if n not in names and n in tensor_uses]
        declared += [
            (n, None)
            for n, a in self.constants.items()
            if n not in initializers and n in tensor_uses and not _uniform(a)
        ]
        for name, tensor_type in declared:
            if name in self.constants:
                array = self.constants[name]
                t = TensorType(tuple(array.shape), DType.from_numpy(array.dtype), 0)
            else:
                t = self._input_type(name, tensor_type)
            v = self.b.input(self.ir_name(name), t)
            self.values[name] = v
            if name in self.constants:
                weights[v.name] = self.constants[name]
        self._nodes()
        missing = [o.name for o in graph.output if o.name not in self.values]
        if missing:
            raise _error(f"{self.where}: graph outputs {missing} are computed by no node")
        outputs = [self.tensor(o.name) for o in graph.output]
        return self.b.finish(outputs), weights

    def _input_type(self, name: str, tensor_type) -> TensorType:
        dims = []
        for k, d in enumerate(tensor_type.shape.dim):
            if not d.HasField("dim_value"):
                raise _error(
                    f"{self.where}: graph input {name!r} axis {k} is symbolic "
                    f"({d.dim_param or '?'}); fix its size (onnx.tools.update_model_dims)"
                )
            dims.append(d.dim_value)
        return TensorType(tuple(dims), dtype_of(self.onnx, tensor_type.elem_type), 0)

    def _nodes(self) -> None:
        unknown: Counter = Counter()
        first: dict[str, str] = {}
        for i, node in enumerate(self.graph.node):
            if node.op_type == "Constant":
                continue
            fn = IMPORTS.get(node.op_type)
            if fn is None or node.domain not in ("", "ai.onnx"):
                unknown[node.op_type] += 1
                first.setdefault(node.op_type, node.name or f"#{i}")
                continue
            try:
                results = fn(self, node)
            except DistIRError as e:
                raise _error(f"node {node.name or f'#{i}'!r} ({node.op_type}): {e}") from None
            for name, v in zip(node.output, results):
                if name:
                    self.values[name] = v
        if unknown:
            listed = "; ".join(
                f"{op} x{n} (first: node {first[op]!r})" for op, n in unknown.items()
            )
            raise _error(
                f"{self.where}: {len(unknown)} op type(s) have no registry translation: "
                f"{listed}. The importer reads: {', '.join(sorted(IMPORTS))}"
            )


def _uniform(a: np.ndarray) -> bool:
    return a.size > 0 and bool((a == a.reshape(-1)[0]).all())


def _attrs(rd: Reader, node) -> dict[str, Any]:
    return {a.name: rd.onnx.helper.get_attribute_value(a) for a in node.attribute}


def _ins(rd: Reader, node) -> list[Value]:
    static = STATIC.get(node.op_type, ())
    return [rd.tensor(n) for i, n in enumerate(node.input) if n and i not in static]


def _same_in(op_type: str):
    return lambda rd, node: [rd.call(op_type, *_ins(rd, node), node=node)]


def _read_pow(rd, node):
    e = rd.static(node, 1)
    if e is None or e.size != 1:
        raise _error("Pow needs a constant scalar exponent")
    return [rd.call("Pow", *_ins(rd, node), node=node, exponent=float(e.reshape(-1)[0]))]


def _read_reciprocal(rd, node):
    (x,) = _ins(rd, node)
    one = rd.b.call("Constant", value=1.0, dtype=x.type.dtype.value, device=0, name="one")
    return [rd.call("Div", one, x, node=node)]


def _read_gelu(rd, node):
    (x,) = _ins(rd, node)
    if _attrs(rd, node).get("approximate", b"none") in ("tanh", b"tanh"):
        return [rd.call("Gelu", x, node=node)]
    erf = rd.b.call("Erf", rd.b.call("Scale", x, factor=1 / math.sqrt(2.0)), name="erf")
    one = rd.b.call("Constant", value=1.0, dtype=x.type.dtype.value, device=0, name="one")
    half = rd.b.call("Scale", rd.b.call("Add", erf, one), factor=0.5)
    return [rd.call("Mul", x, half, node=node)]


def _read_layer_norm(rd, node):
    a = _attrs(rd, node)
    x, gamma, *beta = _ins(rd, node)
    if a.get("axis", -1) % x.type.rank != x.type.rank - 1:
        raise _error("LayerNormalization over other than the last axis")
    if not beta:
        beta = [rd.b.call("Constant", value=0.0, shape=gamma.type.shape, device=0, name="beta")]
    y = rd.call("LayerNorm", x, gamma, beta[0], node=node, epsilon=_float32(a.get("epsilon", 1e-5)))
    return [y]


def _read_reshape(rd, node):
    (x,) = _ins(rd, node)
    shape = [int(d) for d in rd.static(node, 1)]
    shape = [x.type.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return [rd.call("Reshape", x, node=node, shape=tuple(shape))]


def _read_expand(rd, node):
    (x,) = _ins(rd, node)
    shape = tuple(np.broadcast_shapes(x.type.shape, tuple(int(d) for d in rd.static(node, 1))))
    return [rd.call("BroadcastTo", x, node=node, shape=shape)]


def _read_reduce(op_type: str):
    def read(rd, node):
        (x,) = _ins(rd, node)
        a = _attrs(rd, node)
        axes = rd.static(node, 1)
        if axes is None or not axes.size:
            if a.get("noop_with_empty_axes", 0):
                return [rd.call("Identity", x, node=node)]
            axes_t = None
        else:
            axes_t = tuple(int(v) % x.type.rank for v in axes)
        keep = bool(a.get("keepdims", 1))
        return [rd.call(op_type, x, node=node, axes=axes_t, keepdims=keep)]

    return read


def _read_slice(rd, node):
    (x,) = _ins(rd, node)
    starts, ends = rd.static(node, 1), rd.static(node, 2)
    axes = rd.static(node, 3)
    steps = rd.static(node, 4)
    axes = range(len(starts)) if axes is None else axes
    if steps is not None and any(int(s) != 1 for s in steps):
        raise _error(f"Slice steps {list(steps)}: only step 1 is read")
    y = x
    for k, (axis, start, end) in enumerate(zip(axes, starts, ends)):
        axis = int(axis) % x.type.rank
        n = x.type.shape[axis]
        start = max(0, min(n, int(start) + n if start < 0 else int(start)))
        end = max(start, min(n, int(end) + n if end < 0 else int(end)))
        last = k == len(starts) - 1
        y = (
            rd.call("Slice", y, node=node, axis=axis, start=start, end=end)
            if last
            else (rd.b.call("Slice", y, axis=axis, start=start, end=end, name="slice"))
        )
    return [y]


def _cast_to(rd, node) -> str:
    return dtype_of(rd.onnx, _attrs(rd, node)["to"]).value


def _float32(x: float) -> float:
    """The shortest decimal of an ONNX float attribute (1e-05, not 9.999999747378752e-06)."""
    return float(str(np.float32(x)))


def _read_gather(rd, node):
    table, ids = _ins(rd, node)
    if _attrs(rd, node).get("axis", 0) != 0 or table.type.rank != 2:
        raise _error("Gather other than rows of a matrix (Embedding)")
    return [rd.call("Embedding", table, ids, node=node)]


def _read_gemm(rd, node):
    a = _attrs(rd, node)
    x, w, *bias = _ins(rd, node)
    if a.get("alpha", 1.0) != 1.0 or a.get("beta", 1.0) != 1.0:
        raise _error("Gemm with alpha or beta other than 1")
    if a.get("transA", 0):
        x = rd.b.call("Transpose", x, perm=(1, 0), name="a_t")
    if a.get("transB", 0):
        w = rd.b.call("Transpose", w, perm=(1, 0), name="b_t")
    if not bias:
        return [rd.call("MatMul", x, w, node=node)]
    product = rd.b.call("MatMul", x, w, name="gemm_mm")
    return [rd.call("Add", product, bias[0], node=node)]


def _read_attention(rd, node):
    """ONNX's Attention (opset 23) as one ``Attention`` op: 4-D ``(B, H, S, D)`` operands,
    or 3-D ``(B, S, H * D)`` ones with ``q_num_heads`` and ``kv_num_heads``."""
    a = _attrs(rd, node)
    if any(node.input[4:]) or any(node.output[1:]):
        raise _error(
            "Attention with past_key/past_value or present/qk outputs (a KV cache): the "
            "importer reads the attention of whole sequences (concatenate the cache first)"
        )
    if a.get("softcap", 0.0):
        raise _error(f"Attention softcap={a['softcap']}: only softcap 0 is read")
    q, k, v, *mask = _ins(rd, node)
    flat = q.type.rank == 3
    if flat:
        if "q_num_heads" not in a or "kv_num_heads" not in a:
            raise _error("3-D Attention needs the q_num_heads and kv_num_heads attributes")
        q, k, v = (
            _split_heads(rd, x, a[h], f"{x.name}_heads")
            for x, h in ((q, "q_num_heads"), (k, "kv_num_heads"), (v, "kv_num_heads"))
        )
    sq, sk = q.type.shape[2], k.type.shape[2]
    causal = bool(a.get("is_causal", 0))
    if causal and sq != sk:
        raise _error(
            f"Attention is_causal with {sq} queries and {sk} keys: ONNX aligns that diagonal "
            "top-left, the registry's bottom-right; the importer reads is_causal for equal "
            "lengths only (pass the mask instead)"
        )
    scale = _float32(a["scale"]) if "scale" in a else None
    if not flat:
        return [rd.call("Attention", q, k, v, *mask, node=node, causal=causal, scale=scale)]
    y = rd.b.call("Attention", q, k, v, *mask, causal=causal, scale=scale, name="attention")
    b, h, s, dv = y.type.shape
    t = rd.b.call("Transpose", y, perm=(0, 2, 1, 3), name="attention_t")
    return [rd.call("Reshape", t, node=node, shape=(b, s, h * dv))]


def _split_heads(rd, x: Value, heads: int, name: str) -> Value:
    b, s, width = x.type.shape
    if heads < 1 or width % heads:
        raise _error(f"{x.name} has width {width}, not a multiple of its {heads} heads")
    r = rd.b.call("Reshape", x, shape=(b, s, heads, width // heads), name=name)
    return rd.b.call("Transpose", r, perm=(0, 2, 1, 3), name=f"{name}_t")


IMPORTS: dict[str, Callable[[Reader, Any], list[Value]]] = {
    **{name: _same_in(name) for name in SAME_NAMES},
    "Pow": _read_pow,
    "Reciprocal": _read_reciprocal,
    "Gelu": _read_gelu,
    "Softmax": lambda rd, node: [
        rd.call("Softmax", *_ins(rd, node), node=node, axis=_attrs(rd, node).get("axis", -1))
    ],
    "LayerNormalization": _read_layer_norm,
    "Transpose": lambda rd, node: [
        rd.call("Transpose", *_ins(rd, node), node=node, perm=_attrs(rd, node).get("perm"))
    ],
    "Reshape": _read_reshape,
    "Expand": _read_expand,
    "Cast": lambda rd, node: [
        rd.call("Cast", *_ins(rd, node), node=node, dtype=_cast_to(rd, node))
    ],
    "ReduceSum": _read_reduce("ReduceSum"),
    "ReduceMean": _read_reduce("ReduceMean"),
    "Slice": _read_slice,
    "Concat": lambda rd, node: [
        rd.call("Concat", *_ins(rd, node), node=node, dim=_attrs(rd, node)["axis"])
    ],
    "Gather": _read_gather,
    "GatherElements": lambda rd, node: [
        rd.call("TakeAlongAxis", *_ins(rd, node), node=node, axis=_attrs(rd, node).get("axis", 0))
    ],
    "Gemm": _read_gemm,
    "Attention": _read_attention,
}
