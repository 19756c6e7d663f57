"""Pipeline-stage annotations on ops (ONNX's per-node ``pipeline_stage``, seed 001).

A stage is recorded by a ``PipelineStage(y, stage=k)`` op after the op that
produced ``y``, so annotations print and parse. :func:`pipeline_stages` reads
them (an unmarked op takes the latest stage of its operands' producers, the
seed's "A -> ... -> E in stage 1, F -> ... -> K in stage 2"), and
:func:`place_stages` runs each stage on its own device, moving values between
stages with ``Send`` (model-parallel placement). The pipeline *schedule* over
microbatches is ``ir.transforms``' job: ``pipeline_parallel`` and ``megatron``
take their stages from these annotations (``ir/transforms/stage_annotations.py``), reading
them with :func:`stage_marks` or :func:`strip_stages`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..builder import FunctionBuilder, rebuild_op
from ..function import Function
from ..op import Op
from ..types import TensorType
from ..value import Value
from .errors import AnnotationError

MARKER = "PipelineStage"


def is_stage_marker(op: Op) -> bool:
    """Whether ``op`` is a ``PipelineStage`` marker (an annotation, not a computation)."""
    return op.op_type == MARKER


def annotate_stages(function: Function, stages: Mapping[str, int]) -> Function:
    """``function`` with the op producing each named value marked as running in its stage."""
    produced = {v.name for op in function.ops for v in op.outputs}
    for name in stages:
        if name not in produced:
            raise AnnotationError(
                f"no op of {function.name!r} produces a value named {name!r} to put in a stage"
            )
    b = FunctionBuilder(function.name)
    env: dict[Value, Value] = {v: b.input(v.name, v.type) for v in function.inputs}
    for op in function.ops:
        outs = rebuild_op(b, op, [env[v] for v in op.inputs])
        for old, new in zip(op.outputs, outs):
            if old.name in stages:
                attrs = {"stage": stages[old.name]}
                new = b.add_op(MARKER, [new], attrs, names=[old.name]).outputs[0]
            env[old] = new
    return b.finish([env[v] for v in function.outputs])


def stage_marks(function: Function) -> dict[Op, int]:
    """The ops that ``PipelineStage`` markers put in a stage, and their stages."""
    marked: dict[Op, int] = {}
    for op in function.ops:
        if is_stage_marker(op):
            producer = function.producers.get(op.inputs[0])
            if producer is None:
                raise AnnotationError(
                    f"PipelineStage marks {op.inputs[0].name!r}, a function input: mark an op's "
                    "result instead"
                )
            if producer in marked and marked[producer] != op.attributes["stage"]:
                raise AnnotationError(
                    f"the op producing {op.inputs[0].name!r} is put in stages "
                    f"{marked[producer]} and {op.attributes['stage']}: one stage per op"
                )
            marked[producer] = op.attributes["stage"]
    return marked


def pipeline_stages(function: Function) -> dict[Op, int]:
    """The stage of every op that is not a marker (0 where nothing says otherwise)."""
    marked = stage_marks(function)
    stage_of: dict[Op, int] = {}
    value_stage: dict[Value, int] = {}
    for op in function.ops:
        if is_stage_marker(op):
            value_stage[op.outputs[0]] = value_stage.get(op.inputs[0], 0)
            continue
        inherited = max((value_stage.get(v, 0) for v in op.inputs), default=0)
        s = marked.get(op, inherited)
        stage_of[op] = s
        for v in op.outputs:
            value_stage[v] = s
    return stage_of


def strip_stages(function: Function) -> tuple[Function, dict[Op, int]]:
    """``function`` without its ``PipelineStage`` markers, and the stage of each marked op
    (keyed by the ops of the returned function).

    The pipeline transforms read the annotations this way, so that no marker is left
    in the program they build.

    >>> import ir
    >>> marked = annotate_stages(ir.models.mlp(8, 4, 6, 4, layers=3), {"a1": 1})
    >>> plain, stages = strip_stages(marked)
    >>> [op.op_type for op in plain.ops]
    ['MatMul', 'Relu', 'MatMul', 'Relu', 'MatMul', 'Loss']
    >>> [(op.outputs[0].name, s) for op, s in stages.items()]
    [('a1', 1)]
    """
    marked = stage_marks(function)
    b = FunctionBuilder(function.name)
    env: dict[Value, Value] = {v: b.input(v.name, v.type) for v in function.inputs}
    stages: dict[Op, int] = {}
    for op in function.ops:
        if is_stage_marker(op):
            env[op.outputs[0]] = env[op.inputs[0]]
            continue
        outs = rebuild_op(b, op, [env[v] for v in op.inputs])
        env.update(zip(op.outputs, outs))
        if op in marked:
            stages[b.ops[-1]] = marked[op]
    return b.finish([env[v] for v in function.outputs]), stages


def place_stages(function: Function, devices: Sequence[int] | Mapping[int, int]) -> Function:
    """Run stage ``s`` on ``devices[s]``: ops move there, values cross stages by ``Send``."""
    stage_of = pipeline_stages(function)
    where = dict(enumerate(devices)) if not isinstance(devices, Mapping) else dict(devices)
    missing = sorted({s for s in stage_of.values() if s not in where})
    if missing:
        raise AnnotationError(f"no device given for pipeline stage(s) {missing}")
    b = FunctionBuilder(f"{function.name}_staged")
    env: dict[Value, Value] = {v: b.input(v.name, v.type) for v in function.inputs}
    moved: dict[tuple[Value, int], Value] = {}

    def on(v: Value, device: int) -> Value:
        local = env[v]
        if not isinstance(local.type, TensorType) or local.type.device == device:
            return local
        if (v, device) not in moved:
            moved[v, device] = b.call("Send", local, to_device=device, name=f"{v.name}_to{device}")
        return moved[v, device]

    for op in function.ops:
        if is_stage_marker(op):
            env[op.outputs[0]] = env[op.inputs[0]]
            continue
        device = where[stage_of[op]]
        attrs = dict(op.attributes)
        if "device" in attrs and not op.inputs:
            attrs["device"] = device
        new = b.add_op(
            op.op_type,
            [on(v, device) for v in op.inputs],
            attrs,
            names=[v.name for v in op.outputs],
            subfunctions=op.subfunctions,
        )
        env.update(zip(op.outputs, new.outputs))
    return b.finish([env[v] for v in function.outputs])
