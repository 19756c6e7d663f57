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
* ``"Z(k)"``: axis ``k`` cut into ``2n`` equal chunks, element ``i`` holding chunks
  ``i`` and ``2n - 1 - i`` one after the other (context parallelism's load-balanced
  sequence split: each rank gets an early and a late part of a causal sequence).

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

from .arguments import nested_shape, real_arg
from .errors import DistIRError
from .types import TensorType, TupleType, Type

Levels = tuple[str, ...]
# ASCII digits, at most 19 (int64's): \d would take any Unicode digit and a 5000-digit
# number would reach int()'s own limit (a ValueError, not a LayoutError)
_LEVEL = re.compile(r"^(R|P|[SZ]\(([0-9]{1,19})\))(?:@([0-9]{1,19}))?$")


class LayoutError(DistIRError):
    """A layout that does not fit its value, or values that do not fit a layout."""


def _parse(level: str, what: str) -> tuple[str, int | None, int | None]:
    """(kind "R" | "P" | "S" | "Z", split axis or None, mesh-axis size or None)."""
    match = _LEVEL.match(level) if isinstance(level, str) else None
    if match is None:
        raise LayoutError(
            f"layout level {level!r} of {what} is not 'R', 'P', 'S(k)' or 'Z(k)' (@n)"
        )
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


