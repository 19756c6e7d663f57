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

* ``"P"``: the elements are partial sums of the value (outputs only: a loss
  each data-parallel replica computed on its rows).

A level written ``"R@4"`` or ``"S(1)@2"`` is one axis of a device mesh laid
flat in one tuple level: a run of consecutive ``@`` levels (sizes multiplying
to the tuple's length) covers one tuple, row-major, the last axis fastest. A 3D
parallel stage's weight on a (data 2 x tensor 2) mesh is a flat tuple of 4
with layout ``("R@2", "S(1)@2")``.

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
# ASCII digits, at most 19 (int64's): \d would take any Unicode digit and a 5000-digit
# number would reach int()'s own limit (a ValueError, not a LayoutError)
_LEVEL = re.compile(r"^(R|P|S\(([0-9]{1,19})\))(?:@([0-9]{1,19}))?$")


class LayoutError(DistIRError):
    """A layout that does not fit its value, or values that do not fit a layout."""


def _parse(level: str, what: str) -> tuple[str, int | None, int | None]:
    """(kind "R" | "P" | "S", split axis or None, mesh-axis size or None)."""
    match = _LEVEL.match(level) if isinstance(level, str) else None
    if match is None:
        raise LayoutError(f"layout level {level!r} of {what} is not 'R', 'P' or 'S(k)' (@n)")
    kind = match.group(1)[0]
    axis = int(match.group(2)) if match.group(2) is not None else None
    size = int(match.group(3)) if match.group(3) is not None else None
    return kind, axis, size


def _take(levels: Levels, n: int, what: str) -> tuple[list[tuple[str, int | None, int]], Levels]:
    """The levels one tuple of ``n`` elements consumes (one plain level, or ``@`` levels
    whose sizes multiply to ``n``), with each level's size; and the rest."""
    if not levels:
        raise LayoutError(f"layout of {what} has fewer levels than its type has tuples")
    kind, axis, size = _parse(levels[0], what)
    if size is None:
        return [(kind, axis, n)], levels[1:]
    taken, product, i = [], 1, 0
    while i < len(levels):  # a run of @ levels covers one tuple
        kind, axis, size = _parse(levels[i], what)
        if size is None:
            break
        taken.append((kind, axis, size))
        product *= size
        i += 1
    if product != n:
        raise LayoutError(
            f"layout levels {list(levels[:i])} of {what} multiply to {product}, but the "
            f"tuple has {n} elements"
        )
    return taken, levels[i:]


def check_levels(levels: Sequence[str], t: Type, what: str = "value") -> Levels:
    """``levels`` checked against the nested tuple type ``t`` (one or more per tuple depth)."""
    levels = tuple(levels)
    rest, inner = levels, t
    while isinstance(inner, TupleType):
        _, rest = _take(rest, len(inner.elements), what)
        inner = inner.elements[0]
    if rest:
        raise LayoutError(
            f"layout {list(levels)} of {what} has more levels than its type {t} has tuples"
        )
    return levels


def _pieces(x: np.ndarray, axes: list[tuple[str, int | None, int]], what: str) -> list:
    """``x`` laid out over the mesh ``axes`` (row-major list of per-element arrays)."""
    if not axes:
        return [x]
    (kind, axis, n), rest = axes[0], axes[1:]
    if kind == "P":
        raise LayoutError(f"{what}: a partial ('P') layout describes outputs, not inputs")
    if kind == "R":
        parts = [x] * n
    else:
        if axis >= x.ndim or x.shape[axis] < n:
            raise LayoutError(f"{what}: cannot split axis {axis} of shape {x.shape} {n} ways")
        base, extra = divmod(x.shape[axis], n)
        bounds = np.cumsum([0] + [base + (1 if i < extra else 0) for i in range(n)])
        parts = [np.take(x, np.arange(bounds[i], bounds[i + 1]), axis=axis) for i in range(n)]
    return [q for p in parts for q in _pieces(p, rest, what)]


def distribute_value(x: Any, t: Type, levels: Levels, what: str = "value") -> Any:
    """The sequential array ``x`` laid out as ``t`` by ``levels`` (nested tuples of arrays)."""
    array = np.asarray(x)
    if isinstance(t, TensorType):
        if tuple(array.shape) != t.shape:
            raise LayoutError(f"{what}: a piece of shape {array.shape} where {t} is expected")
        return array
    axes, rest = _take(levels, len(t.elements), what)
    parts = _pieces(array, axes, what)
    return tuple(distribute_value(p, e, rest, what) for p, e in zip(parts, t.elements))


def _whole(parts: list, axes: list[tuple[str, int | None, int]], what: str, rtol: float):
    """The inverse of ``_pieces``: replicas checked, splits joined, partials summed."""
    if not axes:
        (only,) = parts
        return only
    (kind, axis, n), rest = axes[0], axes[1:]
    step = len(parts) // n
    subs = [_whole(parts[i * step : (i + 1) * step], rest, what, rtol) for i in range(n)]
    if kind == "S":
        return np.concatenate(subs, axis=axis)
    if kind == "P":
        total = subs[0]
        for other in subs[1:]:
            total = total + other
        return total
    for k, other in enumerate(subs[1:], start=1):
        if not np.allclose(subs[0], other, rtol=rtol, atol=0.0, equal_nan=True):
            raise LayoutError(f"{what}: replica {k} differs from replica 0")
    return subs[0]


def collect_value(y: Any, t: Type, levels: Levels, what: str = "value", rtol: float = 0.0) -> Any:
    """The whole array from pieces laid out by ``levels``; replicas must agree (to ``rtol``)."""
    if isinstance(t, TensorType):
        return np.asarray(y)
    axes, rest = _take(levels, len(t.elements), what)
    parts = [collect_value(p, e, rest, what, rtol) for p, e in zip(y, t.elements)]
    return _whole(parts, axes, what, rtol)


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
