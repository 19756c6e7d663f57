"""Device meshes, placements (``S(i)``, ``R``, ``P(sum)``) and layouts (DTensor specs).

A :class:`Layout` is a mesh plus one placement per mesh axis (seed 004's
DTensor): ``S(i)`` shards tensor axis ``i`` over that mesh axis, ``R``
replicates, ``P(op)`` holds partial values still to be reduced with ``op`` (the
RFC's ``I_SUM``). Devices are listed row-major over the mesh. Uneven shards
follow ``ir.ops.communication.split_sizes``: the first ``n % k`` shards get one
element more; ``S(i, block=b)`` (text ``"S(i, b)"``) is the RFC's other
convention, fixed blocks of ``b`` with a short tail (66 over 2 in blocks of 64:
64 + 2).

>>> import numpy as np
>>> layout = Layout(Mesh((2,), (0, 1)), (S(0),))
>>> [p.tolist() for p in layout.split(np.array([[1, 2], [3, 4], [5, 6]]))]
[[[1, 2], [3, 4]], [[5, 6]]]
"""

from __future__ import annotations

import functools
import itertools
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from ..errors import TypeRuleError
from ..limits import MAX_DEVICES
from ..ops import p2p
from ..ops.communication import shard_sizes
from .errors import AnnotationError, MeshError


def _whole_numbers(what: str, items: object) -> tuple[int, ...]:
    """``items`` as a tuple of ints (numpy integers too); else a MeshError naming ``what``.
    ``int()`` would read 1.5 as 1, True as 1 and "8" as 8."""
    if isinstance(items, str | bytes) or not isinstance(items, Sequence | np.ndarray):
        raise MeshError(f"{what} must be a sequence of integers, got {items!r}")
    out = []
    for n in items:
        if isinstance(n, bool) or not isinstance(n, numbers.Integral):
            raise MeshError(f"{what} must hold integers, got {n!r} in {list(items)!r}")
        out.append(int(n))
    return tuple(out)


@dataclass(frozen=True)
class Mesh:
    """An n-dimensional grid of devices; ``devices`` lists them row-major.

    >>> Mesh((2, 2), (0, 1, 2, 3)).group(1, axis=0)
    (1, 3)
    """

    shape: tuple[int, ...]
    devices: tuple[int, ...] = ()

    def __init__(self, shape: Sequence[int], devices: Sequence[int] | None = None) -> None:
        single = isinstance(shape, numbers.Integral) and not isinstance(shape, bool)
        shape = _whole_numbers("mesh shape", (shape,) if single else shape)
        if not shape or any(n < 1 for n in shape):
            raise MeshError(f"mesh shape {list(shape)} must list positive sizes")
        if math.prod(shape) > MAX_DEVICES:  # checked before a device list of that size is made
            raise MeshError(
                f"a mesh of shape {list(shape)} holds {math.prod(shape)} devices, more than "
                f"the limit {MAX_DEVICES} (ir.limits.MAX_DEVICES)"
            )
        if devices is None:
            devices = tuple(range(math.prod(shape)))
        devices = _whole_numbers("mesh devices", devices)
        if len(devices) != math.prod(shape):
            raise MeshError(
                f"a mesh of shape {list(shape)} holds {math.prod(shape)} devices, "
                f"but {len(devices)} are listed: {list(devices)}"
            )
        beyond = [d for d in devices if not 0 <= d < MAX_DEVICES]
        if beyond:
            raise MeshError(
                f"mesh devices must be device ids, integers from 0 to {MAX_DEVICES - 1}; got "
                f"{beyond[0]} in {list(devices)[:8]}{' ...' if len(devices) > 8 else ''}"
            )
        if len(set(devices)) != len(devices):
            raise MeshError(f"mesh devices list a device twice: {list(devices)}")
        object.__setattr__(self, "shape", shape)
        object.__setattr__(self, "devices", devices)
        coords = p2p.mesh_coords(shape)
        # Derived lookups (not fields: equality and hashing use shape and devices only).
        object.__setattr__(self, "_coords", coords)
        object.__setattr__(self, "_coord_of", dict(zip(devices, coords)))
        object.__setattr__(self, "_groups", {})
        object.__setattr__(self, "_hash", hash((shape, devices)))

    def __hash__(self) -> int:
        # Hashed once: every layout question propagation memoises hashes its mesh.
        return self._hash  # type: ignore[attr-defined]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return len(self.devices)

    def coords(self) -> list[tuple[int, ...]]:
        """Mesh coordinates in device order."""
        return list(self._coords)  # type: ignore[attr-defined]

    def coord_of(self, device: int) -> tuple[int, ...]:
        try:
            return self._coord_of[device]  # type: ignore[attr-defined]
        except KeyError:
            raise MeshError(f"device {device} is not in the mesh {list(self.devices)}") from None

    def device_at(self, coord: Sequence[int]) -> int:
        index = 0
        for c, n in zip(coord, self.shape, strict=True):
            if not 0 <= c < n:
                raise MeshError(f"coordinate {list(coord)} is outside the mesh {list(self.shape)}")
            index = index * n + c
        return self.devices[index]

    def group(self, device: int, axis: int) -> tuple[int, ...]:
        """The devices along mesh ``axis`` through ``device`` (its communication group)."""
        coord = list(self.coord_of(device))
        out = []
        for i in range(self.shape[axis]):
            coord[axis] = i
            out.append(self.device_at(coord))
        return tuple(out)

    def groups(self, axis: int) -> list[tuple[int, ...]]:
        """Every group along mesh ``axis``, in device order of their first members."""
        cache = self._groups  # type: ignore[attr-defined]
        if axis not in cache:  # asked for every redistribution step that propagation costs
            seen: dict[tuple[int, ...], None] = {}
            for d in self.devices:
                seen[self.group(d, axis)] = None
            cache[axis] = list(seen)
        return list(cache[axis])

    def __str__(self) -> str:
        return f"Mesh({list(self.shape)}, devices={list(self.devices)})"


