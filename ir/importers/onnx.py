"""ONNX out and in: ``to_onnx`` writes a logical program with seed 001's multi-device
annotations, ``from_onnx`` reads standard-opset models (and those annotations) back.

A *logical* program is one op per logical op, values on one device, with the
user's choices recorded by ``ShardAnnotate`` (a layout) and ``PipelineStage``
(a stage) ops, as ``ir.sharding.annotate`` and ``annotate_stages`` write them.
``to_onnx`` writes each registry op as the standard ONNX op(s) of its entry in
``EXPORTS``, and each annotation as a field of the nodes involved: the layout of
a node's result as a ``ShardingSpecProto`` on that node, the layout of a graph
input on every node that reads it, the stage as the node's ``pipeline_stage``
(see ``ir.importers.onnx_devices``). ``from_onnx`` rebuilds the same program:
the ops of ``IMPORTS``, then the annotations, so that ``ir.sharding.propagate``
derives the same distributed program. Explicitly distributed programs (tuples of
per-device values, collectives) have no standard ONNX form: export the
annotated program they were propagated from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DistIRError
from ..function import Function
from ..registry import OpKind, get_op
from ..sharding.annotations import annotate
from ..sharding.mesh import Layout
from ..sharding.stages import annotate_stages
from ..types import TensorType, Type
from ..value import Value
from . import _onnx_export as out
from . import _onnx_import as read
from . import onnx_devices as dev
from ._onnx_import import static_operands
from ._onnx_opset import OnnxConversionWarning, prepared

__all__ = [
    "OnnxAnnotationError",
    "OnnxConversionWarning",
    "OnnxError",
    "from_onnx",
    "static_operands",
    "to_onnx",
]

OnnxAnnotationError = dev.OnnxAnnotationError
OPSET = 20  # what to_onnx writes (Gelu's tanh form needs 20)
IR_VERSION = 11  # the multi-device protos arrived in IR version 11
CONFIGURATION = "distir"


class OnnxError(DistIRError):
    """An ONNX file or model that cannot be read or written (corrupt, unknown opset or op)."""


def _onnx():
    import onnx

    return onnx


# -- export --------------------------------------------------------------------------


def _markers(function: Function):
    """Resolve annotation ops: each marker's result is its operand's value."""
    root: dict[Value, Value] = {}
    layouts: dict[Value, Layout] = {}
    stages: dict[Value, int] = {}

    def find(v: Value) -> Value:
        while v in root:
            v = root[v]
        return v

    for op in function.ops:
        if op.op_type not in ("ShardAnnotate", "PipelineStage"):
            continue
        base = find(op.inputs[0])
        root[op.outputs[0]] = base
        if op.op_type == "PipelineStage":
            stages[base] = op.attributes["stage"]
            continue
        layout = Layout.from_attributes(op.attributes)
        if base in layouts and layouts[base] != layout:
            raise OnnxAnnotationError(
                f"value {base.name!r} is annotated twice ({layouts[base]} and {layout}); "
                "ONNX keeps one sharding spec per tensor and node"
            )
        layouts[base] = layout
    return find, layouts, stages


def to_onnx(
    function: Function,
    path: str | Path | None = None,
    weights: Mapping[str, Any] | Sequence[Any] | None = None,
    *,
    configuration: str = CONFIGURATION,
):
    """Write ``function`` as an ONNX model (opset 20; 23 with an ``Attention`` op, ONNX's
    fused attention) and return the ``ModelProto``.

    Inputs become graph inputs; those named in ``weights`` (a mapping from input
    name to array, or a sequence of arrays for the first inputs, as
    ``ir.from_torch`` returns them) also become initializers. ``ShardAnnotate``
    and ``PipelineStage`` ops become seed 001's annotations in the device
    configuration ``configuration``. With ``path``, the model is saved there.
    """
    onnx = _onnx()
    find, layouts, stages = _markers(function)
    names = _Names()
    for v in function.inputs:
        if not isinstance(v.type, TensorType):
            raise OnnxError(
                f"input {v.name!r} is {_short(v.type)}, a per-device value of an explicitly "
                f"distributed program; {_LOGICAL_ONLY}"
            )
        names.of(v)
    builder = out.Emitter(onnx, names.of)
    stage_nodes: list[tuple[int, int]] = []  # (first node, stage) per staged op
    for op in function.ops:
        if op.op_type in ("ShardAnnotate", "PipelineStage"):
            names.alias(op.outputs[0], find(op.outputs[0]))
            continue
        _check_exportable(op)
        start = len(builder.nodes)
        out.export_op(builder, op)
        stage = next((stages[v] for v in op.outputs if v in stages), None)
        if stage is not None:
            stage_nodes += [(i, stage) for i in range(start, len(builder.nodes))]
    graph = onnx.helper.make_graph(
        builder.nodes,
        function.name,
        [_value_info(onnx, names.of(v), v.type) for v in function.inputs],
        [_value_info(onnx, names.of(v), v.type) for v in function.outputs],
        initializer=_initializers(onnx, function, weights, names),
    )
    model = onnx.helper.make_model(
        graph,
        opset_imports=[onnx.helper.make_opsetid("", _opset(function))],
        ir_version=IR_VERSION,
        producer_name="distir-workbench",
    )
    shapes = {names.of(v): v.type.shape for v in names.values()}
    _write_annotations(onnx, model, configuration, layouts, dict(stage_nodes), names, shapes)
    dev.check_annotations(model, shapes)
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as e:
        raise OnnxError(f"the exported model of {function.name!r} is not valid ONNX: {e}") from e
    if path is not None:
        onnx.save(model, str(path))
    return model


def _opset(function: Function) -> int:
    """OPSET, or the newer opset that one of ``function``'s ops needs (Attention: 23)."""
    return max([OPSET, *(out.NEEDS_OPSET.get(op.op_type, OPSET) for op in function.ops)])


