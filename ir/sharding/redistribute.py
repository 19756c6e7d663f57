"""Redistribution: turning one layout into another with collectives, and what that costs.

Per mesh axis (``P`` and ``S`` axes folded from the last mesh axis to the
first, so that nested shards come apart inner-first):

========================  ================================================
``P(op) -> R``            all-reduce over the mesh axis's groups
``P(op) -> S(j)``         reduce-scatter
``S(i) -> R``             all-gather
``S(i) -> S(j)``          all-to-all (equal blocks only; else gather + slice)
``R -> S(j)``             local slice (no communication)
========================  ================================================

A fixed-block shard ``S(j, b)`` is never made by a reduce-scatter or an all-to-all
(their blocks are balanced): all-reduce or all-gather, then slice.

Times come from ``ir.collectives.collective_time_s`` on the given topology
(groups along one mesh axis run in parallel: the step takes the slowest).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..builder import FunctionBuilder
from ..collectives import collective_time_s
from ..device import Topology
from ..types import TensorType, TupleType, Type
from ..value import Value
from .errors import PropagationError
from .mesh import Layout, Mesh, Partial, Placement, R, Replicate, Shard, block_shapes


@dataclass(frozen=True, init=False)
class Step:
    """One collective (or local slice) along one mesh axis."""

    kind: str  # allgather | allreduce | reducescatter | alltoall | slice
    axis: int
    src: Placement
    dst: Placement

    def __init__(self, kind: str, axis: int, src: Placement, dst: Placement) -> None:
        # Item stores, not object.__setattr__ per field: plans of a new mesh make many.
        d = self.__dict__
        d["kind"] = kind
        d["axis"] = axis
        d["src"] = src
        d["dst"] = dst


class DistValue:
    """A logical value of the distributed program, held either way the emission made it:
    as its per-device tuple (``whole``, one element per mesh device, the form ``Pmap``
    results and collectives take) or as one local Value per mesh device (``locals``,
    what a per-device op reads). :meth:`whole_in` and :meth:`locals_in` add the one
    ``MakeTuple`` / ``TupleGet`` s that give the other form, once."""

    __slots__ = ("_locals", "_whole", "layout", "name", "type")

    def __init__(
        self,
        locals: tuple[Value, ...] | None,
        layout: Layout,
        type: Type,
        whole: Value | None = None,
        name: str | None = None,
    ) -> None:
        if locals is None and whole is None:
            raise ValueError("a DistValue needs its locals or its per-device tuple")
        self._locals = locals
        self._whole = whole
        self.layout = layout
        self.type = type  # the logical (whole) type
        if name is None:
            name = whole.name if whole is not None else locals[0].name.rsplit("_", 1)[0]
        self.name = name

    @property
    def shape(self) -> tuple[int, ...]:
        return _elem(self.type).shape

    @property
    def locals(self) -> tuple[Value, ...]:
        """The per-device Values, once :meth:`locals_in` made them (halo exchanges)."""
        if self._locals is None:
            raise PropagationError(f"{self.name}: its per-device values were never unpacked")
        return self._locals

    @property
    def local_types(self) -> tuple[Type, ...]:
        """The type each mesh device holds, without adding an op."""
        if self._locals is not None:
            return tuple(v.type for v in self._locals)
        return self._whole.type.elements  # type: ignore[union-attr]

    def whole_in(self, b: FunctionBuilder) -> Value:
        """The per-device tuple (made by one ``MakeTuple`` the first time it is needed)."""
        if self._whole is None:
            self._whole = b.call("MakeTuple", *self._locals, name=self.name)
        return self._whole

    def locals_in(self, b: FunctionBuilder, suffixes: Sequence[str]) -> tuple[Value, ...]:
        """One Value per mesh device (``TupleGet`` s the first time they are needed)."""
        if self._locals is None:
            self._locals = b.unpack(self._whole, [self.name + s for s in suffixes])
        return self._locals


def _elem(t: Type) -> TensorType:
    return _elem(t.elements[0]) if isinstance(t, TupleType) else t  # type: ignore[return-value]


def local_types(t: Type, layout: Layout) -> list[Type]:
    """The type each mesh device holds of a logical value of type ``t``."""
    return list(_local_types(t, layout))


@functools.lru_cache(maxsize=1 << 12)
def _local_types(t: Type, layout: Layout) -> tuple[Type, ...]:
    # Memoised (types and layouts are frozen): propagation asks it the same questions
    # for every strategy of every op of every layer.
    devices = layout.mesh.devices
    if isinstance(t, TensorType):  # the common case: one table of block shapes
        shapes = layout.local_shapes(t.shape)
        return tuple([TensorType(s, t.dtype, d) for s, d in zip(shapes, devices)])

    def one(x: Type, i: int, d: int) -> Type:
        if isinstance(x, TupleType):
            return TupleType(tuple(one(e, i, d) for e in x.elements))
        return TensorType(layout.local_shapes(x.shape)[i], x.dtype, d)

    return tuple(one(t, i, d) for i, d in enumerate(devices))


def plan(shape: Sequence[int], src: Layout, dst: Layout) -> list[Step]:
    """The steps that turn ``src`` into ``dst`` (same mesh)."""
    return list(_plan(tuple(shape), src, dst))


@functools.lru_cache(maxsize=1 << 12)
def _plan(shape: tuple[int, ...], src: Layout, dst: Layout) -> tuple[Step, ...]:
    # Memoised (shapes and layouts are frozen; errors are not kept): propagation costs
    # the same redistributions for every strategy of every op of every layer.
    if src.mesh != dst.mesh:
        raise PropagationError(f"cannot redistribute between meshes {src.mesh} and {dst.mesh}")
    try:
        return _steps(shape, src.mesh.shape, src.placements, dst.placements)
    except _StuckError as e:
        raise PropagationError(
            f"no redistribution from {src} to {dst} (stuck at {e.args[0]})"
        ) from None


class _StuckError(Exception):
    """``_steps`` found no way; ``_plan`` says so with the layouts' texts."""


