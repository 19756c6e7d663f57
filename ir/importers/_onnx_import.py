"""The ONNX importer's graph walk: each node through its rule into registry ops.

:class:`Reader` declares the graph's inputs (initializers among them: the weights),
keeps what is known at import time (initializers, ``Constant`` nodes, and the results
of nodes whose every operand is known, which it folds with onnx's reference
implementation), and reads every other node with its rule in ``IMPORTS`` (the tables
of ``_onnx_math``, ``_onnx_tensor`` and ``_onnx_nn``). A node that cannot be read
(an op without a rule, a version newer than its rule knows, an attribute or operand
outside what the rule reads, a dtype DistIR lacks) is recorded with its reason and the
walk goes on: the nodes after it are still checked (on placeholders typed by ONNX's
shape inference), and one :class:`~ir.importers.onnx.OnnxError` lists them all, each
with its op type, op version, opset, count and first node. A result whose shape or
dtype differs from what ONNX's shape inference says is refused too: never a program
that computes something else.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from ..builder import FunctionBuilder
from ..errors import DistIRError
from ..types import DType, TensorType
from ..value import Value
from . import _onnx_attention, _onnx_einsum, _onnx_math, _onnx_nn, _onnx_resize, _onnx_tensor
from ._onnx_export import dtype_of, error
from ._onnx_rules import Refused, Rule, Uniform

IMPORTS: dict[str, Rule] = {
    **_onnx_math.RULES,
    **_onnx_tensor.RULES,
    **_onnx_nn.RULES,
    **_onnx_einsum.RULES,
    **_onnx_resize.RULES,
    **_onnx_attention.RULES,
}
_HALF = (DType.float16, DType.bfloat16)

# Nodes whose operands are all known are folded (evaluated at import time): shape
# arithmetic, helper constants. Not where a rule reads them and an operand is an
# initializer (a weight keeps its name and its place: a Transpose of a weight stays an
# op) or the operands are large.
FOLD_LIMIT = 1 << 16
NEVER_FOLD = frozenset(
    (
        *("RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike"),
        *("Multinomial", "Bernoulli", "If", "Loop", "Scan"),
    )
)
STANDARD = ("", "ai.onnx")


def _identifier(name: str) -> str:
    out = re.sub(r"\W", "_", name) or "v"
    return f"v_{out}" if out[0].isdigit() else out


def node_label(node, index: int) -> str:
    return repr(node.name) if node.name else f"#{index}"


def _static_type(onnx, type_proto) -> TensorType | None:
    """The TensorType of a shape-inferred value, or None when unknown or symbolic."""
    if not type_proto.HasField("tensor_type"):
        return None
    t = type_proto.tensor_type
    if not t.HasField("shape") or any(not d.HasField("dim_value") for d in t.shape.dim):
        return None
    try:
        dtype = dtype_of(onnx, t.elem_type)
    except DistIRError:
        return None
    return TensorType(tuple(d.dim_value for d in t.shape.dim), dtype, 0)


class Reader:
    """Builds the registry program of an ONNX graph (annotations are read elsewhere).

    What rules use: ``onnx``, ``b`` (the builder), :meth:`input`, :meth:`inputs`,
    :meth:`static`, :meth:`call`, :meth:`constant`, :meth:`version` and ``opset``.
    """

    def __init__(self, onnx, model, where: str, opset: int) -> None:
        self.onnx = onnx
        self.model = model
        self.graph = model.graph
        self.where = where
        self.opset = opset
        self.b = FunctionBuilder(_identifier(self.graph.name or "onnx_model"))
        self.values: dict[str, Value] = {}  # ONNX tensor name -> value
        self.constants: dict[str, np.ndarray | Uniform] = {}
        self.weights: dict[str, np.ndarray] = {}
        self.taken: set[str] = set()
        self.inferred: dict[str, TensorType] = {}
        self.problems: dict[tuple[str, str], list] = {}  # (op, reason) -> [count, node, ...]
        self.unread: set[str] = set()  # results of nodes not read, without a known type
        self.unchecked = 0
        self.node: Any = None  # the node being read (its outputs name the ops)
        self.narrow: DType | None = None  # a wide rule's 16-bit float, computed in float32

    # -- what rules use -------------------------------------------------------------

    def version(self, node) -> int:
        """The version of ``node``'s op definition in force at the model's opset."""
        return self.onnx.defs.get_schema(node.op_type, self.opset, node.domain).since_version

    def input(self, node, i: int) -> Value | None:
        """Operand ``i`` of ``node`` as a Value (None when absent)."""
        if i >= len(node.input) or not node.input[i]:
            return None
        return self._widened(self.tensor(node.input[i]))

    def inputs(self, node) -> list[Value]:
        """The node's operands that are present and not static, as Values."""
        static = IMPORTS[node.op_type].static if node.op_type in IMPORTS else ()
        return [
            self._widened(self.tensor(n)) for i, n in enumerate(node.input) if n and i not in static
        ]

    def _widened(self, v: Value) -> Value:
        if self.narrow is None or v.type.dtype not in _HALF:
            return v
        return self.b.call("Cast", v, dtype="float32", name=f"{v.name}_f32")

    def static(self, node, i: int) -> np.ndarray | None:
        """Operand ``i`` as an array known at import time (None when absent)."""
        if i >= len(node.input) or not node.input[i]:
            return None
        name = node.input[i]
        if name not in self.constants:
            raise Refused(
                f"operand {i} ({name!r}) must be a constant (an initializer, a Constant "
                "node or computed from them), which the registry op takes as an attribute"
            )
        c = self.constants[name]
        return c.array() if isinstance(c, Uniform) else c

    def call(self, op_type: str, *inputs: Value, out: int = 0, **attrs) -> Value:
        """A registry op named after output ``out`` of the node being read."""
        names = self.node.output if self.node is not None else []
        name = self.ir_name(names[out]) if out < len(names) and names[out] else "t"
        if self.narrow is None:
            return self.b.call(op_type, *inputs, name=name, **attrs)
        wide = self.b.call(op_type, *inputs, name=f"{name}_f32", **attrs)
        if wide.type.dtype is not DType.float32:
            return wide
        return self.b.call("Cast", wide, dtype=self.narrow.value, name=name)

    def constant(self, value, dtype: DType, shape: tuple[int, ...] = ()) -> Value:
        value = bool(value) if dtype is DType.bool else value
        value = float(value) if dtype.is_float else value
        value = int(value) if dtype in (DType.int64, DType.int32) else value
        return self.b.call(
            "Constant", value=value, shape=tuple(shape), dtype=dtype.value, device=0, name="c"
        )

    # -- names, constants, inputs ---------------------------------------------------

    def ir_name(self, onnx_name: str) -> str:
        base = _identifier(onnx_name)
        name, k = base, 1
        while name in self.taken:
            name, k = f"{base}_{k}", k + 1
        self.taken.add(name)
        return name

    def tensor(self, name: str) -> Value:
        if name in self.values:
            return self.values[name]
        if name not in self.constants:
            raise Refused(f"reads {name!r}, which no node computes")
        c = self.constants[name]
        array = c.array() if isinstance(c, Uniform) and not c.shape else c
        if name in self.initializers:  # a weight, even a uniform one (a zero bias)
            return self._weight(name, c.array() if isinstance(c, Uniform) else c)
        if isinstance(c, Uniform) or _uniform(array):
            first = c.value if isinstance(c, Uniform) else array.reshape(-1)[0].item()
            dtype = c.dtype if isinstance(c, Uniform) else self._dtype(array, name)
            v = self.b.call(
                "Constant",
                value=first,
                shape=tuple(c.shape),
                dtype=dtype.value,
                device=0,
                name=self.ir_name(name),
            )
        else:
            return self._weight(name, array)
        self.values[name] = v
        return v

    def _declare_weight(self, name: str) -> None:
        try:
            self.tensor(name)
        except Refused as e:
            self._problem("initializer", repr(name), str(e))
            self.unread.add(name)

    def _weight(self, name: str, array: np.ndarray) -> Value:
        """A known tensor as a function input (a weight), its array in ``weights``."""
        v = self.b.input(self.ir_name(name), TensorType(array.shape, self._dtype(array, name), 0))
        self.weights[v.name] = array
        self.values[name] = v
        return v

    def _dtype(self, array: np.ndarray, name: str) -> DType:
        try:
            return DType.from_numpy(array.dtype)
        except Exception:
            raise Refused(
                f"{name!r} has element type {array.dtype}, which DistIR has no dtype for"
            ) from None

    def _constant_node(self, node) -> np.ndarray:
        (a,) = node.attribute
        value = self.onnx.helper.get_attribute_value(a)
        if a.name == "value":
            return self.onnx.numpy_helper.to_array(value)
        if a.name in ("value_float", "value_floats"):
            return np.asarray(value, np.float32)
        if a.name in ("value_int", "value_ints"):
            return np.asarray(value, np.int64)
        raise Refused(f"a Constant's {a.name} is not read (strings and sparse tensors)")

    # -- the walk -------------------------------------------------------------------

    def build(self) -> tuple[Any, dict[str, np.ndarray]]:
        onnx, graph = self.onnx, self.graph
        for t in graph.initializer:
            self.constants[t.name] = onnx.numpy_helper.to_array(t)
        self.initializers = {t.name for t in graph.initializer}
        self._infer()
        read = {  # initializers that rules read as tensors: weights, in the file's order
            n
            for node in graph.node
            if node.op_type in IMPORTS and node.domain in STANDARD
            for i, n in enumerate(node.input)
            if i not in IMPORTS[node.op_type].static
        } | {o.name for o in graph.output}
        # IR version 3 lists every initializer as an input; later ones only overridable ones
        overridable = self.model.ir_version >= 4
        for v in graph.input:
            if v.name in self.constants:  # an initializer listed as an input: a weight
                if overridable or v.name in read:
                    self._declare_weight(v.name)
                continue
            self.values[v.name] = self.b.input(self.ir_name(v.name), self._input_type(v))
        for t in graph.initializer:
            if t.name in read and t.name not in self.values:
                self._declare_weight(t.name)
        for i, node in enumerate(graph.node):
            self._read(i, node)
        outputs = []
        for o in graph.output:
            if o.name in self.unread:
                continue
            try:
                outputs.append(self.tensor(o.name))
            except Refused as e:
                self._problem("graph output", o.name, str(e))
        if self.problems:
            raise error(self._report())
        return self.b.finish(outputs), self.weights

    def _infer(self) -> None:
        try:
            inferred = self.onnx.shape_inference.infer_shapes(self.model)
        except Exception:  # inference is a cross-check and a source of placeholder types
            return
        g = inferred.graph
        for v in [*g.value_info, *g.output]:
            t = _static_type(self.onnx, v.type)
            if t is not None:
                self.inferred[v.name] = t

    def _input_type(self, v) -> TensorType:
        if not v.type.HasField("tensor_type"):
            kind = v.type.WhichOneof("value") or "an undefined type"
            raise error(f"{self.where}: graph input {v.name!r} is a {kind}, not a tensor")
        tt = v.type.tensor_type
        dims = []
        for k, d in enumerate(tt.shape.dim):
            if not d.HasField("dim_value"):
                raise error(
                    f"{self.where}: graph input {v.name!r} axis {k} is symbolic "
                    f"({d.dim_param or '?'}); fix its size (onnx.tools.update_model_dims)"
                )
            dims.append(d.dim_value)
        return TensorType(tuple(dims), dtype_of(self.onnx, tt.elem_type), 0)

    def _read(self, i: int, node) -> None:
        self.node = node
        label = node_label(node, i)
        if any(n in self.unread for n in node.input if n):
            self.unchecked += 1
            self.unread.update(o for o in node.output if o)
            return
        if node.domain in STANDARD and node.op_type == "Constant":
            try:
                self.constants[node.output[0]] = self._constant_node(node)
            except Refused as e:
                self._problem("Constant", label, str(e))
                self.unread.add(node.output[0])
            return
        rule = IMPORTS.get(node.op_type) if node.domain in STANDARD else None
        try:
            version = self.version(node)
        except Exception:
            version = None
        op = (
            f"{node.op_type}-{version}" if version else f"{node.domain or 'ai.onnx'}.{node.op_type}"
        )
        try:
            if node.domain not in STANDARD:
                raise Refused(f"domain {node.domain!r} is not read (the standard domain only)")
            if self._foldable(node, rule):
                results = self._fold(node)
            elif rule is None:
                raise Refused("no registry translation")
            elif version is not None and version > rule.newest:
                raise Refused(f"op version {version} is newer than the importer knows")
            else:
                self.narrow = self._half(node) if rule.wide else None
                results = rule.read(self, node)
            self._store(node, results)
        except Refused as e:
            self._fail(node, op, label, str(e))
        except DistIRError as e:
            self._fail(node, op, label, f"a registry op refused it: {e}")
        finally:
            self.narrow = None

    def _half(self, node) -> DType | None:
        """The 16-bit float of the node's computed operands, if any."""
        for n in node.input:
            v = self.values.get(n)
            if v is not None and v.type.dtype in _HALF:
                return v.type.dtype
        return None

    def _foldable(self, node, rule: Rule | None) -> bool:
        if node.op_type in NEVER_FOLD or not node.output:
            return False
        present = [n for n in node.input if n]
        if not all(n in self.constants for n in present):
            return False
        if rule is None:
            return True
        if any(n in self.initializers for n in present):
            return False
        arrays = [self.constants[n] for n in present]
        return sum(int(np.prod(a.shape)) for a in arrays) <= FOLD_LIMIT and bool(present)

    def _fold(self, node) -> list:
        onnx = self.onnx
        feeds = {n: self.static(node, i) for i, n in enumerate(node.input) if n}
        inputs = [
            onnx.helper.make_tensor_value_info(
                n, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), list(a.shape)
            )
            for n, a in feeds.items()
        ]
        outputs = [onnx.helper.make_empty_tensor_value_info(o) for o in node.output if o]
        graph = onnx.helper.make_graph([node], "fold", inputs, outputs)
        model = onnx.helper.make_model(graph, opset_imports=list(self.model.opset_import))
        try:
            from onnx.reference import ReferenceEvaluator

            with np.errstate(all="ignore"):
                results = ReferenceEvaluator(model).run(None, feeds)
        except Exception as e:
            raise Refused(
                f"its operands are constants, but onnx's reference could not fold it: {e}"
            ) from None
        it = iter(results)
        return [np.asarray(next(it)) if o else None for o in node.output]

    def _store(self, node, results: list) -> None:
        for name, r in zip(node.output, results):
            if not name or r is None:
                continue
            if isinstance(r, (np.ndarray, Uniform)):
                shape, dtype = tuple(r.shape), r.dtype
                dtype = dtype if isinstance(dtype, DType) else None
                self.constants[name] = r
            else:
                shape, dtype = r.type.shape, r.type.dtype
                self.values[name] = r
            want = self.inferred.get(name)
            if want is not None and (shape != want.shape or (dtype and dtype is not want.dtype)):
                raise Refused(
                    f"the importer's result {name!r} is {shape} {dtype and dtype.value}, but "
                    f"ONNX infers {want.shape} {want.dtype.value} (an importer bug: please "
                    "report it)"
                )

    def _fail(self, node, op: str, label: str, reason: str) -> None:
        self._problem(op, label, reason)
        for o in node.output:
            if not o or o in self.values or o in self.constants:
                continue
            t = self.inferred.get(o)
            if t is None:
                self.unread.add(o)
            else:  # a placeholder of the right type, so that later nodes are checked too
                self.values[o] = self.b.input(self.ir_name(f"unread_{o}"), t)

    def _problem(self, op: str, label: str, reason: str) -> None:
        entry = self.problems.setdefault((op, reason), [0, label])
        entry[0] += 1

    def _report(self) -> str:
        lines = [
            f"  {op} x{count} (first: node {label}): {reason}"
            for (op, reason), (count, label) in self.problems.items()
        ]
        nodes = sum(count for count, _ in self.problems.values())
        more = (
            f"\n  ({self.unchecked} node(s) after them could not be checked: their operands' "
            "types are unknown)"
            if self.unchecked
            else ""
        )
        return (
            f"{self.where} (opset {self.opset}): {nodes} node(s) cannot be imported:\n"
            + "\n".join(lines)
            + more
            + f"\nThe importer reads: {', '.join(sorted(IMPORTS))}"
        )


def _uniform(a: np.ndarray) -> bool:
    return a.size > 0 and bool((a == a.reshape(-1)[0]).all())


def static_operands(op_type: str) -> tuple[int, ...]:
    """The operand positions of ``op_type`` that must be constants in a file."""
    rule = IMPORTS.get(op_type)
    return rule.static if rule is not None else ()


__all__ = ["IMPORTS", "Reader", "node_label", "static_operands"]
