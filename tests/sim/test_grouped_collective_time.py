"""A grouped collective's time is its slowest group's; the groups of one link class
(``Topology.link_class``) are timed once, and the answer is the same as timing each."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

import ir
from ir.collectives import Collective, collective_time_s
from ir.hardware import NODES

KINDS = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast")


def _dense(topology: ir.Topology) -> ir.Topology:
    """The same topology with its links as dense matrices (no link classes)."""
    return ir.Topology(
        topology.devices,
        tuple(tuple(row) for row in topology.bandwidth_bytes_per_s),
        tuple(tuple(row) for row in topology.latency_s),
        name=topology.name,
        nodes=topology.nodes,
        collectives=topology.collectives,
    )


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(sorted(NODES)),
    st.integers(2, 40),
    st.sampled_from(KINDS),
    st.floats(1e2, 1e9),
    st.booleans(),
    st.data(),
)
def test_a_grouped_collective_takes_its_slowest_group(name, n, kind, size, ideal, data):
    topology = ir.Topology.preset(name, n, ideal=ideal)
    devices = data.draw(st.permutations(range(n)), label="devices")
    size_of_group = data.draw(st.sampled_from([k for k in range(1, n + 1) if n % k == 0]))
    groups = tuple(tuple(devices[i : i + size_of_group]) for i in range(0, n, size_of_group))
    op = Collective(kind, size, groups[0], groups=groups)
    each = max(collective_time_s(kind, size, g, topology) for g in groups)
    assert op.time_s(topology) == each
    assert op.time_s(_dense(topology)) == each  # dense links: every group timed


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(NODES)), st.integers(2, 6), st.sampled_from(KINDS), st.data())
def test_groups_of_one_link_class_take_the_same_time(name, nodes, kind, data):
    per = NODES[name].devices_per_node
    topology = ir.Topology.preset(name, nodes * per)
    k = data.draw(st.integers(2, min(nodes * per, 9)), label="group size")
    a = data.draw(st.lists(st.integers(0, nodes * per - 1), min_size=k, max_size=k, unique=True))
    shift = per * data.draw(st.integers(0, nodes - 1), label="nodes on")
    b = [(d + shift) % (nodes * per) for d in a]  # the same places, on other nodes
    if sorted({d // per for d in a}) == [d // per for d in a[:1]] or nodes == 1:
        assert topology.link_class(a) == topology.link_class(b)  # one node: moved whole
    c = data.draw(st.lists(st.integers(0, nodes * per - 1), min_size=k, max_size=k, unique=True))
    for x, y in ((a, b), (a, c)):
        if topology.link_class(x) == topology.link_class(y):
            assert collective_time_s(kind, 1e6, x, topology) == collective_time_s(
                kind, 1e6, y, topology
            )


def test_tensor_groups_on_every_node_are_one_class_and_dense_links_have_none():
    topology = ir.Topology.preset("a100-hgx", 64)
    classes = {topology.link_class(range(8 * i, 8 * i + 8)) for i in range(8)}
    assert len(classes) == 1 and None not in classes
    assert topology.link_class([0, 8]) != topology.link_class([0, 1])  # across nodes
    assert _dense(topology).link_class(range(8)) is None
