"""ONNX rules that move data: shapes, slices, gathers, padding, tiling, and what is known
from shapes alone (``Shape``, ``Size``, ``ConstantOfShape``, ``EyeLike``).

Shapes, axes, starts, pads and repeats are constants in a file (``static`` operands):
they become the registry ops' attributes. A strided or reversed ``Slice`` and a
``Gather`` along any axis are an ``Embedding`` (a row lookup) of the tensor with the
gathered axis moved first, so that they have a gradient; ``Tile`` is a broadcast of a
new axis merged into the tiled one.
"""

from __future__ import annotations

import math

import numpy as np

from ..types import DType
from ._onnx_export import dtype_of
from ._onnx_rules import Refused, Rule, Uniform, attr, axis_of, ints, known_attributes, scalar


def _reshape(rd, node):
    known_attributes(node, "allowzero")
    (x,) = rd.inputs(node)
    shape = ints(rd.static(node, 1))
    if not attr(rd, node, "allowzero", 0):
        shape = [x.type.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    if shape.count(-1) > 1:
        raise Refused(f"shape {shape} has more than one -1")
    if -1 in shape:
        rest = math.prod(d for d in shape if d != -1)
        if rest == 0 or x.type.num_elements % rest:
            raise Refused(f"shape {shape} does not fit {x.type.shape}")
        shape[shape.index(-1)] = x.type.num_elements // rest
    if math.prod(shape) != x.type.num_elements or min(shape, default=0) < 0:
        raise Refused(f"shape {shape} does not hold the {x.type.num_elements} elements")
    return [rd.call("Reshape", x, shape=tuple(shape))]


def _flatten(rd, node):
    (x,) = rd.inputs(node)
    axis = attr(rd, node, "axis", 1)
    axis = axis % x.type.rank if axis < 0 else axis
    if axis > x.type.rank:
        raise Refused(f"axis {axis} is beyond rank {x.type.rank}")
    shape = (math.prod(x.type.shape[:axis]), math.prod(x.type.shape[axis:]))
    return [rd.call("Reshape", x, shape=shape)]


def _squeeze(rd, node):
    (x,) = rd.inputs(node)
    given = ints(rd.static(node, 1)) if rd.version(node) >= 13 else attr(rd, node, "axes", [])
    axes = {axis_of(a, x.type.rank) for a in given or []}
    if not given:
        axes = {i for i, d in enumerate(x.type.shape) if d == 1}
    if any(x.type.shape[a] != 1 for a in axes):
        raise Refused(f"squeezes axes {sorted(axes)} of {x.type.shape}, not all of size 1")
    shape = tuple(d for i, d in enumerate(x.type.shape) if i not in axes)
    return [rd.call("Reshape", x, shape=shape)]


def _unsqueeze(rd, node):
    (x,) = rd.inputs(node)
    given = ints(rd.static(node, 1)) if rd.version(node) >= 13 else attr(rd, node, "axes", [])
    rank = x.type.rank + len(given)
    axes = {axis_of(a, rank) for a in given}
    if len(axes) != len(given):
        raise Refused(f"axes {given} repeat an axis")
    dims = iter(x.type.shape)
    shape = tuple(1 if i in axes else next(dims) for i in range(rank))
    return [rd.call("Reshape", x, shape=shape)]


def _transpose(rd, node):
    (x,) = rd.inputs(node)
    perm = attr(rd, node, "perm")
    perm = tuple(range(x.type.rank))[::-1] if perm is None else tuple(perm)
    return [rd.call("Transpose", x, perm=perm)]


def _expand(rd, node):
    (x,) = rd.inputs(node)
    try:
        shape = tuple(np.broadcast_shapes(x.type.shape, tuple(ints(rd.static(node, 1)))))
    except ValueError as e:
        raise Refused(f"shape does not broadcast: {e}") from None
    if shape == x.type.shape:
        return [rd.call("Identity", x)]
    return [rd.call("BroadcastTo", x, shape=shape)]


def _concat(rd, node):
    xs = rd.inputs(node)
    axis = axis_of(attr(rd, node, "axis"), xs[0].type.rank)
    kept = [x for x in xs if x.type.shape[axis]] or xs[:1]
    return [rd.call("Concat", *kept, dim=axis)]


def _split(rd, node):
    (x,) = rd.inputs(node)
    axis = axis_of(attr(rd, node, "axis", 0), x.type.rank)
    n = x.type.shape[axis]
    sizes = ints(rd.static(node, 1)) if rd.version(node) >= 13 else attr(rd, node, "split")
    parts = len(node.output)
    if not sizes:
        count = attr(rd, node, "num_outputs", parts)
        step = -(-n // count)
        sizes = [min(step, n - k * step) for k in range(count)]
    if sum(sizes) != n or len(sizes) != parts:
        raise Refused(f"split sizes {sizes} do not cut an axis of {n} into {parts} outputs")
    out, start = [], 0
    for k, size in enumerate(sizes):
        out.append(rd.call("Slice", x, out=k, axis=axis, start=start, end=start + size))
        start += size
    return out


def take(rd, x, axis: int, index, out_shape: tuple[int, ...], last: bool = True):
    """``x`` gathered at ``index`` (a Value of whole numbers in range) along ``axis``: an
    ``Embedding`` of ``x`` with ``axis`` first and the rest flattened (the last op named
    after the node's result when ``last``)."""
    rank = x.type.rank
    if axis:
        x = rd.b.call("Transpose", x, perm=(axis, *range(axis), *range(axis + 1, rank)))
    rest = x.type.shape[1:]
    table = rd.b.call("Reshape", x, shape=(x.type.shape[0], math.prod(rest)), name="table")
    if index.type.dtype is not DType.int64:
        index = rd.b.call("Cast", index, dtype="int64", name="index")
    rows = rd.b.call("Embedding", table, index, name="rows")
    k = index.type.rank
    emit = rd.call if last else lambda *a, **kw: rd.b.call(*a, name="taken", **kw)
    if axis == 0:
        return emit("Reshape", rows, shape=(*index.type.shape, *rest))
    rows = rd.b.call("Reshape", rows, shape=(*index.type.shape, *rest), name="gathered")
    perm = (*range(k, k + axis), *range(k), *range(k + axis, k + rank - 1))
    return emit("Transpose", rows, perm=perm)


def _in_range(rd, index, n: int):
    """Indices with negative ones counted from the end (Where(index < 0, index + n, index))."""
    negative = rd.b.call("Compare", index, scalar(rd, 0, index), kind="lt", name="negative")
    return rd.b.call("Where", negative, rd.b.call("Add", index, scalar(rd, n, index)), index)


def _gather(rd, node):
    x = rd.input(node, 0)
    axis = axis_of(attr(rd, node, "axis", 0), x.type.rank)
    n = x.type.shape[axis]
    name = node.input[1]
    if name in rd.constants:
        index = rd.static(node, 1)
        if index.size and (index.min() < -n or index.max() >= n):
            raise Refused(f"an index is out of range for an axis of {n}")
        if index.size and index.min() < 0:  # counted from the end: the indices they mean
            rd.constants[f"{name}::in_range"] = np.where(index < 0, index + n, index)
            name = f"{name}::in_range"
        index = rd.tensor(name)
    else:
        index = _in_range(rd, rd.tensor(name), n)
    out = (*x.type.shape[:axis], *index.type.shape, *x.type.shape[axis + 1 :])
    return [take(rd, x, axis, index, out)]


def _gather_elements(rd, node):
    x, index = rd.inputs(node)
    axis = axis_of(attr(rd, node, "axis", 0), x.type.rank)
    return [rd.call("TakeAlongAxis", x, _in_range(rd, index, x.type.shape[axis]), axis=axis)]


def _slice_steps(rd, x, axis: int, start: int, end: int, step: int, last: bool):
    n = x.type.shape[axis]
    index = np.arange(n)[slice(start, end, step)].astype(np.int64)
    if step == 1:
        kw = dict(axis=axis, start=int(index[0]) if index.size else 0)
        kw["end"] = int(index[-1]) + 1 if index.size else kw["start"]
        return rd.call("Slice", x, **kw) if last else rd.b.call("Slice", x, name="slice", **kw)
    key = f"{rd.node.output[0]}::steps{axis}"
    rd.constants[key] = index
    out = (*x.type.shape[:axis], index.size, *x.type.shape[axis + 1 :])
    return take(rd, x, axis, rd.tensor(key), out, last)


def _slice(rd, node):
    (x,) = rd.inputs(node)
    if rd.version(node) >= 10:
        starts, ends = ints(rd.static(node, 1)), ints(rd.static(node, 2))
        axes, steps = rd.static(node, 3), rd.static(node, 4)
    else:
        starts, ends = attr(rd, node, "starts"), attr(rd, node, "ends")
        axes, steps = attr(rd, node, "axes"), None
    axes = list(range(len(starts))) if axes is None else ints(np.asarray(axes))
    steps = [1] * len(starts) if steps is None else ints(steps)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise Refused("starts, ends, axes and steps differ in length")
    big = np.iinfo(np.int64)
    y = x
    todo = [(axis_of(a, x.type.rank), s, e, k) for a, s, e, k in zip(axes, starts, ends, steps)]
    if not todo:
        return [rd.call("Identity", x)]
    for i, (axis, start, end, step) in enumerate(todo):
        if step == 0:
            raise Refused("a step of 0")
        start = None if start in (big.min, big.max) and step < 0 and start == big.max else start
        y = _slice_steps(rd, y, axis, start, end, step, last=i == len(todo) - 1)
    return [y]


def _tile(rd, node):
    (x,) = rd.inputs(node)
    repeats = ints(rd.static(node, 1))
    if len(repeats) != x.type.rank or min(repeats, default=1) < 0:
        raise Refused(f"repeats {repeats} do not fit rank {x.type.rank}")
    y = x
    for axis, r in enumerate(repeats):
        if r == 1:
            continue
        shape = y.type.shape
        spread = (*shape[:axis], 1, *shape[axis:])
        grown = (*shape[:axis], r, *shape[axis:])
        y = rd.b.call("Reshape", y, shape=spread, name="tile_axis")
        y = rd.b.call("BroadcastTo", y, shape=grown, name="tiled")
        y = rd.b.call("Reshape", y, shape=(*shape[:axis], r * shape[axis], *shape[axis + 1 :]))
    return [rd.call("Identity", y)]


def _dropout(rd, node):
    x = rd.input(node, 0)
    training = rd.static(node, 2) if rd.version(node) >= 12 else None
    if training is not None and bool(training.reshape(-1)[0]):
        raise Refused("training mode (random masks): export the model in eval mode")
    mask = Uniform(True, x.type.shape, DType.bool) if len(node.output) > 1 else None
    return [rd.call("Identity", x), mask]


def _shape(rd, node):
    x = rd.input(node, 0)
    shape = np.asarray(x.type.shape, np.int64)
    start, end = attr(rd, node, "start", 0), attr(rd, node, "end")
    return [shape[slice(start, end)]]


def _constant_of_shape(rd, node):
    shape = tuple(ints(rd.static(node, 0)))
    value = attr(rd, node, "value")
    array = np.zeros(1, np.float32) if value is None else rd.onnx.numpy_helper.to_array(value)
    try:
        dtype = DType.from_numpy(array.dtype)
    except Exception:
        raise Refused(f"a {array.dtype} value, which DistIR has no dtype for") from None
    return [Uniform(array.reshape(-1)[0].item(), shape, dtype)]


def _eye_like(rd, node):
    x = rd.input(node, 0)
    if x.type.rank != 2:
        raise Refused(f"EyeLike of rank {x.type.rank}")
    to = attr(rd, node, "dtype")
    dtype = x.type.dtype if to is None else dtype_of(rd.onnx, to)
    return [np.eye(*x.type.shape, k=attr(rd, node, "k", 0), dtype=dtype.numpy)]


def _trilu(rd, node):
    x = rd.input(node, 0)
    k = ints(rd.static(node, 1))
    rows, cols = x.type.shape[-2:]
    ones = np.ones((rows, cols), bool)
    keep = (
        np.triu(ones, k[0] if k else 0)
        if attr(rd, node, "upper", 1)
        else np.tril(ones, k[0] if k else 0)
    )
    key = f"{rd.node.output[0]}::kept"
    rd.constants[key] = keep
    return [rd.call("Where", rd.tensor(key), x, scalar(rd, 0, x))]


def _space_depth(to_depth: bool):
    def read(rd, node):
        (x,) = rd.inputs(node)
        s = attr(rd, node, "blocksize")
        n, c, h, w = x.type.shape
        if to_depth:
            perm = (
                (0, 3, 5, 1, 2, 4) if attr(rd, node, "mode", "DCR") == "DCR" else (0, 1, 3, 5, 2, 4)
            )
            y = rd.b.call("Reshape", x, shape=(n, c, h // s, s, w // s, s), name="blocks")
            y = rd.b.call("Transpose", y, perm=perm, name="moved")
            return [rd.call("Reshape", y, shape=(n, c * s * s, h // s, w // s))]
        if attr(rd, node, "mode", "DCR") == "DCR":
            y = rd.b.call("Reshape", x, shape=(n, s, s, c // (s * s), h, w), name="blocks")
            y = rd.b.call("Transpose", y, perm=(0, 3, 4, 1, 5, 2), name="moved")
        else:
            y = rd.b.call("Reshape", x, shape=(n, c // (s * s), s, s, h, w), name="blocks")
            y = rd.b.call("Transpose", y, perm=(0, 1, 4, 2, 5, 3), name="moved")
        return [rd.call("Reshape", y, shape=(n, c // (s * s), h * s, w * s))]

    return read


def _pad(rd, node):
    x = rd.input(node, 0)
    rank = x.type.rank
    pads = ints(rd.static(node, 1))
    value = rd.static(node, 2)
    axes = ints(rd.static(node, 3)) if len(node.input) > 3 and node.input[3] else list(range(rank))
    axes = [axis_of(a, rank) for a in axes]
    if len(pads) != 2 * len(axes):
        raise Refused(f"{len(pads)} pads for {len(axes)} axes")
    mode = attr(rd, node, "mode", "constant")
    fill = 0 if value is None or not value.size else value.reshape(-1)[0].item()
    todo = [(a, pads[k], pads[k + len(axes)]) for k, a in enumerate(axes)]
    todo = [(a, before, after) for a, before, after in todo if before or after]
    y = x
    for k, (axis, before, after) in enumerate(todo):
        y = pad_axis(rd, y, axis, before, after, mode, fill, last=k == len(todo) - 1)
    return [y if todo else rd.call("Identity", x)]


def pad_axis(rd, x, axis: int, before: int, after: int, mode: str, fill, last: bool = False):
    """``x`` padded (or cut, for negative pads) along ``axis`` as ONNX's Pad ``mode`` does
    (the last op named after the node's result when ``last``)."""
    n = x.type.shape[axis]
    emit = rd.call if last else lambda *a, **kw: rd.b.call(*a, name="pad", **kw)
    if before < 0 or after < 0:
        start, end = max(-before, 0), n - max(-after, 0)
        before, after = max(before, 0), max(after, 0)
        if not before and not after:
            return emit("Slice", x, axis=axis, start=start, end=end)
        x = rd.b.call("Slice", x, axis=axis, start=start, end=end, name="cut")
        n = x.type.shape[axis]
    if mode == "constant":
        if isinstance(fill, float) and math.isnan(fill):
            raise Refused("a NaN pad value")
        return emit("Pad", x, axis=axis, before=before, after=after, value=fill)
    if mode not in ("reflect", "edge", "wrap") or n == 0:
        raise Refused(f"mode {mode!r} on an axis of {n}")
    if mode == "reflect" and (before >= n or after >= n):
        raise Refused("reflect pads as long as the axis")
    picks = {
        "edge": lambda i: min(max(i, 0), n - 1),
        "wrap": lambda i: i % n,
        "reflect": lambda i: -i if i < 0 else (2 * (n - 1) - i if i >= n else i),
    }[mode]
    index = np.asarray([picks(i) for i in range(-before, n + after)], np.int64)
    key = f"{rd.node.output[0]}::pad{axis}"
    rd.constants[key] = index
    out = (*x.type.shape[:axis], index.size, *x.type.shape[axis + 1 :])
    return take(rd, x, axis, rd.tensor(key), out, last)


def _cumsum(rd, node):
    x = rd.input(node, 0)
    axis = axis_of(ints(rd.static(node, 1))[0], x.type.rank)
    n = x.type.shape[axis]
    exclusive, reverse = attr(rd, node, "exclusive", 0), attr(rd, node, "reverse", 0)
    # y[..., j] = sum over i of x[..., i] * m[i, j], m[i, j] = 1 where i counts toward j
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    take_ = (i >= j if reverse else i <= j) & ((i != j) if exclusive else True)
    key = f"{rd.node.output[0]}::cumulative"
    rd.constants[key] = take_.astype(x.type.dtype.numpy)
    last = x.type.rank - 1
    if last == 0:  # a vector: a row of a matrix
        row = rd.b.call("Reshape", x, shape=(1, n), name="row")
        y = rd.b.call("MatMul", row, rd.tensor(key), name="cumsum")
        return [rd.call("Reshape", y, shape=(n,))]
    moved = x if axis == last else rd.b.call("Transpose", x, perm=_swap(x.type.rank, axis))
    if axis == last:
        return [rd.call("MatMul", moved, rd.tensor(key))]
    y = rd.b.call("MatMul", moved, rd.tensor(key), name="cumsum")
    return [rd.call("Transpose", y, perm=_swap(x.type.rank, axis))]


def _swap(rank: int, axis: int) -> tuple[int, ...]:
    perm = list(range(rank))
    perm[axis], perm[-1] = perm[-1], perm[axis]
    return tuple(perm)


RULES: dict[str, Rule] = {
    "Reshape": Rule(_reshape, static=(1,)),
    "Flatten": Rule(_flatten),
    "Squeeze": Rule(_squeeze, static=(1,)),
    "Unsqueeze": Rule(_unsqueeze, static=(1,)),
    "Transpose": Rule(_transpose),
    "Expand": Rule(_expand, static=(1,)),
    "Concat": Rule(_concat),
    "Split": Rule(_split, static=(1,)),
    "Slice": Rule(_slice, static=(1, 2, 3, 4)),
    "Gather": Rule(_gather),
    "GatherElements": Rule(_gather_elements),
    "Tile": Rule(_tile, static=(1,)),
    "Dropout": Rule(_dropout, static=(1, 2)),
    "Shape": Rule(_shape),
    "Size": Rule(lambda rd, node: [np.asarray(rd.input(node, 0).type.num_elements, np.int64)]),
    "ConstantOfShape": Rule(_constant_of_shape, static=(0,)),
    "EyeLike": Rule(_eye_like),
    "Trilu": Rule(_trilu, static=(1,)),
    "SpaceToDepth": Rule(_space_depth(to_depth=True)),
    "DepthToSpace": Rule(_space_depth(to_depth=False)),
    "Pad": Rule(_pad, static=(1, 2, 3)),
    "CumSum": Rule(_cumsum, static=(1,)),
}
