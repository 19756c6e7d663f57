"""The ATen table's indexing part: ``x[index]`` (``index.Tensor``), ``index_select``,
strided and reversed slices, ``flip``, ``roll``, ``constant_pad_nd``, ``repeat``,
``cumsum``, ``tril``/``triu``, ``upsample_*2d`` and group normalisation.

A gather along one axis is an ``Embedding`` (a row lookup, with a gradient) of the
tensor with that axis first; a constant index (a strided slice, a flip) is a lifted
constant of the program. ``cumsum`` is a product with a triangular matrix of ones (its
gradient and sharding are the matmul's). Upsampling is one product per resized axis by
the matrix torch's own ``interpolate`` makes of the identity, so that it interpolates
exactly as torch does.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ..types import DType
from ._aten import Lowering, Unsupported, _axis, _slice_bounds
from ._aten import _slice as _plain_slice


def take(lw: Lowering, x, axis: int, index, name: str, node=None):
    """``x`` gathered at ``index`` (a Value of indices in range) along ``axis``: an
    ``Embedding`` of ``x`` with ``axis`` first; the last op is ``node``'s when given."""
    rank = x.type.rank
    if axis:
        perm = (axis, *range(axis), *range(axis + 1, rank))
        x = lw.b.call("Transpose", x, perm=perm, name=f"{name}_first")
    rest = x.type.shape[1:]
    table = lw.b.call("Reshape", x, shape=(x.type.shape[0], math.prod(rest)), name=f"{name}_rows")
    rows = lw.b.call("Embedding", table, lw.cast(index, DType.int64), name=f"{name}_taken")
    k = index.type.rank
    shape = (*index.type.shape, *rest)
    emit = (lambda *a, **kw: lw.call(*a, node=node, **kw)) if node is not None else None
    if axis == 0:
        if emit:
            return emit("Reshape", rows, shape=shape)
        return lw.b.call("Reshape", rows, shape=shape, name=f"{name}_back")
    rows = lw.b.call("Reshape", rows, shape=shape, name=f"{name}_back")
    perm = (*range(k, k + axis), *range(k), *range(k + axis, k + rank - 1))
    if emit:
        return emit("Transpose", rows, perm=perm)
    return lw.b.call("Transpose", rows, perm=perm, name=f"{name}_placed")


def constant_index(lw: Lowering, values: np.ndarray, name: str):
    """A lifted int64 constant (an input of the program holding ``values``)."""
    return lw.lifted(np.asarray(values, np.int64), name)


def _in_range(lw: Lowering, index, n: int, name: str):
    """Indices counted from the end made plain: Where(index < 0, index + n, index)."""
    zero = lw.constant(0, index.type.dtype)
    below = lw.b.call("Compare", index, zero, kind="lt", name=f"{name}_negative")
    wrapped = lw.b.call("Add", index, lw.constant(n, index.type.dtype), name=f"{name}_wrapped")
    return lw.b.call("Where", below, wrapped, index, name=f"{name}_index")


def _index(lw: Lowering, node):
    """``x[..., i, j, ...]`` with index tensors on consecutive axes that each vary along
    their own axis of the broadcast index (an outer product, as an upsampling's): one
    gather per axis. Other advanced indexing is refused."""
    x = lw.value(node.args[0])
    indices = list(node.args[1])
    used = [d for d, i in enumerate(indices) if i is not None]
    if not used:
        return x
    if used != list(range(used[0], used[0] + len(used))):
        raise Unsupported("index tensors on non-adjacent axes")
    values = [lw.value(indices[d]) for d in used]
    if any(v.type.dtype is DType.bool for v in values):
        raise Unsupported("a boolean mask (a data-dependent shape)")
    k = len(values)
    shapes = [(1,) * (k - v.type.rank) + v.type.shape for v in values]
    if len(values) > 1 and any(
        any(n != 1 for a, n in enumerate(s) if a != j) for j, s in enumerate(shapes)
    ):
        raise Unsupported("index tensors that are not an outer product")
    y = x
    for j, (d, v) in enumerate(zip(used, values)):  # each 1-d (or the one) index in place
        flat = v if len(values) == 1 else lw.b.call("Reshape", v, shape=(shapes[j][j],))
        flat = _in_range(lw, flat, x.type.shape[d], f"{node.name}_{j}")
        last = node if j == len(values) - 1 else None
        y = take(lw, y, d, flat, f"{node.name}_{j}", last)
    return y


