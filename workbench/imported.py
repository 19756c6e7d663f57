"""Bring your own model: a PyTorch module or an ONNX file into a session, and the session's
annotated program out as ONNX with seed 001's annotations.

The ONNX file's sharding annotations become the session's annotations (one
change, so undo shows the program without them); its pipeline stages stay in
the program as ``PipelineStage`` ops.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ir.builder import FunctionBuilder, rebuild_op
from ir.function import Function
from ir.sharding import annotate
from ir.sharding.annotations import collect
from ir.sharding.mesh import Layout
from ir.value import Value

from .session import Session, SessionError


def load_torch(
    module: Any, example_inputs: Sequence[Any], moe_capacity_factor: float | None = None
) -> tuple[Function, dict[str, Any], tuple[str, ...]]:
    """``ir.from_torch`` (``moe_capacity_factor`` as there: ``None`` imports a
    mixture-of-experts model dropless, exactly), with the arguments by input name and the
    names of the inputs that are weights: every input but the example inputs, which come
    just before the ``const_*`` tensors that ``from_torch`` folds (see
    ``ir.importers.torch_export``)."""
    from ir.importers import from_torch

    function, arguments = from_torch(
        module, example_inputs, moe_capacity_factor=moe_capacity_factor
    )
    names = [v.name for v in function.inputs]
    end = len(names)
    while end > 0 and names[end - 1].startswith("const_"):
        end -= 1
    data = set(names[end - len(example_inputs) : end])
    weights = tuple(n for n in names if n not in data)
    return function, dict(zip(names, arguments)), weights


def load_onnx(path: str | Path) -> tuple[Function, dict[str, np.ndarray], dict[str, Layout]]:
    """The program of an ONNX file without its sharding annotations, its initializers by
    input name, and the annotations (value name -> layout)."""
    from ir.importers import from_onnx

    read = from_onnx(path)
    function, weights = read if isinstance(read, tuple) else (read, {})
    plain, layouts = split_annotations(function)
    return plain, weights, layouts


def split_annotations(function: Function) -> tuple[Function, dict[str, Layout]]:
    """``function`` without its ``ShardAnnotate`` ops, and their layouts by value name."""
    if not any(op.op_type == "ShardAnnotate" for op in function.ops):
        return function, {}
    layouts, _ = collect(function, None, None)
    b = FunctionBuilder(function.name)
    env: dict[Value, Value] = {v: b.input(v.name, v.type) for v in function.inputs}
    for op in function.ops:
        if op.op_type == "ShardAnnotate":
            env[op.outputs[0]] = env[op.inputs[0]]
            continue
        env.update(zip(op.outputs, rebuild_op(b, op, [env[v] for v in op.inputs])))
    return b.finish([env[v] for v in function.outputs]), {v.name: lay for v, lay in layouts.items()}


def annotated_program(session: Session) -> Function:
    """The session's base program with its annotations as ``ShardAnnotate`` ops."""
    state = session.state
    if not state.strategy.is_sequential:
        raise SessionError(
            f"the session runs the ready strategy {state.strategy.describe()}, which rewrites "
            "the program; ONNX keeps annotations: annotate values instead (or save before)"
        )
    return annotate(session.base, dict(state.annotations))


def save_onnx(session: Session, path: str | Path, weights: Mapping[str, Any] | None = None):
    """Write the session's annotated program to ``path`` (``ir.to_onnx``)."""
    from ir.importers import to_onnx

    return to_onnx(annotated_program(session), path, weights=weights)