@functools.lru_cache(maxsize=1 << 14)
def _steps(
    shape: tuple[int, ...],
    mesh_shape: tuple[int, ...],
    src: tuple[Placement, ...],
    dst: tuple[Placement, ...],
) -> tuple[Step, ...]:
    # A function of the mesh's shape, not its devices: memoised across meshes. Runs once
    # per question of a new mesh's propagation, so written for speed: shard axes are read
    # from a list kept beside the placements (None where a placement is no shard).
    cur, want = _normal(src, len(shape)), _normal(dst, len(shape))
    ndim = len(mesh_shape)
    cur_dims = [p.dim if type(p) is Shard else None for p in cur]
    want_dims = [p.dim if type(p) is Shard else None for p in want]
    steps: list[Step] = []

    def sharded_elsewhere(dim: int, k: int) -> bool:
        return cur_dims.count(dim) > (cur_dims[k] == dim)  # on an axis other than k

    def pending_outer(dim: int | None, k: int) -> bool:
        # An outer axis still to shard ``dim``: sharding it on k first would nest the
        # blocks inner-first (found by fuzzing: a reduce-scatter on the inner axis, then a
        # slice on the outer one, gave [S(0), S(0)] in the wrong row order).
        return any(want_dims[m] == dim and cur[m] != want[m] for m in range(k))

    # Axes whose shard must be undone because an outer axis needs to re-slice that dim.
    for k in reversed(range(ndim)):
        c, w = cur[k], want[k]
        c_dim = cur_dims[k]
        inner_block = False
        if c_dim is not None:
            for m in range(k):
                if want_dims[m] == c_dim and cur[m] != want[m]:
                    inner_block = True
                    break
        if not inner_block and (c is w or c == w):
            continue
        if isinstance(c, Partial):
            # a reduce-scatter keeps balanced blocks; fixed blocks: all-reduce, then slice
            if (
                want_dims[k] is not None
                and not sharded_elsewhere(want_dims[k], k)
                and not pending_outer(want_dims[k], k)
                and w.block is None  # type: ignore[union-attr]
            ):
                steps.append(Step("reducescatter", k, c, w))
                cur[k], cur_dims[k] = w, want_dims[k]
            else:
                steps.append(Step("allreduce", k, c, R))
                cur[k], cur_dims[k] = R, None
        elif c_dim is not None:
            w_dim = want_dims[k]
            if (
                w_dim is not None
                and not inner_block
                and not sharded_elsewhere(c_dim, k)
                and not sharded_elsewhere(w_dim, k)
                and not pending_outer(w_dim, k)
                and c.block is None  # type: ignore[union-attr]
                and w.block is None  # type: ignore[union-attr]
                and _even_alltoall(shape, mesh_shape, cur, k, w_dim)
            ):
                steps.append(Step("alltoall", k, c, w))
                cur[k], cur_dims[k] = w, w_dim
            else:
                # Gather inner axes sharding the same dim first.
                for m in reversed(range(k + 1, ndim)):
                    if cur_dims[m] == c_dim:
                        steps.append(Step("allgather", m, cur[m], R))
                        cur[m], cur_dims[m] = R, None
                steps.append(Step("allgather", k, c, R))
                cur[k], cur_dims[k] = R, None
        elif isinstance(w, Partial):
            raise PropagationError(f"cannot make a Partial ({w}) value out of {c}")
    for k in range(ndim):
        if isinstance(cur[k], Replicate) and want_dims[k] is not None:
            steps.append(Step("slice", k, R, want[k]))
            cur[k], cur_dims[k] = want[k], want_dims[k]
    if cur != want:
        raise _StuckError(cur)
    return tuple(steps)