class _Names:
    """Unique ONNX tensor names from the values' name hints."""

    def __init__(self) -> None:
        self.names: dict[Value, str] = {}
        self.taken: set[str] = set()

    def of(self, v: Value) -> str:
        if v not in self.names:
            name, k = v.name, 1
            while name in self.taken:
                name, k = f"{v.name}_{k}", k + 1
            self.taken.add(name)
            self.names[v] = name
        return self.names[v]

    def alias(self, v: Value, base: Value) -> None:
        self.names[v] = self.of(base)

    def values(self) -> list[Value]:
        return [v for v in self.names if isinstance(v.type, TensorType)]


_LOGICAL_ONLY = (
    "to_onnx writes logical programs: export the annotated program (ShardAnnotate, "
    "PipelineStage) that propagate started from"
)


def _short(t: Type) -> str:
    text = str(t)
    return text if len(text) <= 80 else text[:77] + "..."


def _check_exportable(op) -> None:
    opdef = get_op(op.op_type)
    if opdef.kind is OpKind.COMMUNICATION or op.subfunctions:
        raise OnnxError(
            f"{op.op_type} is a {opdef.kind.value} op of an explicitly distributed program; "
            f"{_LOGICAL_ONLY}"
        )
    if op.op_type not in out.EXPORTS:
        raise OnnxError(
            f"{op.op_type} has no ONNX translation (to_onnx writes: "
            f"{', '.join(sorted(out.EXPORTS))})"
        )


def _value_info(onnx, name: str, t):
    if not isinstance(t, TensorType):
        raise OnnxError(f"value {name!r} has type {t}: ONNX graph values are single tensors")
    return onnx.helper.make_tensor_value_info(name, out.elem_type(onnx, t.dtype), list(t.shape))


def _initializers(onnx, function: Function, weights, names: _Names) -> list:
    if weights is None:
        return []
    if not isinstance(weights, Mapping):
        weights = {v.name: w for v, w in zip(function.inputs, weights)}
    by_name = {v.name: v for v in function.inputs}
    out = []
    for name, array in weights.items():
        if name not in by_name:
            raise OnnxError(f"weights name {name!r}, which is not an input of {function.name!r}")
        v = by_name[name]
        array = np.asarray(array, dtype=v.type.dtype.numpy)
        if array.shape != v.type.shape:
            raise OnnxError(f"weight {name!r} has shape {array.shape}, the input is {v.type.shape}")
        out.append(onnx.numpy_helper.from_array(array, names.of(v)))
    return out


def _write_annotations(onnx, model, configuration, layouts, stage_of_node, names, shapes):
    if not layouts and not stage_of_node:
        return
    meshes = [layout.mesh for layout in layouts.values()]
    model.configuration.append(dev.device_configuration(onnx, configuration, meshes))
    if meshes:
        if len(set(meshes)) > 1:
            raise OnnxAnnotationError(
                f"the annotations use {len(set(meshes))} meshes; one mesh per program"
            )
        entry = model.metadata_props.add()
        entry.key, entry.value = dev.MESH_KEY, dev.mesh_metadata(meshes[0])
    by_name = {names.of(v): layout for v, layout in layouts.items()}
    for i, node in enumerate(model.graph.node):
        specs = [
            dev.spec_proto(onnx, t, by_name[t], shapes[t])
            for t in dict.fromkeys([*node.input, *node.output])
            if t in by_name
        ]
        stage = stage_of_node.get(i)
        if specs or stage is not None:
            dc = onnx.NodeDeviceConfigurationProto(configuration_id=configuration)
            dc.sharding_spec.extend(specs)
            if stage is not None:
                dc.pipeline_stage = stage
            node.device_configurations.append(dc)