@dataclass(frozen=True)
class Shard:
    """``S(dim)``: the tensor axis ``dim`` is split over the mesh axis, balanced (the first
    ``n % k`` shards one element more); ``S(dim, block=b)``: in fixed blocks of ``b`` with
    a short tail (the RFC's second convention: 66 over 2 in blocks of 64 is 64 + 2)."""

    dim: int
    block: int | None = None

    def __post_init__(self) -> None:
        if self.block is not None and (
            isinstance(self.block, bool) or not isinstance(self.block, int) or self.block < 1
        ):
            raise AnnotationError(f"S({self.dim}, block={self.block!r}): a block is an int >= 1")

    def __str__(self) -> str:
        return f"S({self.dim})" if self.block is None else f"S({self.dim}, {self.block})"


@dataclass(frozen=True)
class Replicate:
    """``R``: every device on the mesh axis holds the whole (block of the) tensor."""

    def __str__(self) -> str:
        return "R"


@dataclass(frozen=True)
class Partial:
    """``P(op)``: the devices on the mesh axis hold parts to be reduced with ``op``."""

    op: str = "sum"

    def __post_init__(self) -> None:
        if self.op not in ("sum", "max", "min", "mean"):
            raise AnnotationError(f"P({self.op}): the reduction must be sum, max, min or mean")

    def __str__(self) -> str:
        return f"P({self.op})"


Placement = Shard | Replicate | Partial
S = Shard
R = Replicate()
P = Partial


_PLACEMENTS = frozenset({Shard, Replicate, Partial})


def placement(p: Placement | str) -> Placement:
    """A placement from its text (``"S(0)"``, ``"R"``, ``"P(sum)"``) or itself."""
    if isinstance(p, (Shard, Replicate, Partial)):
        return p
    try:
        kind, arg = p2p.parse_placement(p)
    except TypeRuleError as e:
        raise AnnotationError(str(e)) from None
    if kind == "S":
        return Shard(int(arg), p2p.shard_block(p))  # type: ignore[arg-type]
    return R if kind == "R" else Partial(str(arg))


@functools.lru_cache(maxsize=1 << 16)
def _bounds(shape, mesh_shape, placements, coord) -> tuple[tuple[int, int], ...]:
    # A pure function of hashable arguments, memoised: propagation asks it the same
    # questions for every strategy of every op.
    texts = [
        str(replace(p, dim=p.dim % len(shape))) if isinstance(p, Shard) else str(p)
        for p in placements
    ]
    return tuple(p2p.local_bounds(shape, mesh_shape, texts, coord))


@functools.lru_cache(maxsize=1 << 14)
def block_shapes(
    shape: tuple[int, ...], mesh_shape: tuple[int, ...], placements: tuple[Placement, ...]
) -> tuple[tuple[int, ...], ...]:
    """The shape of the block each device holds, in row-major mesh order.

    ``split_sizes`` arithmetic per sharded axis, without the blocks' bounds: what
    ``Layout.local_shape`` gives device by device. Depends on the mesh's shape, not
    its devices, so it is memoised across meshes (bounded).
    """
    rank = len(shape)
    splits = [(k, p.dim % rank, p.block) for k, p in enumerate(placements) if isinstance(p, Shard)]
    count = math.prod(mesh_shape)
    if not splits:
        return (shape,) * count
    out = []
    for coord in itertools.product(*[range(n) for n in mesh_shape]):
        dims = list(shape)
        for k, axis, block in splits:
            if block is not None:
                dims[axis] = shard_sizes(dims[axis], mesh_shape[k], block)[coord[k]]
                continue
            base, extra = divmod(dims[axis], mesh_shape[k])
            dims[axis] = base + 1 if coord[k] < extra else base
        out.append(tuple(dims))
    return tuple(out)