def _normal(placements: tuple[Placement, ...], rank: int) -> list[Placement]:
    """``Layout.normalized``'s placements: shard axes taken modulo the rank."""
    if rank and any(type(p) is Shard and not 0 <= p.dim < rank for p in placements):
        return [replace(p, dim=p.dim % rank) if isinstance(p, Shard) else p for p in placements]
    return list(placements)


def _even_alltoall(shape, mesh_shape, cur, k: int, dim: int) -> bool:
    blocks = block_shapes(shape, mesh_shape, tuple(cur))
    first = blocks[0]
    return all(b == first for b in blocks) and first[dim] % mesh_shape[k] == 0


def _after(layout: Layout, step: Step) -> Layout:
    return Layout(layout.mesh, _after_placements(layout.placements, step))


def _after_placements(placements: tuple[Placement, ...], step: Step) -> tuple[Placement, ...]:
    ps = list(placements)
    ps[step.axis] = step.dst
    return tuple(ps)


_COLLECTIVE = {
    "allgather": "allgather",
    "allreduce": "allreduce",
    "reducescatter": "reducescatter",
    "alltoall": "alltoall",
}


def step_bytes(t: Type, layout: Layout, step: Step) -> int:
    """Bytes the collective of ``step`` moves per group (``collective_time_s``'s size)."""
    if step.kind == "slice":
        return 0
    ps = layout.placements
    if step.kind == "allgather":
        ps = _after_placements(ps, step)
    return _largest_block_bytes(t, layout.mesh.shape, ps)


@functools.lru_cache(maxsize=1 << 14)
def _largest_block_bytes(
    t: Type, mesh_shape: tuple[int, ...], placements: tuple[Placement, ...]
) -> int:
    """The largest block's bytes over the mesh's devices (a function of the mesh's shape)."""
    return max(_block_bytes(t, mesh_shape, placements))


def _block_bytes(
    t: Type, mesh_shape: tuple[int, ...], placements: tuple[Placement, ...]
) -> list[int]:
    # Per device (mesh order), ``size_bytes`` of its block: a tuple's adds its elements'.
    if isinstance(t, TupleType):
        total = [0] * math.prod(mesh_shape)
        for e in t.elements:
            total = [a + b for a, b in zip(total, _block_bytes(e, mesh_shape, placements))]
        return total
    item = t.dtype.itemsize_bytes
    return [math.prod(s) * item for s in block_shapes(t.shape, mesh_shape, placements)]


def step_time_s(t: Type, layout: Layout, step: Step, topology: Topology) -> float:
    return RedistributionCosts(topology).step_time_s(t, layout, step)


def plan_time_s(t: Type, src: Layout, dst: Layout, topology: Topology) -> float:
    """Predicted time of redistributing a value of type ``t`` from ``src`` to ``dst``."""
    return RedistributionCosts(topology).plan_time_s(t, src, dst)


class RedistributionCosts:
    """``step_time_s`` and ``plan_time_s`` on one topology, memoised.

    A step's time depends only on its collective, its size and its mesh axis (the
    groups along it), so the many steps that propagation costs (every strategy of
    every op) ask few distinct questions of ``collective_time_s``.
    """

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self._collective_s: dict[tuple, float] = {}

    def step_time_s(self, t: Type, layout: Layout, step: Step) -> float:
        if step.kind == "slice":
            return 0.0
        return self._time_s(step.kind, step_bytes(t, layout, step), layout.mesh, step.axis)

    def _time_s(self, kind: str, size: int, mesh: Mesh, axis: int) -> float:
        key = (kind, size, mesh, axis)
        found = self._collective_s.get(key)
        if found is None:
            found = self._collective_s[key] = max(
                collective_time_s(_COLLECTIVE[kind], size, group, self.topology)
                for group in mesh.groups(axis)
            )
        return found

    def plan_time_s(self, t: Type, src: Layout, dst: Layout) -> float:
        total, ps, mesh = 0.0, src.placements, src.mesh
        for step in _plan(_elem(t).shape, src, dst):
            after = _after_placements(ps, step)
            if step.kind != "slice":
                size = _largest_block_bytes(
                    t, mesh.shape, after if step.kind == "allgather" else ps
                )
                total += self._time_s(step.kind, size, mesh, step.axis)
            ps = after
        return total
