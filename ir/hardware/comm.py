"""How fast collectives really run: an NCCL-like model of achieved bus bandwidth.

With ``ideal=True`` (or no model) a collective takes the alpha-beta time of a ring over
the links' nominal bandwidth (:mod:`ir.collectives`). Real libraries reach a fraction
of the links' bandwidth, pay a fixed launch latency and a latency per ring step, and
pick among protocols that trade latency for bandwidth by message size. This model
follows the structure of NCCL's own tuning model (``src/graph/tuning.cc`` of
NVIDIA/nccl, 2.7-2.18: ``time = latency + bytes / bandwidth`` per algorithm and
protocol, the smallest chosen):

* **Protocols** (:data:`NCCL_PROTOCOLS`): *LL* (8-byte stores with a flag in each:
  lowest latency, a quarter of the bus bandwidth), *LL128* (128-byte lines with 8 bytes
  of flags: 120/128 of the bandwidth, on NVLink systems only) and *Simple* (full
  bandwidth, highest latency). Their base latency and per-step latency on NVLink, PCIe
  and the network are NCCL's published ring figures (``baseLat``, ``hwLat``).
* **Bus bandwidth**: a ring collective over ``g`` GPUs in each of ``N`` nodes is paced
  by ``min(intra-node link x intra_efficiency, g x inter-node link per GPU x
  inter_efficiency)``: NCCL builds one ring per channel, and a node's channels leave it
  through different NICs, so the ``g`` GPUs of a node drive ``g`` NICs at once (one
  GPU per node, as a data-parallel group across tensor-parallel nodes, drives one).
  ``intra_efficiency`` for NVSwitch A100 systems is NCCL's own cap, 235 of 300 GB/s
  (``busBw = min(busBw, 235)`` for compute capability 8.0 in tuning.cc).
* **Point-to-point** sends take one step's latency and the link's achieved bandwidth.

The model ignores link contention between concurrent collectives and the slowdown a
collective's kernels cause to compute kernels sharing the SMs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: Link classes of NCCL's latency table.
LINK_CLASSES = ("nvlink", "pci", "net")


@dataclass(frozen=True)
class Protocol:
    """One NCCL protocol: its share of the bus bandwidth and its latencies (seconds).

    ``step_latency_s`` holds the latency of one ring step over (NVLink, PCIe, network).
    """

    name: str
    bandwidth_factor: float
    base_latency_s: float
    step_latency_s: tuple[float, float, float]
    nvlink_only: bool = False

    def step_s(self, link: str) -> float:
        return self.step_latency_s[LINK_CLASSES.index(link)]


#: NCCL's ring protocols, latencies from tuning.cc (``baseLat`` and ``hwLat`` for Ring,
#: in microseconds there): LL 3.6 + (0.47, 1.0, 2.7) per step, LL128 10.0 + (1.9, 2.5,
#: 4.0), Simple 8.4 + (3.4, 5.7, 9.6); LL gets a quarter of the bus bandwidth for
#: all-reduce, LL128 120/128 of it.
NCCL_PROTOCOLS: tuple[Protocol, ...] = (
    Protocol("LL", 0.25, 3.6e-6, (0.47e-6, 1.0e-6, 2.7e-6)),
    Protocol("LL128", 120 / 128, 10.0e-6, (1.9e-6, 2.5e-6, 4.0e-6), nvlink_only=True),
    Protocol("Simple", 1.0, 8.4e-6, (3.4e-6, 5.7e-6, 9.6e-6)),
)


@dataclass(frozen=True)
class CollectiveModel:
    """Achieved collective times on one kind of cluster (see the module docstring).

    ``intra_link``: ``"nvlink"`` or ``"pci"``, the class of the links inside a node;
    ``intra_efficiency`` / ``inter_efficiency``: the achieved fraction of an intra-node
    link's and of an inter-node link's bandwidth with the Simple protocol on large
    messages; ``name`` identifies the model in saved sessions.
    """

    name: str
    intra_link: str
    intra_efficiency: float
    inter_efficiency: float
    protocols: tuple[Protocol, ...] = NCCL_PROTOCOLS

    def _protocols(self) -> tuple[Protocol, ...]:
        return tuple(
            p for p in self.protocols if not (p.nvlink_only and self.intra_link != "nvlink")
        )

    def time_s(
        self,
        kind: str,
        size_bytes: float,
        devices: Sequence[int],
        topology: Any,
        root: int | None = None,
    ) -> float:
        """Time of collective ``kind`` of ``size_bytes`` (as :mod:`ir.collectives` sizes it)
        among ``devices`` of ``topology``."""
        from ..collectives import node_groups, ring_links, ring_order

        if kind == "local" or (size_bytes <= 0 and kind != "send"):
            return 0.0
        if kind == "send":
            src, dst = devices[0], (root if root is not None else devices[-1])
            return self.send_time_s(size_bytes, src, dst, topology)
        members = tuple(dict.fromkeys(devices))
        n = len(members)
        if n <= 1:
            return 0.0
        groups = node_groups(members, topology)
        nodes, per_node = len(groups), max(len(g) for g in groups)
        intra_bw = math.inf
        if per_node > 1:
            largest = max(groups, key=len)
            ring = ring_order(largest, topology, size_bytes)
            intra_bw = ring_links(ring, topology)[0] * self.intra_efficiency
        inter_bw = math.inf
        if nodes > 1:
            inter_bw = (
                topology.bandwidth(groups[0][0], groups[1][0]) * self.inter_efficiency * per_node
            )
        bus_bw = min(intra_bw, inter_bw)
        if kind == "alltoall":
            return self._alltoall_s(size_bytes, n, nodes, per_node, topology, groups)
        if kind == "allreduce":
            steps, inter_steps, bus_bytes = 2 * (n - 1), 2 * (nodes - 1), 2 * (n - 1) / n
        elif kind in ("allgather", "reducescatter", "scatter", "gather"):
            steps, inter_steps, bus_bytes = n - 1, nodes - 1, (n - 1) / n
        else:  # broadcast, reduce: a pipelined ring moving the whole tensor
            steps, inter_steps, bus_bytes = n - 1, nodes - 1, 1.0
        return self._best(steps - inter_steps, inter_steps, bus_bytes * size_bytes, bus_bw)

    def _best(self, intra_steps: int, inter_steps: int, bus_bytes: float, bus_bw: float) -> float:
        best = math.inf
        for p in self._protocols():
            latency = (
                p.base_latency_s
                + intra_steps * p.step_s(self.intra_link)
                + inter_steps * p.step_s("net")
            )
            best = min(best, latency + bus_bytes / (bus_bw * p.bandwidth_factor))
        return best

    def send_time_s(self, size_bytes: float, src: int, dst: int, topology: Any) -> float:
        """A point-to-point transfer: one step over the (src, dst) link."""
        if src == dst:
            return 0.0
        crosses = _crosses_nodes(topology, src, dst)
        efficiency = self.inter_efficiency if crosses else self.intra_efficiency
        bandwidth = topology.bandwidth(src, dst) * efficiency
        link = "net" if crosses else self.intra_link
        return min(
            p.base_latency_s + p.step_s(link) + size_bytes / (bandwidth * p.bandwidth_factor)
            for p in self._protocols()
        )

    def _alltoall_s(
        self,
        size_bytes: float,
        n: int,
        nodes: int,
        per_node: int,
        topology: Any,
        groups: Sequence[Sequence[int]],
    ) -> float:
        """Every rank sends (n-1)/n of its buffer: its node's share over the intra-node
        links, the rest through its NIC, both at once."""
        local = max(groups, key=len)
        intra_s = 0.0
        if per_node > 1:
            bw = topology.bandwidth(local[0], local[1]) * self.intra_efficiency
            intra_s = size_bytes * (per_node - 1) / n / bw
        inter_s = 0.0
        if nodes > 1:
            bw = topology.bandwidth(groups[0][0], groups[1][0]) * self.inter_efficiency
            inter_s = size_bytes * (n - per_node) / n / bw
        link = "net" if nodes > 1 else self.intra_link
        simple = self._protocols()[-1]
        return simple.base_latency_s + simple.step_s(link) + max(intra_s, inter_s)


def _crosses_nodes(topology: Any, a: int, b: int) -> bool:
    return bool(topology.nodes) and topology.node_of(a) != topology.node_of(b)