def _index_select(lw: Lowering, node):
    x, dim, index = lw.value(node.args[0]), node.args[1], lw.value(node.args[2])
    axis = _axis(dim, x.type.rank)
    index = _in_range(lw, index, x.type.shape[axis], node.name)
    return take(lw, x, axis, index, node.name, node)


def strided_slice(lw: Lowering, node, x, axis: int, start, end, step: int):
    n = x.type.shape[axis]
    start, end = _slice_bounds(n, start, end)
    picks = np.arange(start, end, step)
    return take(lw, x, axis, constant_index(lw, picks, f"{node.name}_steps"), node.name, node)


def _flip(lw: Lowering, node):
    x = lw.value(node.args[0])
    y = x
    dims = [_axis(d, x.type.rank) for d in node.args[1]]
    for j, d in enumerate(dims):
        picks = np.arange(x.type.shape[d])[::-1]
        last = node if j == len(dims) - 1 else None
        y = take(lw, y, d, constant_index(lw, picks, f"{node.name}_{d}"), f"{node.name}_{d}", last)
    return y


def _roll(lw: Lowering, node):
    x = lw.value(node.args[0])
    shifts, dims = list(node.args[1]), list(node.args[2]) if len(node.args) > 2 else []
    if len(shifts) != len(dims):
        raise Unsupported("a roll of the flattened tensor")
    y = x
    for j, (s, d) in enumerate(zip(shifts, dims)):
        d = _axis(d, x.type.rank)
        picks = (np.arange(x.type.shape[d]) - s) % x.type.shape[d]
        last = node if j == len(dims) - 1 else None
        y = take(lw, y, d, constant_index(lw, picks, f"{node.name}_{d}"), f"{node.name}_{d}", last)
    return y


