"""The simulator against closed forms: op sums, pipeline bubbles, ring collectives."""

from __future__ import annotations

import pytest
from seed_mlp_texts import SEQUENTIAL
from sim_programs import uniform_pipeline

import ir
from ir import FunctionBuilder, TensorType
from ir.collectives import (
    collective_time_s,
    hierarchical_allreduce_time_s,
    ring_order,
    ring_time_s,
)
from ir.hardware import hierarchical
from ir.registry import CostContext, get_op

GPU = dict(peak_flops=1e12, mem_bandwidth_bytes_per_s=1e11, launch_overhead_s=5e-6)


def predicted_op_time_s(op: ir.Op, device: ir.Device, combine: str) -> float:
    c = get_op(op.op_type).cost_rule(
        CostContext(
            tuple(v.type for v in op.inputs), tuple(v.type for v in op.outputs), op.attributes
        )
    )
    t_flops = c.flops / device.peak_flops
    t_bytes = (c.bytes_read + c.bytes_written) / device.mem_bandwidth_bytes_per_s
    both = t_flops + t_bytes if combine == "additive" else max(t_flops, t_bytes)
    return device.launch_overhead_s + both


@pytest.mark.parametrize("combine", ["roofline", "additive"])
def test_seed_mlp_on_one_device_takes_the_sum_of_its_op_times(combine):
    f = ir.parse(SEQUENTIAL)
    topology = ir.Topology.uniform(1, **GPU)
    result = ir.simulate(f, topology, combine=combine)
    want = sum(predicted_op_time_s(op, topology.devices[0], combine) for op in f.ops)
    assert result.step_time_s == pytest.approx(want, rel=1e-12)
    assert [ev.op for ev in result.events] == list(f.ops)
    assert result.busy_s[0] == pytest.approx(want)
    assert result.idle_s[0] == pytest.approx(0.0, abs=1e-15)


def test_additive_is_never_faster_than_roofline():
    f = ir.parse(SEQUENTIAL)
    topology = ir.Topology.uniform(1, **GPU)
    roofline = ir.simulate(f, topology).step_time_s
    additive = ir.simulate(f, topology, combine="additive").step_time_s
    assert roofline < additive <= 2 * roofline


FREE_LINKS = dict(link_bandwidth_bytes_per_s=1e30, link_latency_s=0.0)


@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("microbatches", [1, 2, 5, 8])
def test_uniform_pipeline_idle_fraction_is_p_minus_1_over_m_plus_p_minus_1(stages, microbatches):
    f = uniform_pipeline(stages, microbatches)
    result = ir.simulate(f, ir.Topology.uniform(stages, **GPU, **FREE_LINKS))
    stage_s = result.events_on(0, "compute")[0].dur_s
    assert result.step_time_s == pytest.approx((microbatches + stages - 1) * stage_s, rel=1e-9)
    want = (stages - 1) / (microbatches + stages - 1)
    for device in range(stages):
        assert result.idle_fraction(device) == pytest.approx(want, rel=1e-9, abs=1e-12)


def test_pipeline_with_costly_sends_is_bounded_by_the_send_closed_form():
    stages, microbatches = 3, 4
    f = uniform_pipeline(stages, microbatches)
    result = ir.simulate(f, ir.Topology.uniform(stages, **GPU, link_bandwidth_bytes_per_s=1e9))
    stage_s = result.events_on(0, "compute")[0].dur_s
    send_s = result.events_on(0, "communication")[0].dur_s
    assert send_s > 0
    # every microbatch crosses p-1 links; the last one can start no earlier than m-1 stages in
    lower = microbatches * stage_s + (stages - 1) * (stage_s + send_s)
    assert result.step_time_s >= lower * (1 - 1e-12)


