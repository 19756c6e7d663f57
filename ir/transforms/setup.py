"""The setup program of a steady-state step: the one-time distribution of its state.

A steady-state step (DESIGN.md) takes each input where it lives: a per-device
tuple laid out as its recorded layout says (``ir.layout``), or a plain tensor,
possibly on another device than the sequential program has it (a pipeline
stage's weights). ``setup_program(source, step)`` is the program that gets
there from the sequential program's inputs: ``Scatter`` for an ``S(k)`` level,
``Broadcast`` for ``R``, nested tuples level by level (``Slice`` pieces or
copies, each laid out in turn), ``Send`` for a plain tensor that changes
device, nothing for one that stays. Executing it and then the step equals
executing the source; simulating it gives the one-time distribution cost,
never part of a step's time.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..arguments import function_arg
from ..builder import FunctionBuilder
from ..function import Function
from ..layout import check_levels, mesh_axes
from ..ops.communication import split_sizes
from ..types import TensorType, TupleType, Type
from ..value import Value
from ..verify import verify
from ._rewrite import TransformError


def setup_program(source: Function, step: Function) -> Function:
    """The program from ``source``'s inputs (by name, on their devices) to ``step``'s inputs.

    >>> import ir
    >>> from ir.transforms import data_parallel, setup_program
    >>> b = ir.FunctionBuilder("mlp")
    >>> w = b.input("w", ir.TensorType((4, 3), ir.DType.float64, 0))
    >>> x = b.input("x", ir.TensorType((6, 4), ir.DType.float64, 0))
    >>> f = b.finish(b.call("MatMul", x, w, name="y"))
    >>> [op.op_type for op in setup_program(f, data_parallel(f, 2)).ops]
    ['Broadcast', 'Scatter']
    """
    function_arg("setup_program", "source", source)
    function_arg("setup_program", "step", step)
    b = FunctionBuilder(f"{step.name}_setup")
    given = {v.name: b.input(v.name, v.type) for v in source.inputs}
    missing = [v.name for v in step.inputs if v.name not in given]
    if missing:
        raise TransformError(
            f"step input(s) {missing} are not inputs of {source.name} (its inputs are "
            f"{list(given)}); a step keeps its source's input names"
        )
    layouts = step.input_layouts or (None,) * len(step.inputs)
    outs = []
    for v, levels in zip(step.inputs, layouts):
        if levels is None and isinstance(v.type, TupleType):
            raise TransformError(
                f"step input {v.name!r} is a tuple without a layout: record one with "
                f"ir.layout.with_layouts"
            )
        levels = () if levels is None else check_levels(levels, v.type, f"input {v.name!r}")
        out = _lay_out(b, given[v.name], v.type, levels, f"{v.name}s")
        if out.type != v.type:
            raise TransformError(
                f"laying out {v.name!r} gives {out.type}, but {step.name} takes {v.type}"
            )
        outs.append(out)
    return verify(b.finish(outs))


def _lay_out(b: FunctionBuilder, x: Value, t: Type, levels: Sequence[str], name: str) -> Value:
    """``x`` (a whole tensor) as a value of type ``t`` laid out by ``levels``."""
    if isinstance(t, TensorType):
        if x.type.shape != t.shape:
            raise TransformError(f"{name}: a piece of shape {x.type.shape} where {t} is taken")
        if x.type.device != t.device:
            return b.call("Send", x, to_device=t.device, name=name)
        return x
    axes, rest = mesh_axes(tuple(levels), len(t.elements), f"input {name!r}")
    if any(kind == "P" for kind, _, _ in axes):
        raise TransformError(f"{name}: a partial ('P') layout describes outputs, not inputs")
    if len(axes) == 1 and not rest:  # the elements are tensors: one collective
        devices = list(t.devices)
        kind, axis, _ = axes[0]
        if kind == "R":
            return b.call("Broadcast", x, devices=devices, name=name)
        if kind == "S":
            return b.call("Scatter", x, dim=axis, devices=devices, name=name)
    pieces = _pieces(b, x, axes, name)
    laid = [
        _lay_out(b, p, e, rest, f"{name}_{i}") for i, (p, e) in enumerate(zip(pieces, t.elements))
    ]
    return b.call("MakeTuple", *laid, name=name)


def _pieces(
    b: FunctionBuilder, x: Value, axes: Sequence[tuple[str, int | None, int]], name: str
) -> list[Value]:
    """``x`` cut over the mesh ``axes`` (row-major, the last axis fastest): a Slice per
    block of an ``S(k)`` axis, ``x`` itself for each element of an ``R`` axis."""
    if not axes:
        return [x]
    (kind, axis, n), rest = axes[0], axes[1:]
    if kind == "R":
        parts = [x] * n
    elif kind == "Z":  # chunks i and 2n - 1 - i of 2n
        assert axis is not None
        size = x.type.shape[axis] if axis < x.type.rank else 0
        if size % (2 * n):
            raise TransformError(f"{name}: cannot cut axis {axis} of {x.type} into {2 * n} chunks")
        c = size // (2 * n)

        def chunk(j: int) -> Value:
            return b.call("Slice", x, axis=axis, start=j * c, end=(j + 1) * c, name=f"{name}_c{j}")

        parts = [
            b.call("Concat", chunk(i), chunk(2 * n - 1 - i), dim=axis, name=f"{name}_{i}")
            for i in range(n)
        ]
    else:
        assert axis is not None
        if axis >= x.type.rank or x.type.shape[axis] < n:
            raise TransformError(f"{name}: cannot split axis {axis} of {x.type} {n} ways")
        starts = [0]
        for size in split_sizes(x.type.shape[axis], n):
            starts.append(starts[-1] + size)
        parts = [
            b.call("Slice", x, axis=axis, start=starts[i], end=starts[i + 1], name=f"{name}_{i}")
            for i in range(n)
        ]
    return [q for part in parts for q in _pieces(b, part, rest, name)]


__all__ = ["setup_program"]
