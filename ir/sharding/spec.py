"""ONNX-style ``ShardingSpec`` (seed 001) and its conversion to and from mesh layouts.

``devices`` lists one entry per shard; an entry that is a key of ``device_map``
stands for a broadcast group (every device of the group gets that shard).
``sharded_dims`` lists ``(axis, num_shards)``; with several, shards are
numbered row-major in list order (the seed's nested loop). Uneven splits are
allowed: the first ``n % k`` shards get one element more (``split_sizes``).

The seed's examples, on ``[[1, 2], [3, 4]]``:

>>> import numpy as np
>>> x = np.array([[1, 2], [3, 4]])
>>> [p.tolist() for p in ShardingSpec(devices=[0, 1], sharded_dims=[(1, 2)]).split(x)]
[[[1], [3]], [[2], [4]]]
>>> mixed = ShardingSpec(devices=[-1, -2], sharded_dims=[(0, 2)],
...                      device_map={-1: [0, 1], -2: [2, 3]})
>>> [p.tolist() for p in mixed.split(x)]
[[[1, 2]], [[1, 2]], [[3, 4]], [[3, 4]]]

(The seed prints ``[[2,3]]`` for devices 2 and 3 of the mixed example; that is
a typo: the second half of axis 0 is ``[[3, 4]]``.)
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..limits import MAX_DEVICES
from ..ops.communication import split_array
from .errors import AnnotationError
from .mesh import Layout, Mesh, Partial, Placement, Replicate, Shard


def _whole(x: object, what: str) -> int:
    """``x`` as an int when it is one (numpy integers included), else an AnnotationError."""
    if isinstance(x, numbers.Integral) and not isinstance(x, bool):
        return int(x)
    raise AnnotationError(f"{what} must hold integers, got {x!r} ({type(x).__name__})")


def _sequence(x: object, what: str) -> Sequence[Any]:
    """``x`` if it is a list, tuple or array (not a string), else an AnnotationError."""
    if isinstance(x, str | bytes) or not isinstance(x, Sequence | np.ndarray):
        raise AnnotationError(f"{what} must be a sequence, got {x!r} ({type(x).__name__})")
    return x


@dataclass(frozen=True)
class ShardingSpec:
    """Seed 001's ShardingSpecProto: devices (or broadcast groups) and sharded axes."""

    devices: tuple[int, ...]
    sharded_dims: tuple[tuple[int, int], ...] = ()
    device_map: Mapping[int, tuple[int, ...]] = field(default_factory=dict)

    def __init__(
        self,
        devices: Sequence[int],
        sharded_dims: Sequence[tuple[int, int]] = (),
        device_map: Mapping[int, Sequence[int]] | None = None,
    ) -> None:
        # Whole numbers only: int() would read the device 1.5 as 1 and True as 1.
        devices = tuple(_whole(d, "devices") for d in _sequence(devices, "devices"))
        pairs = [_sequence(p, "sharded_dims") for p in _sequence(sharded_dims, "sharded_dims")]
        if any(len(p) != 2 for p in pairs):
            raise AnnotationError(
                f"sharded_dims must hold (axis, num_shards) pairs, got {sharded_dims!r}"
            )
        dims = tuple((_whole(a, "sharded_dims"), _whole(n, "sharded_dims")) for a, n in pairs)
        if device_map is not None and not isinstance(device_map, Mapping):
            raise AnnotationError(f"device_map must be a mapping, got {device_map!r}")
        dmap = {
            _whole(k, "device_map"): tuple(
                _whole(d, "device_map") for d in _sequence(v, "device_map")
            )
            for k, v in (device_map or {}).items()
        }
        shards = math.prod(n for _, n in dims)
        if any(n < 1 for _, n in dims):
            raise AnnotationError(f"sharded_dims {list(dims)}: num_shards must be positive")
        if len(devices) != shards:
            raise AnnotationError(
                f"sharded_dims {list(dims)} make {shards} shard(s) but devices lists "
                f"{len(devices)} entries {list(devices)}: give one device (or group) per shard"
            )
        axes = [a for a, _ in dims]
        if len(set(axes)) != len(axes):
            raise AnnotationError(f"sharded_dims {list(dims)} name an axis twice")
        physical = [d for e in devices for d in dmap.get(e, (e,))]
        beyond = [d for d in physical if not 0 <= d < MAX_DEVICES]
        if beyond:
            raise AnnotationError(
                f"devices {list(devices)[:8]} reach device {beyond[0]}, but a device id is an "
                f"integer from 0 to {MAX_DEVICES - 1} (a negative entry of devices names a "
                "broadcast group: give it in device_map)"
            )
        if len(set(physical)) != len(physical):
            raise AnnotationError(f"devices {list(devices)} reach a device twice: {physical}")
        object.__setattr__(self, "devices", devices)
        object.__setattr__(self, "sharded_dims", dims)
        object.__setattr__(self, "device_map", dmap)

    @property
    def groups(self) -> list[tuple[int, ...]]:
        """The physical devices holding each shard, in shard order."""
        return [self.device_map.get(e, (e,)) for e in self.devices]

    @property
    def physical_devices(self) -> tuple[int, ...]:
        """Every device, in the order ``split`` returns blocks and ``merge`` takes them."""
        return tuple(d for g in self.groups for d in g)

    def check(self, shape: Sequence[int], value: str = "tensor") -> None:
        for axis, n in self.sharded_dims:
            if not -len(shape) <= axis < len(shape):
                raise AnnotationError(
                    f"value {value!r} of shape {tuple(shape)}: sharded_dim axis {axis} is out of "
                    f"range for a rank-{len(shape)} tensor"
                )
            if n > shape[axis]:
                raise AnnotationError(
                    f"value {value!r} of shape {tuple(shape)}: {n} shards of axis {axis} with "
                    f"{shape[axis]} element(s) (more shards than elements)"
                )

    def shards(self, array: np.ndarray) -> list[np.ndarray]:
        """One block per entry of ``devices`` (the seed's nested loop, row-major)."""
        array = np.asarray(array)
        self.check(array.shape)
        blocks = [array]
        for axis, n in self.sharded_dims:
            blocks = [b for block in blocks for b in split_array(block, n, axis % array.ndim)]
        return blocks

    def split(self, array: np.ndarray) -> list[np.ndarray]:
        """The block of every physical device, in ``physical_devices`` order."""
        return [b.copy() for b, g in zip(self.shards(array), self.groups) for _ in g]

    def merge(self, parts: Sequence[np.ndarray]) -> np.ndarray:
        """The whole tensor from every device's block (``physical_devices`` order)."""
        if len(parts) != len(self.physical_devices):
            raise AnnotationError(
                f"merge needs {len(self.physical_devices)} blocks, got {len(parts)}"
            )
        firsts, i = [], 0
        for g in self.groups:
            firsts.append(np.asarray(parts[i]))
            i += len(g)
        return _join(firsts, list(self.sharded_dims))

    # -- conversion ----------------------------------------------------------------------

    def to_layout(self) -> Layout:
        """The same placement as a mesh layout: one mesh axis per sharded dim, plus one
        replicating axis when the broadcast groups have more than one device."""
        sizes = {len(g) for g in self.groups}
        if len(sizes) != 1:
            raise AnnotationError(
                f"broadcast groups of different sizes {[list(g) for g in self.groups]} have no "
                "mesh layout"
            )
        g = sizes.pop()
        shape = [n for _, n in self.sharded_dims]
        placements: list[Placement] = [Shard(a) for a, _ in self.sharded_dims]
        if g > 1 or not shape:
            shape.append(g)
            placements.append(Replicate())
        return Layout(Mesh(tuple(shape), self.physical_devices), placements)

    @staticmethod
    def from_layout(layout: Layout) -> ShardingSpec:
        """The ONNX spec of a layout without Partial axes or an axis sharded twice."""
        ps = layout.placements
        if any(isinstance(p, Partial) for p in ps):
            raise AnnotationError(f"layout {layout} has a Partial axis: ONNX cannot express it")
        dims = [p.dim for p in ps if isinstance(p, Shard)]
        if len(set(dims)) != len(dims):
            raise AnnotationError(f"layout {layout} shards one tensor axis twice: no ONNX spec")
        mesh = layout.mesh
        s_axes = [k for k, p in enumerate(ps) if isinstance(p, Shard)]
        r_axes = [k for k, p in enumerate(ps) if not isinstance(p, Shard)]
        groups: dict[tuple[int, ...], list[int]] = {}
        for coord, d in zip(mesh.coords(), mesh.devices):
            groups.setdefault(tuple(coord[k] for k in s_axes), []).append(d)
        sharded = [(ps[k].dim, mesh.shape[k]) for k in s_axes]  # type: ignore[union-attr]
        ordered = [groups[key] for key in sorted(groups)]
        if not r_axes or all(mesh.shape[k] == 1 for k in r_axes):
            return ShardingSpec([g[0] for g in ordered], sharded)
        keys = [-(i + 1) for i in range(len(ordered))]
        return ShardingSpec(keys, sharded, dict(zip(keys, ordered)))


def _join(blocks: list[np.ndarray], dims: list[tuple[int, int]]) -> np.ndarray:
    if not dims:
        return blocks[0]
    axis, n = dims[0]
    step = len(blocks) // n
    return np.concatenate(
        [_join(blocks[i * step : (i + 1) * step], dims[1:]) for i in range(n)], axis
    )
