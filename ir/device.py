"""Devices and the Topology that connects them (seed 000's Device and Topology).

A Topology says, per device, its peak flops (per element type, for matrix and
for vector work), memory bandwidth and capacity, and per ordered device pair,
the link bandwidth and latency. Hardware presets live in ``ir.hardware``,
measuring this machine in ``ir.calibrate``.

Peak flops per element type
---------------------------

``Device.peak_flops`` is one headline figure: the dense half-precision
(BF16/FP16) matrix peak of a GPU. ``Device.matrix_peak_flops`` and
``Device.vector_peak_flops`` refine it per element type: *matrix* work (matrix
products and convolutions, on tensor cores where the chip has them) and
*vector* work (elementwise arithmetic, reductions: CUDA cores).
:meth:`Device.peak_flops_for` reads them:

* a device with neither table runs everything at ``peak_flops`` (a plain
  ``Device(0, peak_flops=...)`` and ``Topology.uniform`` keep their meaning);
* float32 matrix work runs at the ``"float32"`` figure unless TF32 is allowed
  (``allow_tf32=True``, which ``Topology.allow_tf32`` passes on) and the chip has
  a ``"tf32"`` figure: PyTorch runs float32 matmuls in full FP32 by default
  (``torch.backends.cuda.matmul.allow_tf32`` is False since PyTorch 1.12);
* an element type the matrix table lacks runs at its vector rate (a V100 has
  no BF16 units); one the vector table lacks (integers, ``"float8"``) at the
  vector ``"float32"`` rate.

Names are :class:`ir.types.DType` values plus ``"tf32"`` and ``"float8"``,
formats the hardware computes in that the IR does not store.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from .arguments import int_arg, str_arg
from .errors import ArgumentError, DistIRError
from .limits import MAX_DEVICES, MAX_TOPOLOGY_DEVICES

#: Element-type names a peak-flops table may hold (``DType`` values, ``tf32``, ``float8``).
PEAK_DTYPES = ("float64", "float32", "tf32", "bfloat16", "float16", "float8")

PeakTable = tuple[tuple[str, float], ...]


class TopologyError(DistIRError):
    """A topology that cannot be simulated: non-positive bandwidth, unknown device, ..."""


def peak_table(table: Mapping[str, float] | PeakTable) -> PeakTable:
    """``table`` (a mapping or pairs) as sorted (element type, FLOP/s) pairs, checked."""
    pairs = sorted(dict(table).items())
    for name, flops in pairs:
        if name not in PEAK_DTYPES:
            raise TopologyError(f"unknown element type {name!r}; one of {', '.join(PEAK_DTYPES)}")
        if not flops > 0:
            raise TopologyError(f"the {name} peak must be positive, got {flops}")
    return tuple((name, float(flops)) for name, flops in pairs)


def _is_number(x: object) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


@dataclass(frozen=True)
class Device:
    """One device and what it can do.

    ``peak_flops`` is the dense BF16/FP16 matrix peak (the headline figure);
    ``matrix_peak_flops`` and ``vector_peak_flops`` map element-type names to
    dense peaks (a mapping is accepted and stored as sorted pairs, so a Device
    stays hashable). See the module docstring and :meth:`peak_flops_for`.

    >>> d = Device(0, peak_flops=125e12, matrix_peak_flops={"float16": 125e12, "float32": 15.7e12},
    ...            vector_peak_flops={"float32": 15.7e12})
    >>> d.peak_flops_for("float32", matrix=True) / 1e12
    15.7
    """

    device_id: int
    device_type: str = "gpu"
    peak_flops: float = 1e12
    mem_bandwidth_bytes_per_s: float = 1e11
    memory_bytes: float = 16e9
    launch_overhead_s: float = 0.0
    matrix_peak_flops: PeakTable = ()
    vector_peak_flops: PeakTable = ()
    # how close kernels come to the peaks (ir.hardware.kernels.KernelModel); None: the
    # roofline at the peaks plus launch_overhead_s
    kernels: Any = None

    def __post_init__(self) -> None:
        for field in ("peak_flops", "mem_bandwidth_bytes_per_s", "memory_bytes"):
            if not _is_number(getattr(self, field)) or not getattr(self, field) > 0:
                raise TopologyError(
                    f"device {self.device_id}: {field} must be positive, got {getattr(self, field)}"
                )
        if not _is_number(self.launch_overhead_s) or not 0 <= self.launch_overhead_s < math.inf:
            raise TopologyError(
                f"device {self.device_id}: launch_overhead_s must be a finite number >= 0, "
                f"got {self.launch_overhead_s}"
            )
        for field in ("matrix_peak_flops", "vector_peak_flops"):
            try:
                table = peak_table(getattr(self, field))
            except TopologyError as e:
                raise TopologyError(f"device {self.device_id}: {field}: {e}") from None
            object.__setattr__(self, field, table)

    def peak_flops_for(self, dtype: object, matrix: bool, *, allow_tf32: bool = False) -> float:
        """Dense peak FLOP/s for work in ``dtype`` (a :class:`ir.DType` or a name).

        ``matrix``: matrix products and convolutions (tensor cores) rather than
        elementwise work. ``allow_tf32`` lets float32 matrix work run in TF32.

        >>> Device(0, peak_flops=5e12).peak_flops_for("float32", matrix=True)  # no tables
        5000000000000.0
        """
        if not self.matrix_peak_flops and not self.vector_peak_flops:
            return self.peak_flops
        name = getattr(dtype, "value", dtype)
        vector = dict(self.vector_peak_flops)
        if matrix:
            table = dict(self.matrix_peak_flops)
            if name == "float32" and allow_tf32 and "tf32" in table:
                return table["tf32"]
            if name in table:
                return table[name]
        if name in vector:
            return vector[name]
        return vector.get("float32", self.peak_flops)

    def compute_time_s(
        self,
        flops: float,
        nbytes: float,
        matrix_flops: float = 0.0,
        dtype: object = None,
        *,
        allow_tf32: bool = False,
        additive: bool = False,
    ) -> float:
        """Roofline time of work on this device, launch overhead excluded: ``matrix_flops``
        of the ``flops`` at the matrix peak for ``dtype``, the rest at its vector peak,
        against ``nbytes`` at the memory bandwidth (their max; their sum if ``additive``).

        >>> d = Device(0, peak_flops=1e12, mem_bandwidth_bytes_per_s=1e11)
        >>> d.compute_time_s(2e9, 1e8)  # 2 ms of arithmetic beats 1 ms of memory traffic
        0.002
        """
        matrix = self.peak_flops_for(dtype, True, allow_tf32=allow_tf32)
        vector = self.peak_flops_for(dtype, False)
        t_flops = matrix_flops / matrix + (flops - matrix_flops) / vector
        t_bytes = nbytes / self.mem_bandwidth_bytes_per_s
        return t_flops + t_bytes if additive else max(t_flops, t_bytes)

    def op_time_s(
        self, cost: Any, dtype: object = None, *, allow_tf32: bool = False, additive: bool = False
    ) -> float:
        """Time of one op of ``cost`` (an ``ir.registry.Cost``) on this device.

        With a kernel model (``kernels``, what ``Topology.preset`` gives GPUs unless
        ``ideal=True``): the model's time (``ir.hardware.kernels``: tile and wave
        quantised GEMMs, achieved memory bandwidth, fused attention, kernel gaps).
        Without: ``launch_overhead_s`` plus :meth:`compute_time_s` (the roofline).

        >>> from ir.registry import Cost
        >>> Device(0, peak_flops=1e12, launch_overhead_s=1e-6).op_time_s(Cost(2e9, 0, 0))
        0.002001
        """
        if self.kernels is None:
            return self.launch_overhead_s + self.compute_time_s(
                cost.flops,
                cost.bytes_read + cost.bytes_written,
                cost.matrix_flops,
                dtype,
                allow_tf32=allow_tf32,
                additive=additive,
            )
        return self.kernels.time_s(
            cost,
            matrix_peak_flops=self.peak_flops_for(dtype, True, allow_tf32=allow_tf32),
            vector_peak_flops=self.peak_flops_for(dtype, False),
            mem_bandwidth_bytes_per_s=self.mem_bandwidth_bytes_per_s,
        )

    def host_time_s(self, cost: Any) -> float:
        """Host (CPU) time to issue one op of ``cost``: 0 without a kernel model."""
        return 0.0 if self.kernels is None else self.kernels.host_time_s(cost)

    def host_comm_s(self) -> float:
        """Host time to issue one collective or send: 0 without a kernel model."""
        return 0.0 if self.kernels is None else self.kernels.host.comm_s

    @property
    def syncs_after_p2p(self) -> bool:
        """Whether the host waits for this device after a point-to-point transfer."""
        return self.kernels is not None and self.kernels.host.sync_p2p


class LinkTable(Sequence):
    """An ``n`` x ``n`` link matrix given by a rule, not stored: ``table[i][j]`` is
    ``rule(i, j)`` (0 on the diagonal). Setting one up takes constant time and memory,
    where a dense matrix of 4000 devices is 16 million entries; ``values`` lists every
    off-diagonal value the rule gives, so checking them is cheap too. Two tables are
    equal when their ``n`` and ``key`` (what determines the rule) are.

    >>> t = LinkTable.uniform(3, 5.0)
    >>> t[0][1], t[2][2], len(t), list(t[1])
    (5.0, 0.0, 3, [5.0, 0.0, 5.0])
    """

    def __init__(self, n: int, rule: Any, values: Sequence[float], key: Any) -> None:
        self.n, self.rule, self.values, self.key = n, rule, tuple(values), key

    @staticmethod
    def uniform(n: int, value: float) -> LinkTable:
        """Every link alike."""
        return LinkTable(n, _Uniform(value), (value,) if n > 1 else (), ("uniform", value))

    @staticmethod
    def by_node(n: int, per_node: int, intra: Sequence[Sequence[float]], inter: float) -> LinkTable:
        """Devices fill nodes of ``per_node`` in index order; ``intra[a][b]`` links the
        a-th and b-th devices of one node, ``inter`` any two devices of different nodes."""
        intra = tuple(tuple(row) for row in intra)
        local = len(intra)  # min(per_node, n): a lone partial node may be smaller
        values = [intra[a][b] for a in range(local) for b in range(local) if a != b]
        values += [inter] if n > per_node else []
        rule = _ByNode(per_node, intra, inter)
        return LinkTable(n, rule, values, ("by_node", per_node, intra, inter))

    def link_pattern(self, indices: Sequence[int]) -> tuple | None:
        """A key that two sequences of device indices share when the link from their a-th
        to their b-th device is the same for every a and b that are different devices, or
        None if this table's rule does not say (a rule of the caller's)."""
        rule = self.rule
        if isinstance(rule, _Uniform):
            return ()
        if isinstance(rule, _ByNode):  # the node (by first appearance) and place in it
            per_node, blocks = rule.per_node, {}
            return tuple(
                [(blocks.setdefault(i // per_node, len(blocks)), i % per_node) for i in indices]
            )
        return None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(self.n))]
        if not -self.n <= i < self.n:
            raise IndexError(i)
        return _LinkRow(self, i % self.n)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LinkTable):
            return (self.n, self.key) == (other.n, other.key)
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.n, self.key))

    def __repr__(self) -> str:
        return f"LinkTable({self.n}, {self.key!r})"


@dataclass(frozen=True)
class _Uniform:
    """The rule of a table whose links are all alike (a class, so topologies pickle)."""

    value: float

    def __call__(self, i: int, j: int) -> float:
        return self.value


@dataclass(frozen=True)
class _ByNode:
    """The rule of devices filling nodes of ``per_node``: ``intra`` within, ``inter`` across."""

    per_node: int
    intra: tuple[tuple[float, ...], ...]
    inter: float

    def __call__(self, i: int, j: int) -> float:
        if i // self.per_node == j // self.per_node:
            return self.intra[i % self.per_node][j % self.per_node]
        return self.inter


class _LinkRow(Sequence):
    def __init__(self, table: LinkTable, i: int) -> None:
        self.table, self.i = table, i

    def __len__(self) -> int:
        return self.table.n

    def __getitem__(self, j: Any) -> Any:
        if isinstance(j, slice):
            return [self[k] for k in range(*j.indices(self.table.n))]
        if not -self.table.n <= j < self.table.n:
            raise IndexError(j)
        j %= self.table.n
        return 0.0 if j == self.i else self.table.rule(self.i, j)


@dataclass(frozen=True)
class Topology:
    """Devices plus the links between them.

    ``bandwidth_bytes_per_s[i][j]`` and ``latency_s[i][j]`` describe the link
    from ``devices[i]`` to ``devices[j]`` (index into ``devices``, not ids).
    ``nodes`` optionally groups device ids by machine (empty: no grouping); the
    hierarchical all-reduce of ``ir.collectives`` runs over these groups.
    ``allow_tf32``: float32 matrix work runs in TF32 on devices that have it
    (off by default, as in PyTorch; see :meth:`Device.peak_flops_for`).
    """

    devices: tuple[Device, ...]
    bandwidth_bytes_per_s: tuple[tuple[float, ...], ...]
    latency_s: tuple[tuple[float, ...], ...]
    name: str = "custom"
    nodes: tuple[tuple[int, ...], ...] = ()
    allow_tf32: bool = False
    # achieved collective times (ir.hardware.comm.CollectiveModel); None: alpha-beta rings
    # at the links' nominal bandwidth and latency
    collectives: Any = None

    def __post_init__(self) -> None:
        n = len(self.devices)
        ruled = isinstance(self.bandwidth_bytes_per_s, LinkTable) and isinstance(
            self.latency_s, LinkTable
        )
        limit = MAX_DEVICES if ruled else MAX_TOPOLOGY_DEVICES
        if n > limit:
            raise TopologyError(
                f"topology {self.name!r} has {n} devices, more than the limit {limit} "
                + (
                    "(ir.limits.MAX_DEVICES)"
                    if ruled
                    else "for dense link matrices (ir.limits.MAX_TOPOLOGY_DEVICES; links given "
                    "by a rule, ir.device.LinkTable, go to ir.limits.MAX_DEVICES)"
                )
            )
        ids = [d.device_id for d in self.devices]
        if len(set(ids)) != n:
            raise TopologyError(f"topology {self.name!r} lists a device id twice")
        for label, m in (("bandwidth", self.bandwidth_bytes_per_s), ("latency", self.latency_s)):
            if len(m) != n or (not ruled and any(len(row) != n for row in m)):
                raise TopologyError(f"topology {self.name!r}: {label} must be a {n}x{n} matrix")
        if ruled:  # every value the rules give, once each: linear (constant) in devices
            for bw in self.bandwidth_bytes_per_s.values:
                if not _is_number(bw) or not bw > 0:
                    raise TopologyError(
                        f"topology {self.name!r}: a link has bandwidth {bw}; bandwidths must be "
                        "positive"
                    )
            for lat in self.latency_s.values:
                if not _is_number(lat) or not 0 <= lat < math.inf:
                    raise TopologyError(
                        f"topology {self.name!r}: a link has latency {lat}; latencies must be "
                        "finite numbers >= 0"
                    )
        for i in range(0 if ruled else n):
            for j in range(n):
                bw, lat = self.bandwidth_bytes_per_s[i][j], self.latency_s[i][j]
                if not (_is_number(bw) and _is_number(lat)):
                    raise TopologyError(
                        f"topology {self.name!r}: link {ids[i]} -> {ids[j]} has bandwidth "
                        f"{bw!r} and latency {lat!r}; both must be numbers"
                    )
                if i != j and not self.bandwidth_bytes_per_s[i][j] > 0:
                    raise TopologyError(
                        f"topology {self.name!r}: link {ids[i]} -> {ids[j]} has bandwidth "
                        f"{self.bandwidth_bytes_per_s[i][j]}; bandwidths must be positive"
                    )
                if not 0 <= self.latency_s[i][j] < math.inf:  # NaN fails this too
                    raise TopologyError(
                        f"topology {self.name!r}: link {ids[i]} -> {ids[j]} has latency "
                        f"{self.latency_s[i][j]}; latencies must be finite numbers >= 0"
                    )
        grouped = [d for node in self.nodes for d in node]
        if self.nodes and sorted(grouped) != sorted(ids):
            raise TopologyError(
                f"topology {self.name!r}: nodes {self.nodes} must list every device id once"
            )

    @cached_property
    def device_ids(self) -> tuple[int, ...]:
        return tuple(d.device_id for d in self.devices)

    def device(self, device_id: int) -> Device:
        return self.devices[self.index(device_id)]

    def index(self, device_id: int) -> int:
        """Where ``device_id`` is in ``devices`` (a dict look-up, built once)."""
        try:
            return self._indices[device_id]
        except (KeyError, TypeError):
            ids = self.device_ids
            shown = list(ids) if len(ids) <= 16 else f"{ids[0]} .. {ids[-1]}, {len(ids)} in all"
            raise TopologyError(
                f"device {device_id} is not in topology {self.name!r} (devices: {shown})"
            ) from None

    @functools.cached_property
    def _indices(self) -> dict[int, int]:
        return {d.device_id: i for i, d in enumerate(self.devices)}

    @functools.cached_property
    def _node_index(self) -> dict[int, int]:
        return {d: k for k, node in enumerate(self.nodes) for d in node}

    def link_class(self, devices: Sequence[int]) -> tuple | None:
        """A key that two sequences of device ids share when a collective among them takes
        the same time: the same positions are one device, the links between positions are
        alike (bandwidth and latency, :meth:`LinkTable.link_pattern`) and the positions
        group into ``nodes`` alike, the nodes in the same order. A grouped collective's
        groups of one class are timed once. None when the links are dense matrices or a
        rule of the caller's (no key cheaper than the links themselves)."""
        bandwidth, latency = self.bandwidth_bytes_per_s, self.latency_s
        if not (isinstance(bandwidth, LinkTable) and isinstance(latency, LinkTable)):
            return None
        index = self._indices
        try:
            indices = [index[d] for d in devices]
        except (KeyError, TypeError):
            return None  # the time's own look-up names the device the topology lacks
        links = (bandwidth.link_pattern(indices), latency.link_pattern(indices))
        if None in links:
            return None
        first: dict[int, int] = {}
        same = tuple([first.setdefault(i, len(first)) for i in indices])
        node_of = self._node_index
        nodes = [node_of.get(d) for d in devices]
        rank = {k: r for r, k in enumerate(sorted({k for k in nodes if k is not None}))}
        return (same, links, tuple([rank.get(k) for k in nodes]))

    def node_of(self, device_id: int) -> int:
        """The index in ``nodes`` of the node holding ``device_id`` (0 without nodes)."""
        return self._node_index.get(device_id, 0)

    @property
    def ideal(self) -> bool:
        """True when no device has a kernel model and there is no collective model: every
        op on the roofline at the peaks, every transfer on alpha-beta rings."""
        return self.collectives is None and all(d.kernels is None for d in self.devices)

    def bandwidth(self, src: int, dst: int) -> float:
        return self.bandwidth_bytes_per_s[self.index(src)][self.index(dst)]

    def latency(self, src: int, dst: int) -> float:
        return self.latency_s[self.index(src)][self.index(dst)]

    def peak_flops_for(self, device_id: int, dtype: object, matrix: bool) -> float:
        """:meth:`Device.peak_flops_for` of ``device_id``, with this topology's TF32 setting."""
        return self.device(device_id).peak_flops_for(dtype, matrix, allow_tf32=self.allow_tf32)

    @staticmethod
    def preset(
        name: str, num_devices: int, *, allow_tf32: bool = False, ideal: bool = False
    ) -> Topology:
        """A hardware preset (see ``Topology.presets()``) with ``num_devices`` devices.

        GPU presets add InfiniBand-linked nodes when ``num_devices`` exceeds one node;
        sources for every figure are cited in ``ir/hardware/``. ``allow_tf32`` runs
        float32 matmuls in TF32 where the GPU has it (PyTorch's default is not to).
        GPU presets model how close real kernels, hosts and collectives come to the
        datasheet (``ir.hardware.efficiency``); ``ideal=True`` keeps the pure roofline
        and alpha-beta rings at the datasheet figures (the course's closed forms).
        """
        from .hardware import preset

        str_arg("Topology.preset", "name", name)
        if isinstance(num_devices, numbers.Integral) and num_devices < 1:
            raise TopologyError(f"a topology needs at least one device, got {num_devices}")
        int_arg("Topology.preset", "num_devices", num_devices, 1, MAX_DEVICES)
        if not isinstance(ideal, bool):
            raise ArgumentError(f"Topology.preset: ideal must be True or False, got {ideal!r}")
        return preset(name, num_devices, allow_tf32=allow_tf32, ideal=ideal)

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
        where = "Topology.uniform"
        if isinstance(num_devices, numbers.Integral) and num_devices < 1:
            raise TopologyError(f"a topology needs at least one device, got {num_devices}")
        num_devices = int_arg(where, "num_devices", num_devices, 1, MAX_DEVICES)
        first_id = int_arg(where, "first_id", first_id, 0, MAX_DEVICES - num_devices)
        for name, value in (  # their values are checked where they are kept (TopologyError)
            ("peak_flops", peak_flops),
            ("mem_bandwidth_bytes_per_s", mem_bandwidth_bytes_per_s),
            ("link_bandwidth_bytes_per_s", link_bandwidth_bytes_per_s),
            ("link_latency_s", link_latency_s),
            ("memory_bytes", memory_bytes),
            ("launch_overhead_s", launch_overhead_s),
        ):
            if not _is_number(value):
                raise ArgumentError(f"{where}: {name} must be a number, got {value!r}")
        str_arg(where, "device_type", device_type)
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
        bw = LinkTable.uniform(num_devices, link_bandwidth_bytes_per_s)
        lat = LinkTable.uniform(num_devices, link_latency_s)
        return Topology(devices, bw, lat, name=f"uniform-{num_devices}")


def _matrix(n: int, off_diagonal: float, diagonal: float = 0.0) -> tuple[tuple[float, ...], ...]:
    return tuple(tuple(diagonal if i == j else off_diagonal for j in range(n)) for i in range(n))


def matrix(rows: Sequence[Sequence[float]]) -> tuple[tuple[float, ...], ...]:
    return tuple(tuple(float(x) for x in row) for row in rows)