# -- import --------------------------------------------------------------------------


def _load(path_or_model):
    onnx = _onnx()
    if isinstance(path_or_model, onnx.ModelProto):
        return onnx, path_or_model, "the model"
    where = str(path_or_model)
    try:
        model = onnx.load(where)
    except FileNotFoundError:
        raise OnnxError(f"{where}: no such file") from None
    except Exception as e:  # protobuf's DecodeError and friends
        raise OnnxError(
            f"{where} is not a readable ONNX model (corrupt or truncated?): {type(e).__name__}: {e}"
        ) from None
    if not model.graph.node and not model.graph.input:
        raise OnnxError(f"{where} holds no graph (is it an ONNX file, and complete?)")
    return onnx, model, where


def from_onnx(path_or_model, *, configuration: str | None = None):
    """The ``Function`` of an ONNX model (a path or a ``ModelProto``).

    Returns the function, or ``(function, weights)`` when the model has
    initializers (``weights`` maps input names to arrays; the function's other
    inputs are the model's plain graph inputs). Seed 001's annotations of
    ``configuration`` (default: the model's only one) come back as
    ``ShardAnnotate`` and ``PipelineStage`` ops. Files of opset 7 to 12 are converted
    to opset 13 by ``onnx.version_converter`` first (an :class:`OnnxConversionWarning`
    says so). Every node that cannot be read is listed in one :class:`OnnxError`.
    """
    onnx, model, where = _load(path_or_model)
    try:
        onnx.checker.check_model(model)
    except Exception as e:
        raise OnnxError(f"{where} is not valid ONNX: {e}") from None
    model, opset = prepared(onnx, model, where, OnnxError)
    reader = read.Reader(onnx, model, where, opset)
    function, weights = reader.build()
    shapes = {name: v.type.shape for name, v in reader.values.items()}
    dev.check_annotations(model, shapes)
    function = _read_annotations(model, function, reader, configuration)
    return (function, weights) if weights else function


def _read_annotations(model, function: Function, reader, configuration: str | None):
    configs = dev.configurations(model)
    if not configs:
        return function
    if configuration is None:
        if len(configs) > 1:
            raise OnnxAnnotationError(
                f"the model has device configurations {sorted(configs)}: pass configuration="
            )
        (configuration,) = configs
    elif configuration not in configs:
        raise OnnxAnnotationError(
            f"configuration {configuration!r} is not in the model (it has {sorted(configs)})"
        )
    mesh = dev.model_mesh(model)
    layouts: dict[str, tuple[Layout, str]] = {}
    stages: dict[str, int] = {}
    for i, node in enumerate(model.graph.node):
        stage, specs = dev.stage_and_specs(node, configuration)
        label = dev.node_label(node, i)
        inputs = set(function.inputs)
        computed = [o for o in node.output if o in reader.values and reader.values[o] not in inputs]
        if stage is not None and computed:  # a helper Constant's stage is its reader's
            stages[reader.values[computed[0]].name] = stage
        for j, spec in enumerate(specs):
            field = f"node {label} sharding_spec[{j}]"
            if spec.tensor_name not in reader.values:
                raise OnnxAnnotationError(
                    f"{field}.tensor_name {spec.tensor_name!r} is a constant operand (a shape or "
                    "axes) of the node, which the program keeps as an attribute: it has no layout"
                )
            rank = len(reader.values[spec.tensor_name].type.shape)
            layout = dev.spec_layout(spec, rank, mesh)
            if spec.tensor_name in layouts and layouts[spec.tensor_name][0] != layout:
                other, first = layouts[spec.tensor_name]
                raise OnnxAnnotationError(
                    f"{field} gives {spec.tensor_name!r} the layout {layout}, but {first} gives "
                    f"it {other}: one layout per tensor"
                )
            layouts.setdefault(spec.tensor_name, (layout, field))
    if stages:
        function = annotate_stages(function, stages)
    if layouts:
        by_value = {reader.values[t].name: lay for t, (lay, _) in layouts.items()}
        function = annotate(function, by_value)
    return function