@functools.lru_cache(maxsize=1 << 14)
def shape_fits(
    shape: tuple[int, ...], mesh_shape: tuple[int, ...], placements: tuple[Placement, ...]
) -> bool:
    """Whether ``Layout.check`` accepts ``shape`` (same rules, no message, memoised)."""
    rank = len(shape)
    pieces = list(shape)
    for k, p in enumerate(placements):
        if not isinstance(p, Shard):
            continue
        if not -rank <= p.dim < rank:
            return False
        axis = p.dim % rank
        if mesh_shape[k] > pieces[axis]:
            return False
        if p.block is not None:  # fixed blocks: they must cover the axis, the tail non-empty
            if not (mesh_shape[k] - 1) * p.block < pieces[axis] <= mesh_shape[k] * p.block:
                return False
            pieces[axis] -= (mesh_shape[k] - 1) * p.block  # the tail
            continue
        pieces[axis] //= mesh_shape[k]  # the last (smallest) shard's size
    return True


@dataclass(frozen=True)
class Layout:
    """A mesh and one placement per mesh axis: where every block of a tensor lives."""

    mesh: Mesh
    placements: tuple[Placement, ...]

    def __init__(self, mesh: Mesh, placements: Sequence[Placement | str]) -> None:
        placements = tuple(placements)
        if not _PLACEMENTS.issuperset(map(type, placements)):  # texts such as "S(0)"
            placements = tuple(placement(p) for p in placements)
        if len(placements) != mesh.ndim:
            raise AnnotationError(
                f"{len(placements)} placement(s) {[str(p) for p in placements]} for the "
                f"{mesh.ndim}-D mesh {list(mesh.shape)}: give one placement per mesh axis"
            )
        object.__setattr__(self, "mesh", mesh)
        object.__setattr__(self, "placements", placements)

    def __hash__(self) -> int:
        # Hashed once, on first use: layouts are keys of propagation's memo tables.
        found = self.__dict__.get("_hash")
        if found is None:
            found = hash((self.mesh, self.placements))
            object.__setattr__(self, "_hash", found)
        return found

    def __getstate__(self) -> dict:
        # A pickle must not carry the hash: ``P(op)``'s string hashes differently per process.
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}

    @staticmethod
    def replicated(mesh: Mesh) -> Layout:
        return Layout(mesh, (R,) * mesh.ndim)

    @property
    def texts(self) -> list[str]:
        return [str(p) for p in self.placements]

    @property
    def is_replicated(self) -> bool:
        return all(isinstance(p, Replicate) for p in self.placements)

    def normalized(self, rank: int) -> Layout:
        """Negative shard axes made positive for a rank-``rank`` tensor."""
        ps = [
            replace(p, dim=p.dim % rank) if isinstance(p, Shard) and rank else p
            for p in self.placements
        ]
        return Layout(self.mesh, ps)

    def check(self, shape: Sequence[int], value: str = "tensor") -> None:
        """Raise an AnnotationError naming ``value`` when the layout cannot hold ``shape``."""
        try:
            p2p.check_layout(tuple(shape), self.mesh.shape, self.texts)
        except TypeRuleError as e:
            raise AnnotationError(f"value {value!r} of shape {tuple(shape)}: {e}") from None

    def local_shape(self, shape: Sequence[int], device: int) -> tuple[int, ...]:
        return tuple(b - a for a, b in self.local_bounds(shape, device))

    def local_shapes(self, shape: Sequence[int]) -> tuple[tuple[int, ...], ...]:
        """Every device's block shape, in mesh device order (``local_shape`` per device)."""
        return block_shapes(tuple(shape), self.mesh.shape, self.placements)

    def fits(self, shape: Sequence[int]) -> bool:
        """Whether :meth:`check` accepts ``shape``."""
        return shape_fits(tuple(shape), self.mesh.shape, self.placements)

    def local_bounds(self, shape: Sequence[int], device: int) -> list[tuple[int, int]]:
        """``[start, stop)`` per tensor axis of the block ``device`` holds."""
        coord = self.mesh.coord_of(device)
        return list(_bounds(tuple(shape), self.mesh.shape, self.placements, coord))

    def split(self, array: np.ndarray) -> list[np.ndarray]:
        """The block each device holds, in mesh device order."""
        array = np.asarray(array)
        self.check(array.shape)
        return p2p.shard_array(array, self.mesh.shape, self.texts)

    def merge(self, parts: Sequence[np.ndarray]) -> np.ndarray:
        """The whole tensor from its blocks (mesh device order): concatenate, reduce, pick."""
        if len(parts) != self.mesh.size:
            raise AnnotationError(f"merge needs {self.mesh.size} blocks, got {len(parts)}")
        return p2p.unshard_arrays(parts, self.mesh.shape, self.texts)

    def attributes(self) -> dict:
        """The attributes of ``Shard``/``Unshard``/``ShardAnnotate`` ops for this layout."""
        return {
            "mesh": list(self.mesh.shape),
            "devices": list(self.mesh.devices),
            "placements": self.texts,
        }

    @staticmethod
    def from_attributes(attrs) -> Layout:
        return Layout(Mesh(tuple(attrs["mesh"]), tuple(attrs["devices"])), attrs["placements"])

    def __str__(self) -> str:
        return f"[{', '.join(self.texts)}] on mesh {list(self.mesh.shape)}"
