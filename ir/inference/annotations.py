"""A serving strategy as the seeds' annotations: sharding specs on the weights and KV caches,
pipeline stages on the ops (seed 001; the TVM DistIR RFC's flow).

:func:`annotated_step` writes on a prefill or decode step where ``strategy`` puts every
weight and cache: on the devices of its pipeline stage (stage ``s`` on devices
``s * tp .. s * tp + tp - 1``, as ``ir.transforms.megatron`` numbers them), split along the
axis tensor parallelism splits it (``S(k)`` over a ``(tp,)`` mesh: column weights by
columns, row weights by rows, caches by kv heads) or whole (``R``); and with ``pp > 1``
a ``PipelineStage`` marker where each stage starts. The placements are read off the
program ``T.megatron`` builds for the strategy, the stages off ``T.pipeline_cut``, so
the annotated step says what the transformed one runs. ``ir.to_onnx`` writes it as
ONNX's multi-device annotations (one device configuration: with ``pp > 1`` each sharding
spec names the tensor ranks within its stage, ``0 .. tp - 1``, and each node's
``pipeline_stage`` says which stage runs it). With ``pp == 1`` ``ir.sharding.propagate``
derives every other value's layout from :func:`serving_annotations` and
``lower_to_ranks`` gives the per-rank programs.
"""

from __future__ import annotations

from ..function import Function
from ..sharding import Mesh, R, S, annotate, annotate_stages
from ..transforms import pipeline_cut
from .steps import ServingError
from .strategies import ServingStrategy, parallel_step


def _tp_level(layout: tuple[str, ...]) -> int | None:
    """The axis the tensor level splits (``"S(1)@4"``), or None (whole)."""
    level = layout[-1]
    return int(level[2 : level.index(")")]) if level.startswith("S(") else None


def op_stages(step: Function, pp: int) -> dict[str, int]:
    """The pipeline stage of each value the step makes and of each input it reads (by name):
    weights where ``T.pipeline_cut`` puts them, every op in the latest stage of its operands."""
    if pp == 1:
        return {}
    cut = pipeline_cut(step, pp)
    stage = {name: s for s, st in enumerate(cut.stages) for name in st.weights}
    inputs = set(step.inputs)
    for op in step.ops:
        known = [stage[v.name] for v in op.inputs if v.name in stage]
        s = max(known, default=0)
        for v in op.inputs:  # an input no weight cut placed (a cache) sits with its reader
            if v in inputs:
                stage.setdefault(v.name, s)
        for v in op.outputs:
            stage[v.name] = s
    return stage


def serving_annotations(
    step: Function, strategy: ServingStrategy, *, stage_devices: bool = True
) -> dict[str, tuple]:
    """Mesh placements of ``step``'s weights and caches under one replica of ``strategy``
    (see the module docstring), by input name. ``stage_devices=False``: every mesh is the
    tensor ranks ``0 .. tp - 1`` of its stage (one mesh for the whole program, as an ONNX
    file's one device configuration holds; the pipeline stages say which stage)."""
    if strategy.replicas != 1:
        raise ServingError(
            f"annotations describe one replica; got {strategy.label} (replicas serve separate "
            "requests: annotate one and run it on each replica's devices)"
        )
    program = parallel_step(step, strategy, replicas=False)
    layouts = dict(zip((v.name for v in program.inputs), program.input_layouts or ()))
    stages = op_stages(step, strategy.pp)
    # a vocabulary-parallel lookup is T.megatron's own plan (masked lookups, one all-reduce),
    # not a sharding rule propagation can follow: the annotations keep the table whole
    tables = {op.inputs[0].name for op in step.ops if op.op_type == "Embedding"}
    out: dict[str, tuple] = {}
    for v in step.inputs:
        if v.name == "tokens":
            continue
        first = stages.get(v.name, 0) * strategy.tp if stage_devices else 0
        mesh = Mesh((strategy.tp,), tuple(range(first, first + strategy.tp)))
        axis = _tp_level(layouts[v.name]) if v.name in layouts and v.name not in tables else None
        out[v.name] = (mesh, [R if axis is None else S(axis)])
    return out


def annotated_step(step: Function, strategy: ServingStrategy) -> Function:
    """``step`` with ``strategy``'s sharding annotations and pipeline stages (see the module
    docstring)."""
    check_strategy_of(step, strategy)
    one_mesh = serving_annotations(step, strategy, stage_devices=strategy.pp == 1)
    annotated = annotate(step, one_mesh)
    if strategy.pp == 1:
        return annotated
    stages = op_stages(step, strategy.pp)
    produced = {v: op for op in step.ops for v in op.outputs}
    starts = {}
    for op in step.ops:
        here = stages[op.outputs[0].name]
        before = [stages[v.name] for v in op.inputs if v in produced]
        if here > max(before, default=0):
            starts[op.outputs[0].name] = here
    return annotate_stages(annotated, starts)


def check_strategy_of(step: Function, strategy: ServingStrategy) -> None:
    """Refuse a strategy the step's attention cannot take (tp and the kv heads)."""
    for op in step.ops:
        if op.op_type == "Attention":
            heads, kv = op.inputs[0].type.shape[1], op.inputs[1].type.shape[1]  # type: ignore[union-attr]
            for what, n in (("key/value heads", kv), ("attention heads", heads)):
                if n > 1 and n % strategy.tp:
                    raise ServingError(
                        f"tensor-parallel degree {strategy.tp} does not divide the {n} {what} "
                        f"({n % strategy.tp} left over)"
                    )


__all__ = ["annotated_step", "op_stages", "serving_annotations"]