def allreduce_program(kind: str, n: int, rows: int = 64, cols: int = 1024) -> ir.Function:
    b = FunctionBuilder(kind)
    xs = [b.input(f"x{d}", TensorType((rows, cols), device=d)) for d in range(n)]
    ys = b.call(kind, b.call("MakeTuple", *xs))
    return b.finish([ys])


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_ring_allreduce_matches_its_formula(n):
    bandwidth, latency = 25e9, 3e-6
    topology = ir.Topology.uniform(
        n, **GPU, link_bandwidth_bytes_per_s=bandwidth, link_latency_s=latency
    )
    size = 64 * 1024 * 4
    result = ir.simulate(allreduce_program("AllReduce", n), topology)
    want = 2 * (n - 1) / n * size / bandwidth + 2 * (n - 1) * latency
    assert result.step_time_s == pytest.approx(want, rel=1e-12)
    events = [ev for ev in result.events if ev.op.op_type == "AllReduce"]
    assert sorted(ev.device for ev in events) == list(range(n))
    assert all(ev.stream == "communication" and ev.dur_s == events[0].dur_s for ev in events)


@pytest.mark.parametrize("kind", ["AllGather", "ReduceScatter"])
def test_ring_allgather_and_reducescatter_match_their_formula(kind):
    n, bandwidth, latency = 4, 10e9, 2e-6
    topology = ir.Topology.uniform(
        n, **GPU, link_bandwidth_bytes_per_s=bandwidth, link_latency_s=latency
    )
    result = ir.simulate(allreduce_program(kind, n), topology)
    full = 64 * 1024 * 4 * (n if kind == "AllGather" else 1)  # S: the gathered tensor
    want = (n - 1) / n * full / bandwidth + (n - 1) * latency
    assert result.step_time_s == pytest.approx(want, rel=1e-12)


def two_nodes(per_node: int = 4) -> ir.Topology:
    return hierarchical(
        2,
        per_node,
        peak_flops=1e12,
        mem_bandwidth_bytes_per_s=1e12,
        memory_bytes=1e10,
        intra_bandwidth_bytes_per_s=300e9,
        inter_bandwidth_bytes_per_s=25e9,
    )


def test_hierarchical_allreduce_beats_a_flat_ring_on_two_nodes():
    topology = two_nodes()
    devices = list(range(8))
    size = 256e6
    flat = ring_time_s("allreduce", size, devices, topology)
    hier = hierarchical_allreduce_time_s(size, topology.nodes, topology)
    assert hier < flat / 2
    assert collective_time_s("allreduce", size, devices, topology) == pytest.approx(hier)
    result = ir.simulate(allreduce_program("AllReduce", 8, 1024, 1024), topology)
    assert result.step_time_s == pytest.approx(
        hierarchical_allreduce_time_s(1024 * 1024 * 4, topology.nodes, topology)
    )


def test_within_one_node_the_flat_ring_is_used():
    topology = two_nodes()
    assert collective_time_s("allreduce", 1e6, [0, 1, 2, 3], topology) == pytest.approx(
        ring_time_s("allreduce", 1e6, [0, 1, 2, 3], topology)
    )


def test_the_dgx1_ring_follows_nvlink():
    topology = ir.Topology.preset("v100-dgx1", 8)
    ring = ring_order(range(8), topology)
    links = [topology.bandwidth(ring[i], ring[(i + 1) % 8]) for i in range(8)]
    assert min(links) == max(topology.bandwidth(0, d) for d in range(1, 8))


def test_send_takes_latency_plus_bytes_over_bandwidth():
    b = FunctionBuilder("send")
    x = b.input("x", TensorType((256, 256), device=0))
    f = b.finish([b.call("Send", x, to_device=1)])
    topology = ir.Topology.uniform(2, **GPU, link_bandwidth_bytes_per_s=5e9, link_latency_s=7e-6)
    result = ir.simulate(f, topology)
    assert result.step_time_s == pytest.approx(7e-6 + 256 * 256 * 4 / 5e9)
    assert {(ev.device, ev.stream) for ev in result.events} == {
        (0, "communication"),
        (1, "communication"),
    }
