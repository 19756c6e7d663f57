"""Alpha-beta time of point-to-point transfers and collectives on a Topology.

Shared by the simulator and by sharding propagation (which picks the cheapest
redistribution), so both agree on what communication costs. Collectives use
ring algorithms over the slowest link of the ring:

* all-reduce: ``2 (n-1)/n * S / B + 2 (n-1) * alpha``
* all-gather, reduce-scatter: ``(n-1)/n * S / B + (n-1) * alpha``
  (``S`` is the size of the full, gathered tensor)
* all-to-all: ``(n-1)/n * S / B + (n-1) * alpha`` (``S``: one device's buffer)
* broadcast, scatter, gather, reduce: the root sends (or receives) each other
  device's part in turn over its own links.
* local: zero (each device keeps a block of a tensor it already has: the
  scatter into a sequence-parallel region, a ZeRO replica's parameter shard).

On links that differ, the ring takes the order with the fastest slowest link
(:func:`ring_order`; NCCL likewise builds its rings along NVLink). On a
topology with ``nodes`` (a multi-node cluster), all-reduce over devices of
several nodes takes the better of the flat ring and the hierarchical algorithm
of :func:`hierarchical_allreduce_time_s` (reduce-scatter inside nodes,
all-reduce across nodes, all-gather inside nodes). Every choice is among a
fixed set of candidates, so a faster link never makes a collective slower.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

from .device import Topology, TopologyError

COLLECTIVES = (
    "send",
    "broadcast",
    "scatter",
    "gather",
    "reduce",
    "allreduce",
    "allgather",
    "reducescatter",
    "alltoall",
    "local",
)


@dataclass(frozen=True)
class Collective:
    """What one communication op moves: the ``comm_rule`` of every communication op returns one.

    ``size_bytes`` follows :func:`collective_time_s`: the full tensor for
    broadcast, scatter, gather, all-gather and reduce-scatter; one device's
    tensor for reduce, all-reduce, all-to-all and send. ``root`` is the source
    of send, broadcast and scatter and the destination of gather and reduce;
    for ``send``, ``devices`` is ``(source, destination)``.
    """

    kind: str
    size_bytes: float
    devices: tuple[int, ...]
    root: int | None = None
    # A grouped op (one collective per group of a device mesh, all at once, as frameworks
    # run the data-parallel all-reduce of each tensor-parallel shard): every group, the
    # first being ``devices``. Empty for a single group.
    groups: tuple[tuple[int, ...], ...] = ()

    @property
    def participants(self) -> tuple[int, ...]:
        """Every device whose communication stream the op occupies, in first-mention order."""
        seen = dict.fromkeys(self.devices)
        for group in self.groups:
            seen.update(dict.fromkeys(group))
        if self.root is not None:
            seen[self.root] = None
        return tuple(seen)

    def time_s(self, topology: Topology) -> float:
        """Predicted time of this transfer on ``topology`` (the slowest group of a grouped op)."""
        if self.groups:  # the groups of one link class (Topology.link_class) timed once
            times: dict[tuple, float] = {}
            worst = -math.inf
            for g in self.groups:
                key = topology.link_class(g)
                t = times.get(key) if key is not None else None
                if t is None:
                    t = collective_time_s(self.kind, self.size_bytes, g, topology)
                    if key is not None:
                        times[key] = t
                worst = max(worst, t)
            return worst
        if self.kind == "send":
            return send_time_s(self.size_bytes, self.devices[0], self.devices[-1], topology)
        return collective_time_s(self.kind, self.size_bytes, self.devices, topology, self.root)


def send_time_s(size_bytes: float, src: int, dst: int, topology: Topology) -> float:
    """Time to move ``size_bytes`` from ``src`` to ``dst`` (0 on the same device)."""
    if src == dst:
        return 0.0
    if topology.collectives is not None:
        return topology.collectives.send_time_s(size_bytes, src, dst, topology)
    return topology.latency(src, dst) + size_bytes / topology.bandwidth(src, dst)


def ring_links(devices: Sequence[int], topology: Topology) -> tuple[float, float]:
    """(slowest bandwidth, largest latency) over the ring devices[0] -> ... -> devices[0]."""
    n = len(devices)
    bandwidth, latency = float("inf"), 0.0
    for i in range(n):
        src, dst = devices[i], devices[(i + 1) % n]
        if src == dst:
            continue
        bandwidth = min(bandwidth, topology.bandwidth(src, dst))
        latency = max(latency, topology.latency(src, dst))
    return bandwidth, latency


EXACT_RING_MAX_DEVICES = 8  # above this, rings follow the given order


def ring_order(
    devices: Sequence[int], topology: Topology, size_bytes: float = 1e6
) -> tuple[int, ...]:
    """The ring to run a ring collective of ``size_bytes`` on.

    When every link among ``devices`` is alike, the given order. Otherwise, for up
    to ``EXACT_RING_MAX_DEVICES`` devices, the order whose ring step is fastest,
    ``size_bytes / (n * slowest bandwidth) + largest latency`` (every ring
    collective's time is a multiple of it), over all orders, as NCCL builds its
    rings along NVLink; for more devices, the given order. Taking the best of a
    fixed set of candidates keeps every collective's time monotone in every link's
    bandwidth (a faster link never makes a collective slower).
    """
    given = tuple(devices)
    n = len(given)
    if n <= 2 or n > EXACT_RING_MAX_DEVICES:  # before the n x n look-ups below
        return given
    idx = [topology.index(d) for d in given]
    # two places of a ring on one device (two parts of a tuple there) move nothing
    # between them: no link, as ring_links skips them (a topology's own diagonal is 0)
    bw = [[topology.bandwidth_bytes_per_s[i][j] if i != j else math.inf for j in idx] for i in idx]
    lat = [[topology.latency_s[i][j] if i != j else 0.0 for j in idx] for i in idx]
    off = [(bw[i][j], lat[i][j]) for i in range(n) for j in range(n) if i != j]
    if len(set(off)) == 1 or n > EXACT_RING_MAX_DEVICES:
        return given
    chunk = size_bytes / n

    def step_s(order: tuple[int, ...]) -> float:
        slowest, worst = float("inf"), 0.0
        for k in range(n):
            i, j = order[k], order[(k + 1) % n]
            slowest = min(slowest, bw[i][j])
            worst = max(worst, lat[i][j])
        return chunk / slowest + worst

    best = tuple(range(n))
    best_s = step_s(best)
    for rest in itertools.permutations(range(1, n)):  # both directions: links may differ
        order = (0, *rest)
        t = step_s(order)
        if t < best_s:
            best, best_s = order, t
    return tuple(given[k] for k in best)


def node_groups(devices: Sequence[int], topology: Topology) -> tuple[tuple[int, ...], ...]:
    """``devices`` grouped by ``topology.nodes`` (one group when the topology has no nodes)."""
    devices = tuple(dict.fromkeys(devices))
    if not topology.nodes:
        return (devices,)
    # by each device's node (one look-up each, not a pass over every node: grouped
    # collectives on thousands of nodes ask this for each of their groups)
    node_of = topology._node_index
    groups: dict[int, list[int]] = {}
    for d in devices:
        k = node_of.get(d)
        if k is None:  # in no node (as before, left out), or unknown: a TopologyError
            topology.index(d)
            continue
        groups.setdefault(k, []).append(d)
    return tuple(tuple(groups[k]) for k in sorted(groups))


def collective_time_s(
    kind: str,
    size_bytes: float,
    devices: Sequence[int],
    topology: Topology,
    root: int | None = None,
) -> float:
    """Predicted time of collective ``kind`` moving a tensor of ``size_bytes`` among ``devices``.

    ``root`` is the source of broadcast/scatter and the destination of
    gather/reduce (and the destination of ``send``, whose source is ``devices[0]``).
    """
    kind = kind.lower()
    if kind not in COLLECTIVES:
        raise TopologyError(f"unknown collective {kind!r} (one of {', '.join(COLLECTIVES)})")
    for d in devices:
        topology.index(d)  # raises a TopologyError naming the missing device
    if topology.collectives is not None:  # achieved bandwidths (ir.hardware.comm)
        return topology.collectives.time_s(kind, size_bytes, devices, topology, root)
    if kind == "send":
        return send_time_s(
            size_bytes, devices[0], root if root is not None else devices[-1], topology
        )
    if kind == "local":  # each device keeps a block of what it has: nothing moves
        return 0.0
    n = len(devices)
    if kind in ("broadcast", "scatter", "gather", "reduce"):
        root = devices[0] if root is None else root
        part = size_bytes if kind == "broadcast" or kind == "reduce" else size_bytes / n
        return sum(send_time_s(part, root, d, topology) for d in devices if d != root)
    if n <= 1:
        return 0.0
    flat = ring_time_s(kind, size_bytes, ring_order(devices, topology, size_bytes), topology)
    if kind == "allreduce":
        groups = node_groups(devices, topology)
        if len(groups) > 1 and len({len(g) for g in groups}) == 1 and len(groups[0]) > 1:
            return min(flat, hierarchical_allreduce_time_s(size_bytes, groups, topology))
    return flat


def ring_time_s(kind: str, size_bytes: float, ring: Sequence[int], topology: Topology) -> float:
    """Ring all-reduce, all-gather, reduce-scatter or all-to-all over ``ring`` in that order."""
    n = len(ring)
    if n <= 1:
        return 0.0
    bandwidth, latency = ring_links(ring, topology)
    steps = n - 1
    if kind == "allreduce":
        return 2 * steps / n * size_bytes / bandwidth + 2 * steps * latency
    return steps / n * size_bytes / bandwidth + steps * latency


def hierarchical_allreduce_time_s(
    size_bytes: float, groups: Sequence[Sequence[int]], topology: Topology
) -> float:
    """All-reduce over nodes: reduce-scatter in each group, all-reduce across groups, all-gather.

    ``groups`` lists each node's devices (equal sizes); the cross-node ring joins the
    i-th device of every group, carrying 1/g of the data.
    """
    g = len(groups[0])
    if any(len(grp) != g for grp in groups):
        raise TopologyError("hierarchical all-reduce needs groups of equal size")

    def ring(kind: str, size: float, group: Sequence[int]) -> float:
        return ring_time_s(kind, size, ring_order(group, topology, size), topology)

    intra = max(ring("reducescatter", size_bytes, grp) for grp in groups)
    across = max(ring("allreduce", size_bytes / g, [grp[i] for grp in groups]) for i in range(g))
    gather = max(ring("allgather", size_bytes, grp) for grp in groups)
    return intra + across + gather
