"""Where a steady-state step's state lives: the layout of a distributed input or output.

A costed training step takes its state where it already lives: each device's
weight shards, optimizer-state shards and batch slice are inputs on that
device (DESIGN.md, "steady-state steps"). Such an input is a (possibly nested)
tuple of per-device tensors; its *layout* says how those pieces relate to the
sequential program's value of the same name, one placement per tuple level,
outermost first:

* ``"R"``: every element holds the whole value (replicated);
* ``"S(k)"``: the elements are the value split along axis ``k`` (uneven splits
  follow ``split_sizes``: the first ``n % k`` pieces get one row more).

For example a data-parallel replica of a weight on 4 devices is
``Tuple[T@0, T@1, T@2, T@3]`` with layout ``("R",)``; a column-split weight
of a D-over-H program (2 replicas of 2 tensor-parallel shards) is a tuple of
tuples with layout ``("R", "S(1)")``. A plain tensor input needs no layout:
it is the sequential value, possibly on another device (a pipeline stage's
weights).

Types alone cannot say which placement a level has (a tuple of two ``(4, 3)``
pieces is a replicated ``(4, 3)`` or a split ``(8, 3)``), so transforms record
layouts on the step (``Function.input_layouts`` / ``output_layouts``), and
:func:`distribute` / :func:`collect` read them: the execution proofs give a
step the sequential inputs laid out, run it, and compare the collected outputs
with the sequential program's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .errors import DistIRError
from .types import TensorType, TupleType, Type

Levels = tuple[str, ...]
_SPLIT = re.compile(r"^S\((\d+)\)$")


class LayoutError(DistIRError):
    """A layout that does not fit its value, or values that do not fit a layout."""


def check_levels(levels: Sequence[str], t: Type, what: str = "value") -> Levels:
    """``levels`` checked against the nested tuple type ``t`` (one level per tuple depth)."""
    levels = tuple(levels)
    depth, inner = 0, t
    while isinstance(inner, TupleType):
        depth += 1
        inner = inner.elements[0]
    if len(levels) != depth:
        raise LayoutError(
            f"layout {list(levels)} of {what} has {len(levels)} level(s) but its type "
            f"{t} nests {depth} tuple(s)"
        )
    for level in levels:
        if level != "R" and not _SPLIT.match(level):
            raise LayoutError(f"layout level {level!r} of {what} is neither 'R' nor 'S(k)'")
    return levels


def _split_axis(level: str) -> int | None:
    match = _SPLIT.match(level)
    return int(match.group(1)) if match else None


def distribute_value(x: Any, t: Type, levels: Levels, what: str = "value") -> Any:
    """The sequential array ``x`` laid out as ``t`` by ``levels`` (nested tuples of arrays)."""
    if isinstance(t, TensorType):
        array = np.asarray(x)
        if tuple(array.shape) != t.shape:
            raise LayoutError(f"{what}: a piece of shape {array.shape} where {t} is expected")
        return array
    level, rest = levels[0], levels[1:]
    n = len(t.elements)
    axis = _split_axis(level)
    if axis is None:
        return tuple(distribute_value(x, e, rest, what) for e in t.elements)
    array = np.asarray(x)
    if axis >= array.ndim or array.shape[axis] < n:
        raise LayoutError(f"{what}: cannot split axis {axis} of shape {array.shape} {n} ways")
    base, extra = divmod(array.shape[axis], n)
    bounds = np.cumsum([0] + [base + (1 if i < extra else 0) for i in range(n)])
    pieces = [np.take(array, np.arange(bounds[i], bounds[i + 1]), axis=axis) for i in range(n)]
    return tuple(distribute_value(p, e, rest, what) for p, e in zip(pieces, t.elements))


def collect_value(y: Any, t: Type, levels: Levels, what: str = "value", rtol: float = 0.0) -> Any:
    """The whole array from pieces laid out by ``levels``; replicas must agree (to ``rtol``)."""
    if isinstance(t, TensorType):
        return np.asarray(y)
    level, rest = levels[0], levels[1:]
    parts = [collect_value(p, e, rest, what, rtol) for p, e in zip(y, t.elements)]
    axis = _split_axis(level)
    if axis is not None:
        return np.concatenate(parts, axis=axis)
    first = parts[0]
    for k, other in enumerate(parts[1:], start=1):
        if not np.allclose(first, other, rtol=rtol, atol=0.0, equal_nan=True):
            raise LayoutError(f"{what}: replica {k} differs from replica 0")
    return first


def distribute(step: Any, inputs: Mapping[str, Any] | Sequence[Any], source: Any = None) -> list:
    """The step's inputs made from the sequential program's ``inputs``.

    ``inputs``: arrays by input name, or positional for ``source`` (the sequential
    Function, whose input names the step keeps). Inputs with a layout are laid
    out by it; the others are passed as they are.
    """
    if not isinstance(inputs, Mapping):
        if source is None:
            raise LayoutError("positional inputs need the source program (source=...)")
        if len(inputs) != len(source.inputs):
            raise LayoutError(f"{source.name} takes {len(source.inputs)} inputs, got {len(inputs)}")
        inputs = {v.name: x for v, x in zip(source.inputs, inputs)}
    layouts = step.input_layouts or (None,) * len(step.inputs)
    out = []
    for v, levels in zip(step.inputs, layouts):
        if v.name not in inputs:
            raise LayoutError(f"no value given for input {v.name!r} of {step.name}")
        x = inputs[v.name]
        out.append(x if levels is None else distribute_value(x, v.type, levels, v.name))
    return out


def collect(step: Any, outputs: Sequence[Any], rtol: float = 1e-9) -> list:
    """The step's outputs as whole arrays (replicas checked to agree to ``rtol``)."""
    layouts = step.output_layouts or (None,) * len(step.outputs)
    return [
        y if levels is None else collect_value(y, v.type, levels, v.name, rtol)
        for v, y, levels in zip(step.outputs, outputs, layouts)
    ]


def with_layouts(
    function: Any,
    inputs: Mapping[str, Sequence[str]] | None = None,
    outputs: Sequence[Sequence[str] | None] | None = None,
) -> Any:
    """``function`` with layouts recorded (inputs by name, outputs by position), checked."""
    from dataclasses import replace

    in_layouts = tuple(
        None
        if inputs is None or v.name not in inputs
        else check_levels(inputs[v.name], v.type, f"input {v.name!r}")
        for v in function.inputs
    )
    out_layouts: tuple = ()
    if outputs is not None:
        if len(outputs) != len(function.outputs):
            raise LayoutError(f"{len(outputs)} output layouts for {len(function.outputs)} outputs")
        out_layouts = tuple(
            None if levels is None else check_levels(levels, v.type, f"output {v.name!r}")
            for v, levels in zip(function.outputs, outputs)
        )
    if not any(x is not None for x in in_layouts):
        in_layouts = ()
    if not any(x is not None for x in out_layouts):
        out_layouts = ()
    return replace(function, input_layouts=in_layouts, output_layouts=out_layouts)


def layouts_of(function: Any, like: Any) -> Any:
    """``function`` with the layouts of ``like``, a program it rebuilds with the same
    inputs and outputs (a pass such as unrolling or recomputation)."""
    from dataclasses import replace

    return replace(function, input_layouts=like.input_layouts, output_layouts=like.output_layouts)


__all__ = [
    "LayoutError",
    "check_levels",
    "collect",
    "collect_value",
    "distribute",
    "distribute_value",
    "layouts_of",
    "with_layouts",
]
