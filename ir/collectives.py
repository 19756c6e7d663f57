"""Alpha-beta time of point-to-point transfers and collectives on a Topology.

Shared by the simulator and by sharding propagation (which picks the cheapest
redistribution), so both agree on what communication costs. Collectives use
ring algorithms over the slowest link of the ring, in group order:

* all-reduce: ``2 (n-1)/n * S / B + 2 (n-1) * alpha``
* all-gather, reduce-scatter: ``(n-1)/n * S / B + (n-1) * alpha``
  (``S`` is the size of the full, gathered tensor)
* all-to-all: ``(n-1)/n * S / B + (n-1) * alpha`` (``S``: one device's buffer)
* broadcast, scatter, gather, reduce: the root sends (or receives) each other
  device's part in turn over its own links.

A hierarchical all-reduce (reduce-scatter inside nodes, all-reduce across
nodes, all-gather inside nodes) is offered by :func:`hierarchical_allreduce_time_s`.
"""

from __future__ import annotations

from collections.abc import Sequence

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
)


def send_time_s(size_bytes: float, src: int, dst: int, topology: Topology) -> float:
    """Time to move ``size_bytes`` from ``src`` to ``dst`` (0 on the same device)."""
    if src == dst:
        return 0.0
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
    if kind == "send":
        return send_time_s(
            size_bytes, devices[0], root if root is not None else devices[-1], topology
        )
    n = len(devices)
    if kind in ("broadcast", "scatter", "gather", "reduce"):
        root = devices[0] if root is None else root
        part = size_bytes if kind == "broadcast" or kind == "reduce" else size_bytes / n
        return sum(send_time_s(part, root, d, topology) for d in devices if d != root)
    if n <= 1:
        return 0.0
    bandwidth, latency = ring_links(devices, topology)
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
    intra = max(collective_time_s("reducescatter", size_bytes, grp, topology) for grp in groups)
    across = max(
        collective_time_s("allreduce", size_bytes / g, [grp[i] for grp in groups], topology)
        for i in range(g)
    )
    gather = max(collective_time_s("allgather", size_bytes, grp, topology) for grp in groups)
    return intra + across + gather
