"""Ops of sharded and ranked programs, and the layout arithmetic they share.

A *layout* places a logical tensor on a device mesh: one placement per mesh
axis, spelled as text so that attributes stay plain data: ``"S(i)"`` shards
tensor axis ``i`` over that mesh axis, ``"R"`` replicates, ``"P(sum)"`` (or
``max``, ``min``, ``mean``) holds partial values still to be reduced. Mesh
coordinates are flattened row-major (the last mesh axis varies fastest), and
uneven shards follow ``communication.split_sizes``: the first ``n % k`` shards
get one element more; ``"S(i, b)"`` asks instead for fixed blocks of ``b`` with a
short tail (``communication.block_sizes``: 66 over 2 is 64 + 2). Two mesh axes
may shard the same tensor axis; the lower mesh axis splits first (outer), the
higher one splits each piece again.

Ops:

* ``Shard(x, ...)`` / ``Unshard(xs, ...)``: distribute a tensor onto the mesh
  by a layout (a tuple in device order) and put it back together.
* ``SendTo(x, peer, tag)`` / ``RecvFrom(peer, tag, shape, ...)``: one-sided
  point-to-point halves of ranked (per-device) programs, and
  ``RankCollective(x, kind, group, ...)``: one rank's part of a collective.
  Outside ``ir.sharding.run_ranked`` (which supplies the peers' data) a rank
  has no peers: ``RecvFrom`` and ``Collective`` then return zeros.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Sequence

import numpy as np

from .. import attr_kinds as kinds
from ..collectives import Collective
from ..errors import TypeRuleError
from ..registry import Attr, CostContext, OpDef, OpKind, TypeContext, attach_rule, register_op
from ..types import DType, TensorType, TupleType
from ._common import memory_cost, tensor
from ._examples import ctx, t
from .communication import REDUCTIONS, shard_sizes

_PLACEMENT = re.compile(r"\s*(?:(R)|S\(\s*(-?\d+)\s*(?:,\s*(\d+)\s*)?\)|P\(\s*(\w+)\s*\))\s*\Z")


def parse_placement(text: str) -> tuple[str, int | str | None]:
    """``"S(1)"`` -> ``("S", 1)``, ``"R"`` -> ``("R", None)``, ``"P(sum)"`` -> ``("P", "sum")``;
    ``"S(1, 64)"`` -> ``("S", 1)`` too (its block: :func:`shard_block`)."""
    m = _match(text)
    if m.group(1):
        return ("R", None)
    if m.group(2) is not None:
        return ("S", int(m.group(2)))
    if m.group(4) not in REDUCTIONS:
        raise TypeRuleError(f"partial placement {text!r}: reduction must be one of {REDUCTIONS}")
    return ("P", m.group(4))


def _match(text: str) -> re.Match:
    m = _PLACEMENT.match(str(text))
    if not m:
        raise TypeRuleError(
            f"placement {text!r} is not one of S(i), S(i, block), R, P(sum|max|min|mean)"
        )
    return m


def shard_block(text: str) -> int | None:
    """The block of ``"S(i, b)"`` (fixed blocks of ``b``, a short tail), None otherwise."""
    m = _match(text)
    if m.group(3) is None:
        return None
    block = int(m.group(3))
    if block < 1:
        raise TypeRuleError(f"placement {text!r}: the block must be positive")
    return block


def mesh_coords(mesh_shape: Sequence[int]) -> list[tuple[int, ...]]:
    """Every mesh coordinate, row-major: the order of devices in a layout."""
    return list(itertools.product(*(range(n) for n in mesh_shape)))


def local_bounds(
    shape: Sequence[int], mesh_shape: Sequence[int], placements: Sequence[str], coord: Sequence[int]
) -> list[tuple[int, int]]:
    """``[start, stop)`` of the block the device at ``coord`` holds, per tensor axis."""
    bounds = [(0, n) for n in shape]
    for k, p in enumerate(placements):
        kind, arg = parse_placement(p)
        if kind != "S":
            continue
        axis = int(arg)
        start, stop = bounds[axis]
        sizes = shard_sizes(stop - start, mesh_shape[k], shard_block(p))
        offset = start + sum(sizes[: coord[k]])
        bounds[axis] = (offset, offset + sizes[coord[k]])
    return bounds


def local_shape(
    shape: Sequence[int], mesh_shape: Sequence[int], placements: Sequence[str], coord: Sequence[int]
) -> tuple[int, ...]:
    """The shape of the block the device at ``coord`` holds."""
    return tuple(b - a for a, b in local_bounds(shape, mesh_shape, placements, coord))


def check_layout(
    shape: Sequence[int], mesh_shape: Sequence[int], placements: Sequence[str]
) -> None:
    """Raise a TypeRuleError naming the rule an impossible layout breaks."""
    if len(placements) != len(mesh_shape):
        raise TypeRuleError(
            f"{len(placements)} placement(s) {list(placements)} for a {len(mesh_shape)}-D mesh "
            f"{list(mesh_shape)}: give one placement per mesh axis"
        )
    pieces = list(shape)
    for k, p in enumerate(placements):
        kind, arg = parse_placement(p)
        if kind != "S":
            continue
        if not -len(shape) <= int(arg) < len(shape):
            raise TypeRuleError(
                f"placement {p} on mesh axis {k}: tensor axis {arg} is out of range for a "
                f"rank-{len(shape)} tensor of shape {tuple(shape)}"
            )
        axis = int(arg) % len(shape)
        if mesh_shape[k] > pieces[axis]:
            raise TypeRuleError(
                f"placement {p} on mesh axis {k}: {mesh_shape[k]} shards of an axis with "
                f"{pieces[axis]} element(s) would leave empty shards (more shards than elements)"
            )
        pieces[axis] = shard_sizes(pieces[axis], mesh_shape[k], shard_block(p))[-1]


def _normal(placements: Sequence[str], rank: int) -> list[str]:
    out = []
    for p in placements:
        kind, arg = parse_placement(p)
        if kind == "S":
            block = shard_block(p)
            axis = int(arg) % max(rank, 1)
            out.append(f"S({axis})" if block is None else f"S({axis}, {block})")
        else:
            out.append(p)
    return out


def shard_array(x: np.ndarray, mesh_shape: Sequence[int], placements: Sequence[str]) -> list:
    """The block of ``x`` each device holds, in row-major mesh order.

    A ``P(sum)`` (or ``P(mean)``) axis puts ``x`` on its first coordinate and zeros
    elsewhere for sum, copies for the others, so that reducing gives ``x`` back.
    """
    placements = _normal(placements, x.ndim)
    parts = []
    for coord in mesh_coords(mesh_shape):
        bounds = local_bounds(x.shape, mesh_shape, placements, coord)
        block = x[tuple(slice(a, b) for a, b in bounds)].copy()
        for k, p in enumerate(placements):
            kind, arg = parse_placement(p)
            if kind == "P" and arg == "sum" and coord[k] != 0:
                block = np.zeros_like(block)
        parts.append(block)
    return parts


def unshard_arrays(
    parts: Sequence[np.ndarray], mesh_shape: Sequence[int], placements: Sequence[str]
) -> np.ndarray:
    """Put blocks (row-major mesh order) back together: concatenate, reduce, or pick one.

    Mesh axes are folded from the last to the first, so nested shards of one
    tensor axis concatenate inner pieces before outer ones.
    """
    rank = np.asarray(parts[0]).ndim
    placements = _normal(placements, rank)
    grid = np.empty(len(parts), dtype=object)
    for i, p in enumerate(parts):
        grid[i] = np.asarray(p)
    grid = grid.reshape(tuple(mesh_shape))
    for k in reversed(range(len(mesh_shape))):
        kind, arg = parse_placement(placements[k])
        folded = np.empty(grid.shape[:-1], dtype=object)
        for idx in np.ndindex(*grid.shape[:-1]):
            row = list(grid[idx])
            if kind == "S":
                folded[idx] = np.concatenate(row, axis=int(arg))
            elif kind == "P":
                out = row[0]
                for r in row[1:]:
                    out = REDUCTIONS[arg](out, r)
                folded[idx] = out / len(row) if arg == "mean" else out
            else:
                folded[idx] = row[0]
        grid = folded
    return np.asarray(grid[()])


# -- ops ---------------------------------------------------------------------------

MESH = Attr("mesh", doc="mesh shape, e.g. [2, 4]", kind=kinds.sequence_of(kinds.POS_INT, 1))
MESH_DEVICES = Attr("devices", doc="mesh devices, row-major", kind=kinds.DEVICES)
PLACEMENTS = Attr(
    "placements", doc='one per mesh axis: "S(i)", "R" or "P(sum)"', kind=kinds.PLACEMENTS
)


def mesh_attrs(c: TypeContext) -> tuple[tuple[int, ...], tuple, tuple[str, ...]]:
    mesh = tuple(int(n) for n in c.attributes["mesh"])
    devices = tuple(c.attributes["devices"])
    placements = tuple(str(p) for p in c.attributes["placements"])
    if not mesh or any(n < 1 for n in mesh):
        raise TypeRuleError(f"mesh shape {list(mesh)} must list positive sizes")
    if len(devices) != math.prod(mesh):
        raise TypeRuleError(
            f"a mesh of shape {list(mesh)} needs {math.prod(mesh)} devices, got {list(devices)}"
        )
    if len(set(devices)) != len(devices):
        raise TypeRuleError(f"mesh devices list a device twice: {list(devices)}")
    return mesh, devices, placements


def _shard_types(c: TypeContext):
    x = tensor(c, 0, "x")
    mesh, devices, placements = mesh_attrs(c)
    check_layout(x.shape, mesh, placements)
    placements = _normal(placements, x.rank)
    return [
        TupleType(
            tuple(
                TensorType(local_shape(x.shape, mesh, placements, coord), x.dtype, d)
                for coord, d in zip(mesh_coords(mesh), devices)
            )
        )
    ]


def _unshard_types(c: TypeContext):
    xs = c.input_types[0]
    mesh, devices, placements = mesh_attrs(c)
    if not isinstance(xs, TupleType) or len(xs) != len(devices):
        raise TypeRuleError(f"Unshard needs a tuple of {len(devices)} tensors, got {xs}")
    shape = tuple(int(n) for n in c.attributes["shape"])
    check_layout(shape, mesh, placements)
    placements = _normal(placements, len(shape))
    for coord, e in zip(mesh_coords(mesh), xs.elements):
        want = local_shape(shape, mesh, placements, coord)
        if not isinstance(e, TensorType) or e.shape != want:
            raise TypeRuleError(f"block at mesh coordinate {coord} is {e}, the layout says {want}")
    return [TensorType(shape, xs.elements[0].dtype, c.attributes["to_device"])]


_LAYOUT_EXAMPLES = [
    (t(4, 6), [2], (1, 2), ["S(0)"]),
    (t(5, 3), [2, 2], (0, 1, 2, 3), ["S(0)", "R"]),
    (t(4, 6), [2, 2], (0, 1, 2, 3), ["S(1)", "P(sum)"]),
]


def scaled_layout_examples(s: int):
    return [
        (x.with_shape(tuple(n * s for n in x.shape)), m, d, p) for x, m, d, p in _LAYOUT_EXAMPLES
    ]


def layout_contexts(s: int) -> list:
    """Registry-walk examples for an op on one tensor and a layout (mesh, devices, placements)."""
    return [ctx(x, mesh=m, devices=d, placements=p) for x, m, d, p in scaled_layout_examples(s)]


register_op(
    OpDef(
        name="Shard",
        operands=("x",),
        results=("xs",),
        type_rule=_shard_types,
        kernel=lambda xs, a: [tuple(shard_array(xs[0], a["mesh"], a["placements"]))],
        cost_rule=memory_cost,
        attributes=(MESH, MESH_DEVICES, PLACEMENTS),
        kind=OpKind.COMMUNICATION,
        doc="Distribute x onto a device mesh by a layout; a tuple of blocks in device order.",
        extra={"examples": layout_contexts},
    )
)


def _unshard_examples(s: int):
    out = []
    for x, m, d, p in scaled_layout_examples(s):
        (xs,) = _shard_types(ctx(x, mesh=m, devices=d, placements=p))
        out.append(ctx(xs, mesh=m, devices=d, placements=p, shape=x.shape, to_device=0))
    return out


register_op(
    OpDef(
        name="Unshard",
        operands=("xs",),
        results=("x",),
        type_rule=_unshard_types,
        kernel=lambda xs, a: [unshard_arrays(xs[0], a["mesh"], a["placements"])],
        cost_rule=memory_cost,
        attributes=(
            MESH,
            MESH_DEVICES,
            PLACEMENTS,
            Attr("shape", doc="shape of the whole tensor", kind=kinds.SHAPE),
            Attr("to_device", None, "device of the result", kind=kinds.DEVICE),
        ),
        kind=OpKind.COMMUNICATION,
        doc="Assemble a tensor from its blocks on a mesh: concatenate S, reduce P, pick one R.",
        extra={"examples": _unshard_examples},
    )
)

# -- ranked (per-device) communication ------------------------------------------------

_PEER = Attr("peer", doc="the other rank (device)", kind=kinds.DEVICE)
_TAG = Attr("tag", 0, "matches a send with its receive", kind=kinds.NONNEG_INT)
COLLECTIVE_KINDS = ("allreduce", "allgather", "reducescatter", "alltoall")


def _dtype(name) -> DType:
    return name if isinstance(name, DType) else DType(name)


def _recv_types(c: TypeContext):
    a = c.attributes
    return [TensorType(tuple(int(n) for n in a["shape"]), _dtype(a["dtype"]), a["device"])]


register_op(
    OpDef(
        name="SendTo",
        operands=("x",),
        results=("sent",),
        type_rule=lambda c: [tensor(c, 0, "x")],
        kernel=lambda xs, a: [xs[0]],
        cost_rule=memory_cost,
        attributes=(_PEER, _TAG),
        kind=OpKind.COMMUNICATION,
        doc="Send x to rank peer (blocks until peer receives); returns x for ordering.",
        extra={
            "examples": lambda s: [ctx(t(2 * s, 3), peer=1), ctx(t(s, device=1), peer=0)],
            "rank_parameters": ("peer", "tag"),
        },
    )
)

register_op(
    OpDef(
        name="RecvFrom",
        operands=(),
        results=("x",),
        type_rule=_recv_types,
        kernel=lambda xs, a: [np.zeros(tuple(a["shape"]), _dtype(a["dtype"]).numpy)],
        cost_rule=memory_cost,
        attributes=(
            _PEER,
            _TAG,
            Attr("shape", doc="shape of the received tensor", kind=kinds.SHAPE),
            Attr("dtype", "float32", "element type", kind=kinds.DTYPE),
            Attr("device", None, "this rank", kind=kinds.DEVICE),
        ),
        kind=OpKind.COMMUNICATION,
        doc="Receive a tensor sent by rank peer (zeros when run without peers).",
        extra={
            "examples": lambda s: [
                ctx(peer=1, shape=(2 * s, 3), device=0),
                ctx(peer=0, tag=3, shape=(s,), device=1),
            ],
            "rank_parameters": ("peer", "tag"),
        },
    )
)


def _collective_types(c: TypeContext):
    x = tensor(c, 0, "x")
    if c.attributes["kind"] not in COLLECTIVE_KINDS:
        raise TypeRuleError(f"kind must be one of {COLLECTIVE_KINDS}, got {c.attributes['kind']!r}")
    if x.device is not None and x.device not in tuple(c.attributes["group"]):
        raise TypeRuleError(f"rank {x.device} is not in the group {list(c.attributes['group'])}")
    return [x.with_shape(tuple(int(n) for n in c.attributes["result_shape"]))]


register_op(
    OpDef(
        name="RankCollective",
        operands=("x",),
        results=("y",),
        type_rule=_collective_types,
        kernel=lambda xs, a: [np.zeros(tuple(a["result_shape"]), xs[0].dtype)],
        cost_rule=memory_cost,
        attributes=(
            Attr(
                "kind",
                doc="allreduce, allgather, reducescatter or alltoall",
                kind=kinds.one_of(*COLLECTIVE_KINDS),
            ),
            Attr("group", doc="the ranks taking part, in order", kind=kinds.DEVICES),
            Attr("result_shape", doc="this rank's result shape", kind=kinds.SHAPE),
            Attr("op", "sum", "reduction of allreduce / reducescatter", kind=kinds.REDUCTION),
            Attr("dim", 0, "gathered / scattered axis (alltoall: split_dim)", kind=kinds.INT),
            Attr(
                "concat_dim",
                0,
                "alltoall: axis the received chunks are joined along",
                kind=kinds.INT,
            ),
            _TAG,
        ),
        kind=OpKind.COMMUNICATION,
        doc="This rank's part of a collective over group; all members must reach it.",
        extra={
            "examples": lambda s: [
                ctx(t(2 * s, 3), kind="allreduce", group=(0, 1), result_shape=(2 * s, 3)),
                ctx(t(s, 3), kind="allgather", group=(0, 1), result_shape=(2 * s, 3)),
            ],
            "rank_parameters": ("group", "tag"),
        },
    )
)

# -- communication cost rules (simulator) ------------------------------------------


def _shard_comm(c: CostContext) -> Collective:
    (x,), (xs,) = c.input_types, c.output_types
    devices = tuple(e.device for e in xs.elements)
    return Collective("scatter", x.size_bytes, devices, x.device)


def _unshard_comm(c: CostContext) -> Collective:
    (xs,), (x,) = c.input_types, c.output_types
    devices = tuple(e.device for e in xs.elements)
    return Collective("gather", x.size_bytes, devices, x.device)


def _send_to_comm(c: CostContext) -> Collective:
    (x,) = c.input_types
    peer = c.attributes["peer"]
    return Collective("send", x.size_bytes, (x.device, peer), peer)


def _recv_from_comm(c: CostContext) -> Collective:
    (x,) = c.output_types
    return Collective("send", x.size_bytes, (c.attributes["peer"], x.device), x.device)


def _rank_collective_comm(c: CostContext) -> Collective:
    (x,), (y,) = c.input_types, c.output_types
    group = tuple(c.attributes["group"])
    kind = c.attributes["kind"]
    full = {"allgather": y.size_bytes, "reducescatter": x.size_bytes}
    return Collective(kind, full.get(kind, x.size_bytes), group)


attach_rule("Shard", "comm_rule", _shard_comm)
attach_rule("Unshard", "comm_rule", _unshard_comm)
attach_rule("SendTo", "comm_rule", _send_to_comm)
attach_rule("RecvFrom", "comm_rule", _recv_from_comm)
attach_rule("RankCollective", "comm_rule", _rank_collective_comm)
