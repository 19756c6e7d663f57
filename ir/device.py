"""Devices and the Topology that connects them (seed 000's Device and Topology).

A Topology says, per device, its peak flops, memory bandwidth and capacity, and
per ordered device pair, the link bandwidth and latency. Hardware presets and
CPU calibration live in ``ir.hardware``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .errors import DistIRError


class TopologyError(DistIRError):
    """A topology that cannot be simulated: non-positive bandwidth, unknown device, ..."""


@dataclass(frozen=True)
class Device:
    """One device and what it can do."""

    device_id: int
    device_type: str = "gpu"
    peak_flops: float = 1e12
    mem_bandwidth_bytes_per_s: float = 1e11
    memory_bytes: float = 16e9
    launch_overhead_s: float = 0.0

    def __post_init__(self) -> None:
        for field in ("peak_flops", "mem_bandwidth_bytes_per_s", "memory_bytes"):
            if not getattr(self, field) > 0:
                raise TopologyError(
                    f"device {self.device_id}: {field} must be positive, got {getattr(self, field)}"
                )
        if self.launch_overhead_s < 0:
            raise TopologyError(f"device {self.device_id}: launch_overhead_s is negative")


@dataclass(frozen=True)
class Topology:
    """Devices plus the links between them.

    ``bandwidth_bytes_per_s[i][j]`` and ``latency_s[i][j]`` describe the link
    from ``devices[i]`` to ``devices[j]`` (index into ``devices``, not ids).
    ``nodes`` optionally groups device ids by machine (empty: no grouping); the
    hierarchical all-reduce of ``ir.collectives`` runs over these groups.
    """

    devices: tuple[Device, ...]
    bandwidth_bytes_per_s: tuple[tuple[float, ...], ...]
    latency_s: tuple[tuple[float, ...], ...]
    name: str = "custom"
    nodes: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        n = len(self.devices)
        ids = [d.device_id for d in self.devices]
        if len(set(ids)) != n:
            raise TopologyError(f"topology {self.name!r} lists a device id twice: {ids}")
        for label, m in (("bandwidth", self.bandwidth_bytes_per_s), ("latency", self.latency_s)):
            if len(m) != n or any(len(row) != n for row in m):
                raise TopologyError(f"topology {self.name!r}: {label} must be a {n}x{n} matrix")
        for i in range(n):
            for j in range(n):
                if i != j and not self.bandwidth_bytes_per_s[i][j] > 0:
                    raise TopologyError(
                        f"topology {self.name!r}: link {ids[i]} -> {ids[j]} has bandwidth "
                        f"{self.bandwidth_bytes_per_s[i][j]}; bandwidths must be positive"
                    )
                if self.latency_s[i][j] < 0:
                    raise TopologyError(
                        f"topology {self.name!r}: link {ids[i]} -> {ids[j]} has negative latency"
                    )
        grouped = [d for node in self.nodes for d in node]
        if self.nodes and sorted(grouped) != sorted(ids):
            raise TopologyError(
                f"topology {self.name!r}: nodes {self.nodes} must list every device id once"
            )

    @property
    def device_ids(self) -> tuple[int, ...]:
        return tuple(d.device_id for d in self.devices)

    def device(self, device_id: int) -> Device:
        for d in self.devices:
            if d.device_id == device_id:
                return d
        raise TopologyError(
            f"device {device_id} is not in topology {self.name!r} "
            f"(devices: {list(self.device_ids)})"
        )

    def index(self, device_id: int) -> int:
        for i, d in enumerate(self.devices):
            if d.device_id == device_id:
                return i
        raise TopologyError(
            f"device {device_id} is not in topology {self.name!r} "
            f"(devices: {list(self.device_ids)})"
        )

    def bandwidth(self, src: int, dst: int) -> float:
        return self.bandwidth_bytes_per_s[self.index(src)][self.index(dst)]

    def latency(self, src: int, dst: int) -> float:
        return self.latency_s[self.index(src)][self.index(dst)]

    @staticmethod
    def preset(name: str, num_devices: int) -> Topology:
        """A hardware preset (see ``Topology.presets()``) with ``num_devices`` devices.

        GPU presets add InfiniBand-linked nodes when ``num_devices`` exceeds one node;
        sources for every figure are cited in ``ir/hardware.py``.
        """
        from .hardware import preset

        return preset(name, num_devices)

    @staticmethod
    def presets() -> tuple[str, ...]:
        """The names ``Topology.preset`` accepts."""
        from .hardware import preset_names

        return preset_names()

    @staticmethod
    def uniform(
        num_devices: int,
        *,
        peak_flops: float = 1e12,
        mem_bandwidth_bytes_per_s: float = 1e11,
        link_bandwidth_bytes_per_s: float = 1e10,
        link_latency_s: float = 1e-6,
        memory_bytes: float = 16e9,
        launch_overhead_s: float = 0.0,
        device_type: str = "gpu",
        first_id: int = 0,
    ) -> Topology:
        """``num_devices`` identical devices, all pairs linked alike, ids from ``first_id``."""
        if num_devices < 1:
            raise TopologyError(f"a topology needs at least one device, got {num_devices}")
        devices = tuple(
            Device(
                first_id + i,
                device_type,
                peak_flops,
                mem_bandwidth_bytes_per_s,
                memory_bytes,
                launch_overhead_s,
            )
            for i in range(num_devices)
        )
        bw = _matrix(num_devices, link_bandwidth_bytes_per_s)
        lat = _matrix(num_devices, link_latency_s)
        return Topology(devices, bw, lat, name=f"uniform-{num_devices}")


def _matrix(n: int, off_diagonal: float, diagonal: float = 0.0) -> tuple[tuple[float, ...], ...]:
    return tuple(tuple(diagonal if i == j else off_diagonal for j in range(n)) for i in range(n))


def matrix(rows: Sequence[Sequence[float]]) -> tuple[tuple[float, ...], ...]:
    return tuple(tuple(float(x) for x in row) for row in rows)
