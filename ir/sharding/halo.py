"""Halo exchange: sharding a sliding-window op (``Conv2D``, pooling) along a window axis
(its height or its width: the rule lists each axis's window, stride and padding).

Each device computes the output rows its result layout gives it. For those it needs
input rows ``[o_start * stride - pad_top, (o_stop - 1) * stride + window - pad_top)``: what
it holds, plus boundary rows (the halo) from its neighbours along the mesh
axis, sent point to point (``Slice`` on the neighbour, ``Send``, ``Concat``),
plus zero rows where the window hangs over the image's edge (the local op's
explicit padding). This is seed 004's spatial Conv example, for any number of
devices and uneven blocks.
"""

from __future__ import annotations

from ..collectives import collective_time_s
from ..errors import VerifyError
from ..registry import get_op
from ..types import TensorType
from ..verify import infer_types
from .mesh import Layout, Shard


def _setup(op, rule, mesh, strategy):
    k = next(i for i, c in enumerate(strategy) if c[0] == "halo")
    h = rule.halo[strategy[k][1]]
    x = op.inputs[h["operand"]].type
    y = op.outputs[0].type
    return h, k, x, y


def _device_plan(op, rule, mesh, strategy, ins, outs, device):
    """(pieces [(source, start, stop) in the source's local rows], zero_top, zero_bottom)."""
    h, k, x, y = _setup(op, rule, mesh, strategy)
    axis, window, stride = h["axis"], h["window"], h.get("stride", 1)
    pad_top = h["pads"][0]
    xl, yl = Layout(mesh, ins[h["operand"]]), Layout(mesh, outs[0])
    o_start, o_stop = yl.local_bounds(y.shape, device)[h["result_axis"]]
    n = x.shape[axis]
    need_start = o_start * stride - pad_top
    need_stop = (o_stop - 1) * stride + window - pad_top
    zero_top, zero_bottom = max(0, -need_start), max(0, need_stop - n)
    lo_all, hi_all = max(0, need_start), min(n, need_stop)
    pieces = []
    for src in mesh.group(device, k):
        a, b = xl.local_bounds(x.shape, src)[axis]
        lo, hi = max(lo_all, a), min(hi_all, b)
        if lo < hi:
            pieces.append((src, lo - a, hi - a))
    return pieces, zero_top, zero_bottom


def exchange_time_s(op, rule, mesh, strategy, topology) -> float:
    """The slowest device's halo receives (sequential sends over its links)."""
    from .rules import placements_for

    ins, outs = placements_for(rule, strategy)  # type: ignore[misc]
    h, _, x, _ = _setup(op, rule, mesh, strategy)
    row_bytes = x.size_bytes // max(x.shape[h["axis"]], 1)
    worst = 0.0
    for d in mesh.devices:
        pieces, _, _ = _device_plan(op, rule, mesh, strategy, ins, outs, d)
        t = sum(
            collective_time_s("send", (stop - start) * row_bytes, (src, d), topology, d)
            for src, start, stop in pieces
            if src != d
        )
        worst = max(worst, t)
    return worst


def _extended(x: TensorType, axis: int, rows: int, device) -> TensorType:
    shape = list(x.shape)
    shape[axis] = rows
    return TensorType(tuple(shape), x.dtype, device)


def valid(op, rule, mesh, strategy, ins, outs) -> bool:
    """Whether every device can compute its rows (halo axis split by this mesh axis only)."""
    from .redistribute import local_types

    h, _, _, _ = _setup(op, rule, mesh, strategy)
    axis = h["axis"]
    if sum(1 for p in ins[h["operand"]] if isinstance(p, Shard) and p.dim == axis) != 1:
        return False
    opdef = get_op(op.op_type)
    per_operand = [local_types(v.type, Layout(mesh, ps)) for v, ps in zip(op.inputs, ins)]
    expected = local_types(op.outputs[0].type, Layout(mesh, outs[0]))
    for i, d in enumerate(mesh.devices):
        pieces, top, bottom = _device_plan(op, rule, mesh, strategy, ins, outs, d)
        if not pieces:
            return False
        rows = sum(stop - start for _, start, stop in pieces)
        local_in = [t[i] for t in per_operand]
        local_in[h["operand"]] = _extended(local_in[h["operand"]], axis, rows, d)
        attrs = h["local_attributes"](op.attributes, top, bottom)
        try:
            got, _ = infer_types(opdef, local_in, attrs)
        except VerifyError:
            return False
        if got[0].shape != expected[i].shape:
            return False
    return True


def emit(mat, op, rule, strategy, operands, expected) -> list[tuple]:
    """Append the exchange (all sends first, in destination order) and the local ops."""
    from .rules import placements_for

    ins, outs = placements_for(rule, strategy)  # type: ignore[misc]
    h, _, _, _ = _setup(op, rule, mesh := mat.mesh, strategy)
    b, axis, xi = mat.b, h["axis"], h["operand"]
    x_name = op.inputs[xi].name
    gathered, pads = [], []
    for d in mesh.devices:
        pieces, top, bottom = _device_plan(op, rule, mesh, strategy, ins, outs, d)
        parts = []
        for src, start, stop in pieces:
            v = operands[xi].locals[mesh.devices.index(src)]
            if (start, stop) != (0, v.type.shape[axis]):
                v = b.call("Slice", v, axis=axis, start=start, end=stop, name=f"{x_name}_halo{src}")
            if src != d:
                v = b.call("Send", v, to_device=d, name=f"{x_name}_from{src}_{d}")
            parts.append(v)
        gathered.append(parts)
        pads.append((top, bottom))
    results = []
    for i, d in enumerate(mesh.devices):
        parts = gathered[i]
        x_local = (
            parts[0]
            if len(parts) == 1
            else b.call("Concat", *parts, dim=axis, name=f"{x_name}_ext_{d}")
        )
        local_in = [x.locals[i] for x in operands]
        local_in[xi] = x_local
        attrs = h["local_attributes"](op.attributes, *pads[i])
        new = b.add_op(op.op_type, local_in, attrs, names=[f"{v.name}_{d}" for v in op.outputs])
        results.append(new.outputs)
    return results
