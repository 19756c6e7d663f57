"""Pipeline stages as a program's annotations give them (``PipelineStage`` markers or a
``stage_of={value_name: stage}`` mapping), checked to describe a pipeline.

The annotations must describe a pipeline of ``n`` stages: ids ``0 .. n-1``, each with
an op, never decreasing along the data flow, and each weight read in one stage only
(see :mod:`ir.transforms.stage_cut`, which assigns the rest).
"""

from __future__ import annotations

from collections.abc import Mapping

from ..function import Function
from ..op import Op
from ..sharding.errors import AnnotationError
from ..sharding.stages import is_stage_marker, stage_marks, strip_stages
from ..value import Value
from ..verify import describe_op
from ._rewrite import TransformError, is_optimizer
from .step_parts import backward_ops, weights

_SEE = "(the pipeline degree, times chunks with the interleaved schedule)"


def annotated_stages(f: Function, stage_of: Mapping[str, int] | None = None) -> dict[Op, int]:
    """The ops of ``f`` that its ``PipelineStage`` markers or ``stage_of`` (value name ->
    stage) put in a stage (empty: no annotations)."""
    try:
        marked = stage_marks(f)
    except AnnotationError as e:
        raise TransformError(f"pipeline level: {e}") from None
    if stage_of is None:
        return marked
    if not isinstance(stage_of, Mapping):
        raise TransformError(
            f"pipeline level: stage_of must map value names to stages, got {stage_of!r}"
        )
    if marked:
        raise TransformError(
            f"pipeline level: {f.name} carries PipelineStage annotations and stage_of= was "
            "given too; give the stages one way (strip the markers or drop stage_of)"
        )
    after = backward_ops(f)
    makers: dict[str, list[Op]] = {}
    for op in f.ops:
        if not is_stage_marker(op) and op not in after and not is_optimizer(op):
            for v in op.outputs:
                makers.setdefault(v.name, []).append(op)
    for name, s in stage_of.items():
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise TransformError(
                f"pipeline level: the stage of {name!r} must be a non-negative integer, got {s!r}"
            )
        if name not in makers:
            raise TransformError(
                f"pipeline level: no forward op of {f.name} makes a value named {name!r} to put "
                f"in stage {s} (the backward pass and optimizer steps follow their forward ops)"
            )
        for op in makers[name]:
            if marked.get(op, s) != s:
                raise TransformError(
                    f"pipeline level: the op making {name!r} is put in stages {marked[op]} and "
                    f"{s}; one stage per op\n  in: {describe_op(op)}"
                )
            marked[op] = s
    return marked


def unmarked(f: Function, stage_of: Mapping[str, int] | None = None) -> tuple[Function, dict]:
    """``f`` without ``PipelineStage`` markers, and its annotated ops (by the new ops)."""
    marks = annotated_stages(f, stage_of)
    if stage_of is not None:  # then f has no markers (annotated_stages checks)
        return f, marks
    return strip_stages(f)


def annotated_forward(
    f: Function, n: int, marks: Mapping[Op, int], backward: set[Op]
) -> dict[Op, int]:
    """The stage of every forward op (markers included), checked to make ``n`` stages."""
    producer = f.producers
    for op in marks:
        if op in backward or is_optimizer(op):
            raise TransformError(
                f"pipeline level: {op.outputs[0].name!r} is annotated, but its op is part of "
                "the backward pass or an optimizer step, which follow their forward ops; "
                f"annotate forward ops only\n  in: {describe_op(op)}"
            )
    forward: dict[Op, int] = {}
    for op in f.ops:
        if op in backward or is_optimizer(op):
            continue
        made = {v: forward[producer[v]] for v in op.inputs if producer.get(v) in forward}
        if is_stage_marker(op):
            forward[op] = made.get(op.inputs[0], 0)
            continue
        inherited = max(made.values(), default=0)
        s = marks.get(op, inherited)
        if s < inherited:
            late = next(v for v, k in made.items() if k == inherited)
            raise TransformError(
                f"pipeline level: {op.outputs[0].name!r} is annotated stage {s} but reads "
                f"{late.name!r} from stage {inherited}; stages must not decrease along the "
                "data flow (a later stage feeding an earlier one is a cycle between stages): "
                f"put it in stage {inherited} or later\n  in: {describe_op(op)}"
            )
        forward[op] = s
    used = sorted({s for op, s in forward.items() if not is_stage_marker(op)})
    beyond = [s for s in used if s >= n]
    if beyond:
        raise TransformError(
            f"pipeline level: the annotations use stages {used} but the pipeline has {n} "
            f"{_SEE}, numbered 0 to {n - 1}; stage(s) {beyond} are out of range"
        )
    empty = [s for s in range(n) if s not in used]
    gaps = [s for s in empty if s < used[-1]]
    if gaps:
        raise TransformError(
            f"pipeline level: stage(s) {gaps} have no op (a gap in the annotated stages "
            f"{used}); number the stages 0, 1, 2, ... without gaps"
        )
    if empty:
        raise TransformError(
            f"pipeline level: the annotations make {len(used)} stage(s) but the pipeline has "
            f"{n} {_SEE}; annotate {n} stages or ask for {len(used)}"
        )
    return forward


def weight_stages(f: Function, forward: Mapping[Op, int]) -> dict[Value, int]:
    """The one stage whose forward ops read each weight."""
    readers: dict[Value, set[int]] = {}
    chosen = set(weights(f))
    for op, s in forward.items():
        for v in op.inputs:
            if v in chosen:
                readers.setdefault(v, set()).add(s)
    for w, stages in readers.items():
        if len(stages) > 1:
            raise TransformError(
                f"pipeline level: weight {w.name!r} is read by stages {sorted(stages)}; a "
                "weight lives on one stage, so annotate the ops that read it into one stage "
                "(tied weights across stages are not supported)"
            )
    return {w: min(stages) for w, stages in readers.items()}


__all__ = ["annotated_forward", "annotated_stages", "unmarked", "weight_stages"]