def mesh_axes(
    levels: Levels, n: int, what: str = "value"
) -> tuple[list[tuple[str, int | None, int]], Levels]:
    """The mesh axes the first levels of ``levels`` lay a tuple of ``n`` elements over:
    ``[(kind "R" | "P" | "S", split axis or None, size)]``, row-major (one plain level,
    or a run of ``@`` levels whose sizes multiply to ``n``); and the levels left for
    the elements."""
    return _take(tuple(levels), n, what)


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
    rank = inner.rank if isinstance(inner, TensorType) else None
    for level in levels:
        kind, axis, _ = _parse(level, what)
        if kind == "S" and rank is not None and (axis is None or axis >= rank):
            raise LayoutError(
                f"layout level {level!r} of {what} splits axis {axis}, but its pieces "
                f"({inner}) have rank {rank}: a value of rank {rank} splits along axes "
                f"0..{rank - 1} (a scalar is 'R' or 'P')"
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
    elif kind == "Z":
        if axis >= x.ndim or x.shape[axis] % (2 * n):
            raise LayoutError(
                f"{what}: cannot cut axis {axis} of shape {x.shape} into {2 * n} equal chunks"
            )
        chunks = np.split(x, 2 * n, axis=axis)
        parts = [np.concatenate([chunks[i], chunks[2 * n - 1 - i]], axis=axis) for i in range(n)]
    else:
        if axis >= x.ndim or x.shape[axis] < n:
            raise LayoutError(f"{what}: cannot split axis {axis} of shape {x.shape} {n} ways")
        base, extra = divmod(x.shape[axis], n)
        bounds = np.cumsum([0] + [base + (1 if i < extra else 0) for i in range(n)])
        # slices are views: a wrong (even huge) input is refused by shape, never copied
        lead = (slice(None),) * axis
        parts = [x[(*lead, slice(bounds[i], bounds[i + 1]))] for i in range(n)]
    return [q for p in parts for q in _pieces(p, rest, what)]


def distribute_value(x: Any, t: Type, levels: Levels, what: str = "value") -> Any:
    """The sequential array ``x`` laid out as ``t`` by ``levels`` (nested tuples of arrays)."""
    whole = whole_shape(t, levels, what)
    if isinstance(x, (list, tuple)) and nested_shape(x) != whole:
        raise LayoutError(f"{what}: a value of shape {nested_shape(x)} where {whole} is expected")
    array = _array(x, what)
    if tuple(array.shape) != whole:
        raise LayoutError(f"{what}: a value of shape {array.shape} where {whole} is expected")
    return _lay_out(array, t, levels, what)


def _lay_out(array: np.ndarray, t: Type, levels: Levels, what: str) -> Any:
    """:func:`distribute_value` once the whole value's shape is checked: split, and each
    piece checked against its element type."""
    if isinstance(t, TensorType):
        if tuple(array.shape) != t.shape:
            raise LayoutError(f"{what}: a piece of shape {array.shape} where {t} is expected")
        return array
    axes, rest = _take(levels, len(t.elements), what)
    parts = _pieces(array, axes, what)
    return tuple(_lay_out(p, e, rest, what) for p, e in zip(parts, t.elements))


def whole_shape(t: Type, levels: Levels, what: str = "value") -> tuple[int, ...]:
    """The shape of the sequential value that ``t`` laid out by ``levels`` holds."""
    if isinstance(t, TensorType):
        return t.shape
    axes, rest = _take(levels, len(t.elements), what)
    shapes = [whole_shape(e, rest, what) for e in t.elements]
    for kind, axis, n in reversed(axes):  # the last mesh axis varies fastest
        groups = [shapes[i : i + n] for i in range(0, len(shapes), n)]
        shapes = []
        for g in groups:
            first = g[0]
            if kind in "SZ" and axis is not None and axis < len(first):
                first = (*first[:axis], sum(s[axis] for s in g), *first[axis + 1 :])
            shapes.append(first)
    return shapes[0]


def _whole(parts: list, axes: list[tuple[str, int | None, int]], what: str, rtol: float):
    """The inverse of ``_pieces``: replicas checked, splits joined, partials summed."""
    if not axes:
        (only,) = parts
        return only
    (kind, axis, n), rest = axes[0], axes[1:]
    step = len(parts) // n
    subs = [_whole(parts[i * step : (i + 1) * step], rest, what, rtol) for i in range(n)]
    if kind == "S":
        if axis is None or any(np.ndim(x) <= axis for x in subs):
            raise LayoutError(
                f"{what}: the layout splits axis {axis}, but its pieces have shape "
                f"{np.shape(subs[0])} (a scalar is 'R' or 'P')"
            )
        return np.concatenate(subs, axis=axis)
    if kind == "Z":
        halves = [np.split(sub, 2, axis=axis) for sub in subs]
        order = [h[0] for h in halves] + [h[1] for h in reversed(halves)]
        return np.concatenate(order, axis=axis)
    if kind == "P":
        total = subs[0]
        for other in subs[1:]:
            total = total + other
        return total
    for k, other in enumerate(subs[1:], start=1):
        if not np.allclose(subs[0], other, rtol=rtol, atol=0.0, equal_nan=True):
            raise LayoutError(f"{what}: replica {k} differs from replica 0")
    return subs[0]


def _array(x: Any, what: str) -> np.ndarray:
    """``x`` as a numeric array, or a LayoutError naming ``what``."""
    try:
        array = np.asarray(x)
    except (ValueError, TypeError) as e:  # ragged nested lists, say
        raise LayoutError(f"{what}: not an array ({e})") from None
    if array.dtype.kind in "OUSMm":
        raise LayoutError(f"{what}: holds {array.dtype} values, not numbers")
    return array


def collect_value(y: Any, t: Type, levels: Levels, what: str = "value", rtol: float = 0.0) -> Any:
    """The whole array from pieces laid out by ``levels``; replicas must agree (to ``rtol``)."""
    if isinstance(t, TensorType):
        array = _array(y, what)
        if tuple(array.shape) != t.shape:
            raise LayoutError(f"{what}: a piece of shape {array.shape} where {t} is expected")
        return array
    if not isinstance(y, (tuple, list)) or len(y) != len(t.elements):
        raise LayoutError(
            f"{what}: expected a tuple of {len(t.elements)} pieces ({t}), got {_short(y)}"
        )
    axes, rest = _take(levels, len(t.elements), what)
    parts = [collect_value(p, e, rest, what, rtol) for p, e in zip(y, t.elements)]
    return _whole(parts, axes, what, rtol)


def distribute(step: Any, inputs: Mapping[str, Any] | Sequence[Any], source: Any = None) -> list:
    """The step's inputs made from the sequential program's ``inputs``.

    ``inputs``: arrays by input name, or positional for ``source`` (the sequential
    Function, whose input names the step keeps). Inputs with a layout are laid
    out by it; the others are passed as they are.
    """
    _check_function("distribute", "step", step)
    if source is not None:
        _check_function("distribute", "source", source)
    if not isinstance(inputs, Mapping):
        if source is None:
            raise LayoutError("positional inputs need the source program (source=...)")
        if isinstance(inputs, (str, bytes)) or not isinstance(inputs, Sequence):
            raise LayoutError(
                f"distribute: inputs must be a list of arrays (one per input of "
                f"{source.name}) or a dict from input name to array, got {_short(inputs)}"
            )
        if len(inputs) != len(source.inputs):
            raise LayoutError(f"{source.name} takes {len(source.inputs)} inputs, got {len(inputs)}")
        inputs = {v.name: x for v, x in zip(source.inputs, inputs)}
    layouts = step.input_layouts or (None,) * len(step.inputs)
    out = []
    for v, levels in zip(step.inputs, layouts):
        if v.name not in inputs:
            raise LayoutError(f"no value given for input {v.name!r} of {step.name}")
        x = inputs[v.name]
        what = f"input {v.name!r}"
        out.append(x if levels is None else distribute_value(x, v.type, levels, what))
    return out


def collect(step: Any, outputs: Sequence[Any], rtol: float = 1e-9) -> list:
    """The step's outputs as whole arrays (replicas checked to agree to ``rtol``)."""
    _check_function("collect", "step", step)
    if isinstance(outputs, (str, bytes)) or not isinstance(outputs, Sequence):
        raise LayoutError(
            f"collect: outputs must be the list of {step.name}'s {len(step.outputs)} outputs, "
            f"got {_short(outputs)}"
        )
    if len(outputs) != len(step.outputs):
        raise LayoutError(
            f"collect: {step.name} has {len(step.outputs)} outputs, got {len(outputs)} values"
        )
    rtol = real_arg("collect", "rtol", rtol, lo=0.0)
    layouts = step.output_layouts or (None,) * len(step.outputs)
    return [
        collect_value(y, v.type, levels, f"output {v.name!r}", rtol)
        if levels is not None or isinstance(v.type, TensorType)  # a whole tensor: checked
        else y
        for v, y, levels in zip(step.outputs, outputs, layouts)
    ]


def _check_function(where: str, name: str, value: Any) -> None:
    from .function import Function

    if not isinstance(value, Function):
        raise LayoutError(f"{where}: {name} must be an ir.Function, got {_short(value)}")


def _short(value: Any) -> str:
    from .arguments import _got

    return _got(value)


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