def _constant_pad(lw: Lowering, node):
    x = lw.value(node.args[0])
    pads = list(node.args[1])
    value = node.args[2] if len(node.args) > 2 else node.kwargs.get("value", 0.0)
    y = x
    todo = []
    for k in range(len(pads) // 2):  # torch lists the last axis first
        axis = x.type.rank - 1 - k
        todo.append((axis, pads[2 * k], pads[2 * k + 1]))
    todo = [t for t in todo if t[1] or t[2]]
    if not todo:
        return x
    for j, (axis, before, after) in enumerate(todo):
        last = j == len(todo) - 1
        n = y.type.shape[axis]
        if before < 0 or after < 0:
            start, end = max(-before, 0), n - max(-after, 0)
            before, after = max(before, 0), max(after, 0)
            kw = dict(axis=axis, start=start, end=end)
            if last and not (before or after):
                return lw.call("Slice", y, node=node, **kw)
            y = lw.b.call("Slice", y, name=f"{node.name}_cut{axis}", **kw)
            if not (before or after):
                continue
        kw = dict(axis=axis, before=before, after=after, value=float(value))
        y = (
            lw.call("Pad", y, node=node, **kw)
            if last
            else lw.b.call("Pad", y, name=f"{node.name}_{axis}", **kw)
        )
    return y


def _repeat(lw: Lowering, node):
    x, repeats = lw.value(node.args[0]), list(node.args[1])
    lead = len(repeats) - x.type.rank
    if lead:
        x = lw.b.call("Reshape", x, shape=(1,) * lead + x.type.shape, name=f"{node.name}_lead")
    todo = [(axis, r) for axis, r in enumerate(repeats) if r != 1]
    if not todo:
        return lw.call("Identity", x, node=node)
    y = x
    for j, (axis, r) in enumerate(todo):
        shape = y.type.shape
        y = lw.b.call(
            "Reshape", y, shape=(*shape[:axis], 1, *shape[axis:]), name=f"{node.name}_axis"
        )
        y = lw.b.call("BroadcastTo", y, shape=(*shape[:axis], r, *shape[axis:]))
        merged = (*shape[:axis], r * shape[axis], *shape[axis + 1 :])
        if j == len(todo) - 1:
            return lw.call("Reshape", y, node=node, shape=merged)
        y = lw.b.call("Reshape", y, shape=merged, name=f"{node.name}_tiled")
    return y


def _cumsum(lw: Lowering, node):
    x = lw.cast(lw.value(node.args[0]), lw.dtype_of(node))
    axis = _axis(node.args[1], x.type.rank)
    n = x.type.shape[axis]
    upper = np.triu(np.ones((n, n)))  # y[..., j] = sum over i <= j of x[..., i]
    m = lw.lifted(upper.astype(x.type.dtype.numpy), f"{node.name}_triangle")
    last = x.type.rank - 1
    if x.type.rank == 1:
        row = lw.b.call("Reshape", x, shape=(1, n), name=f"{node.name}_row")
        y = lw.b.call("MatMul", row, m, name=f"{node.name}_sum")
        return lw.call("Reshape", y, node=node, shape=(n,))
    if axis == last:
        return lw.call("MatMul", x, m, node=node)
    perm = list(range(x.type.rank))
    perm[axis], perm[last] = perm[last], perm[axis]
    moved = lw.b.call("Transpose", x, perm=tuple(perm), name=f"{node.name}_last")
    y = lw.b.call("MatMul", moved, m, name=f"{node.name}_sum")
    return lw.call("Transpose", y, node=node, perm=tuple(perm))


def _triangle(upper: bool):
    def lower(lw: Lowering, node):
        x = lw.value(node.args[0])
        k = node.args[1] if len(node.args) > 1 else node.kwargs.get("diagonal", 0)
        ones = np.ones(x.type.shape[-2:], bool)
        keep = np.triu(ones, k) if upper else np.tril(ones, k)
        kept = lw.lifted(keep, f"{node.name}_kept")
        return lw.call("Where", kept, x, lw.constant(0, x.type.dtype), node=node)

    return lower


def _slice(lw: Lowering, node):
    """A slice with a step (or none): the step's indices gathered; step 1 as ``_aten``."""
    given = [*node.args[1:], *[None] * 4]
    step = given[3] or 1
    if step == 1:
        return _plain_slice(lw, node)
    x = lw.value(node.args[0])
    return strided_slice(lw, node, x, _axis(given[0] or 0, x.type.rank), given[1], given[2], step)


def _group_norm(lw: Lowering, node):
    x, weight, bias = (lw.value(a) if a is not None else None for a in node.args[:3])
    n, c, _, groups, eps = node.args[3:8]
    rest = x.type.shape[2:]
    g = lw.b.call("Reshape", x, shape=(n, groups, c // groups, *rest), name=f"{node.name}_g")
    axes = tuple(range(2, g.type.rank))
    mean = lw.b.call("ReduceMean", g, axes=axes, keepdims=True, name=f"{node.name}_mean")
    centred = lw.b.call("Sub", g, mean, name=f"{node.name}_centred")
    var = lw.b.call("ReduceMean", lw.b.call("Mul", centred, centred), axes=axes, keepdims=True)
    eps_c = lw.constant(float(eps), x.type.dtype)
    rstd = lw.b.call("Rsqrt", lw.b.call("Add", var, eps_c), name=f"{node.name}_rstd")
    normed = lw.b.call("Mul", centred, rstd, name=f"{node.name}_normed")
    per = (c,) + (1,) * len(rest)
    if weight is None and bias is None:
        return (lw.call("Reshape", normed, node=node, shape=x.type.shape), None, None)
    y = lw.b.call("Reshape", normed, shape=x.type.shape, name=f"{node.name}_ungrouped")
    if weight is not None:
        w = lw.b.call("Reshape", weight, shape=per)
        if bias is None:
            return (lw.call("Mul", y, w, node=node), None, None)
        y = lw.b.call("Mul", y, w, name=f"{node.name}_w")
    out = lw.call("Add", y, lw.b.call("Reshape", bias, shape=per), node=node)
    return (out, None, None)  # mean and rstd: read by training graphs only


TABLE: dict[str, Callable[[Lowering, Any], Any]] = {
    "aten.slice.Tensor": _slice,
    "aten.native_group_norm.default": _group_norm,
    "aten.index.Tensor": _index,
    "aten._unsafe_index.Tensor": _index,
    "aten.index_select.default": _index_select,
    "aten.flip.default": _flip,
    "aten.roll.default": _roll,
    "aten.constant_pad_nd.default": _constant_pad,
    "aten.repeat.default": _repeat,
    "aten.cumsum.default": _cumsum,
    "aten.tril.default": _triangle(upper=False),
    "aten.triu.default": _triangle(upper=True),
}
