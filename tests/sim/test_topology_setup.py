"""Topology setup is linear in devices (issue 17, class 6).

Before, ``Topology.preset("a100-hgx", 4000)`` took ~6 s: the presets and
``Topology.uniform`` built and checked a dense n x n link matrix. Now links are given by
a rule (``ir.device.LinkTable``) whose distinct values are checked once.
"""

from __future__ import annotations

import time

from hypothesis import given, settings
from hypothesis import strategies as st

import ir
from ir.hardware import NODES
from ir.limits import MAX_DEVICES


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(sorted(NODES)), st.integers(1, 40), st.data())
def test_preset_links_follow_the_node_rule(name: str, n: int, data):
    spec = NODES[name]
    topology = ir.Topology.preset(name, n)
    per = spec.devices_per_node
    i = data.draw(st.integers(0, n - 1), label="i")
    j = data.draw(st.integers(0, n - 1), label="j")
    if i == j:
        want = (0.0, 0.0)
    elif i // per == j // per:
        want = (spec.intra_bandwidth_bytes_per_s(i % per, j % per), spec.intra_latency_s)
    else:
        want = (spec.inter_bandwidth_bytes_per_s, spec.inter_latency_s)
    assert (topology.bandwidth(i, j), topology.latency(i, j)) == want
    assert topology == ir.Topology.preset(name, n)
    assert hash(topology) == hash(ir.Topology.preset(name, n))
    assert sorted(d for node in topology.nodes for d in node) == list(range(n))


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 30), st.floats(1e3, 1e12), st.floats(0, 1e-3))
def test_a_uniform_topology_equals_its_dense_matrix(n: int, bandwidth: float, latency: float):
    ruled = ir.Topology.uniform(n, link_bandwidth_bytes_per_s=bandwidth, link_latency_s=latency)
    dense = ir.Topology(
        ruled.devices,
        tuple(tuple(row) for row in ruled.bandwidth_bytes_per_s),
        tuple(tuple(row) for row in ruled.latency_s),
        name=ruled.name,
    )
    for i in range(n):
        for j in range(n):
            assert ruled.bandwidth(i, j) == dense.bandwidth(i, j)
            assert ruled.latency(i, j) == dense.latency(i, j)


def test_setting_up_thousands_of_devices_takes_linear_time():
    start = time.perf_counter()
    ir.Topology.preset("a100-hgx", 4000)
    ir.Topology.uniform(4000)
    assert time.perf_counter() - start < 2.0  # ~0.15 s; the dense setup took ~8 s
    start = time.perf_counter()
    big = ir.Topology.preset("h100-hgx", MAX_DEVICES)
    assert time.perf_counter() - start < 10.0  # ~1.5 s: one Device per id, no n**2 links
    assert big.bandwidth(0, MAX_DEVICES - 1) == NODES["h100-hgx"].inter_bandwidth_bytes_per_s
    assert big.index(MAX_DEVICES - 1) == MAX_DEVICES - 1  # a dict, not a scan


@settings(max_examples=80, deadline=None)
@given(
    st.one_of(
        st.floats(allow_nan=True, allow_infinity=True),
        st.integers(-5, 5),
        st.text(max_size=2),
        st.none(),
        st.booleans(),
    ),
    st.sampled_from(["bandwidth", "latency"]),
)
def test_a_dense_link_of_any_value_is_taken_or_refused_with_a_topology_error(value, which):
    good = ir.Topology.uniform(2)
    bw = [[0.0, 1e9], [1e9, 0.0]]
    lat = [[0.0, 1e-6], [1e-6, 0.0]]
    (bw if which == "bandwidth" else lat)[0][1] = value
    try:
        topology = ir.Topology(good.devices, tuple(map(tuple, bw)), tuple(map(tuple, lat)))
    except ir.TopologyError:
        return
    assert isinstance(value, (int, float)) and not isinstance(value, bool)
    assert topology.bandwidth(0, 1) > 0 and 0 <= topology.latency(0, 1) < float("inf")
