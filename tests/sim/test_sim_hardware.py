"""Hardware presets, hierarchical topologies and CPU calibration."""

from __future__ import annotations

import pytest

import ir
from ir import FunctionBuilder, TensorType
from ir.hardware import calibrate_cpu


def test_presets_are_listed_and_build():
    names = ir.Topology.presets()
    assert {"v100-dgx1", "v100-dgx2", "a100-hgx", "h100-hgx", "h200-hgx", "cpu"} <= set(names)
    assert {"v100-pcie", "a100-pcie", "rtx4090"} <= set(names)
    for name in names:
        for n in (1, 8, 17):
            topology = ir.Topology.preset(name, n)
            assert topology.device_ids == tuple(range(n))


@pytest.mark.parametrize(
    ("name", "per_node"),
    [
        ("v100-dgx1", 8),
        ("v100-dgx2", 16),
        ("v100-pcie", 8),
        ("a100-hgx", 8),
        ("a100-pcie", 8),
        ("h100-hgx", 8),
        ("h200-hgx", 8),
        ("rtx4090", 8),
    ],
)
def test_gpu_presets_become_hierarchical_beyond_one_node(name, per_node):
    topology = ir.Topology.preset(name, 2 * per_node)
    assert topology.nodes == (tuple(range(per_node)), tuple(range(per_node, 2 * per_node)))
    inside = max(topology.bandwidth(0, d) for d in range(1, per_node))
    across = topology.bandwidth(0, per_node)
    assert across < inside
    assert topology.latency(0, per_node) > topology.latency(0, 1)


def test_newer_gpus_are_faster():
    flops = [
        ir.Topology.preset(n, 1).devices[0].peak_flops
        for n in ("v100-dgx1", "a100-hgx", "h100-hgx")
    ]
    assert flops == sorted(flops)


def test_calibrate_cpu_gives_a_topology_the_simulator_times_by():
    # How well it predicts this machine is a benchmark figure (benchmarks/bench_accuracy.py,
    # docs/calibration.md): a timed comparison here would flake on a busy machine.
    topology = calibrate_cpu()
    device = topology.devices[0]
    assert device.device_type == "cpu"
    assert device.peak_flops > 1e8 and device.mem_bandwidth_bytes_per_s > 1e8

    def matmul_s(n: int) -> float:
        b = FunctionBuilder("mm")
        x = b.input("x", TensorType((n, n), device=0))
        return ir.simulate(b.finish([b.call("MatMul", x, x)]), topology).step_time_s

    # the roofline on the fitted figures: never faster than the fitted peak allows, and
    # a matmul 4x larger each way costs more than 4x (flops grow 64x, bytes 16x)
    assert matmul_s(384) >= 2 * 384**3 / device.peak_flops_for("float32", matrix=True)
    assert matmul_s(1536) > 4 * matmul_s(384)


def test_a_multi_device_cpu_topology_links_processes_by_memory_copies():
    topology = calibrate_cpu(2)
    assert topology.bandwidth(0, 1) > 0 and topology.latency(0, 1) >= 0


def test_h200_is_an_h100_with_more_and_faster_memory():
    h100, h200 = (ir.Topology.preset(n, 1).devices[0] for n in ("h100-hgx", "h200-hgx"))
    assert h200.matrix_peak_flops == h100.matrix_peak_flops
    assert h200.vector_peak_flops == h100.vector_peak_flops
    assert h200.memory_bytes == 141e9 and h200.mem_bandwidth_bytes_per_s == 4.8e12
    assert h100.memory_bytes < h200.memory_bytes
