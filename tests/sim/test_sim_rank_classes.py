"""Rank classes: a pmap body walked once per class gives every figure that walking every
device gives (step time, events, bars, busy, idle and communication times, memory)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import ir
from ir import models, transforms
from ir.sim import SimulationError

# 16 heads: tensor parallelism up to 16 splits attention by whole heads
GPT = models.gpt(batch=32, seq=32, hidden=32, heads=16, vocab=64, layers=4)
ADAM = transforms.training(GPT, optimizer="adam")
TOPOLOGIES = {16: ir.Topology.preset("a100-hgx", 16), 32: ir.Topology.preset("h100-hgx", 32)}


def _events(result: ir.SimResult) -> list[tuple]:
    return sorted(
        (e.device, e.stream, e.start_s, e.dur_s, e.op.op_type, e.channel) for e in result.events
    )


def _same_figures(walked_once: ir.SimResult, every: ir.SimResult) -> None:
    assert walked_once.step_time_s == every.step_time_s
    assert walked_once.devices == every.devices
    assert walked_once.num_ops == every.num_ops
    for name in ("busy_s", "communication_s", "idle_s", "peak_memory_bytes", "oom"):
        assert getattr(walked_once, name) == getattr(every, name), name
    assert _events(walked_once) == _events(every)
    a, b = walked_once.bars, every.bars
    oa = np.lexsort((a.start_s, a.stream, a.device))
    ob = np.lexsort((b.start_s, b.stream, b.device))
    for column in ("device", "stream", "start_s", "dur_s", "flops", "bytes"):
        np.testing.assert_array_equal(getattr(a, column)[oa], getattr(b, column)[ob])
    for d in every.devices:
        for x, y in zip(walked_once.memory_timeline(d), every.memory_timeline(d)):
            np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize(
    ("dp", "tp", "pp", "m", "schedule", "options"),
    [
        (16, 1, 1, 1, "1f1b", {}),
        (4, 2, 2, 4, "1f1b", {}),
        (2, 2, 4, 8, "gpipe", {}),
        (2, 4, 2, 4, "1f1b", {"zero": 2, "sequence_parallel": True}),
        (4, 1, 4, 8, "interleaved", {"chunks": 2, "zero": 1}),
        (1, 16, 1, 1, "1f1b", {"allow_replication": True}),  # 4 heads: attention whole
    ],
)
def test_the_3d_step_walked_once_per_class_gives_every_figure(
    dp, tp, pp, m, schedule, options
) -> None:
    g = transforms.megatron(ADAM, dp, tp, pp, m, schedule, **options)
    assert len(g.rank_classes) == pp and all(len(c) == dp * tp for c in g.rank_classes)
    topology = TOPOLOGIES[16]
    once, every = ir.simulate(g, topology), ir.simulate(g, topology, symmetry=False)
    _same_figures(once, every)
    if dp * tp > 1:
        assert once.walked_ops * 2 < every.walked_ops


def test_classes_across_nodes_of_a_multi_node_preset() -> None:
    g = transforms.megatron(ADAM, 8, 2, 2, 4)
    topology = TOPOLOGIES[32]
    _same_figures(ir.simulate(g, topology), ir.simulate(g, topology, symmetry=False))


def test_devices_of_different_hardware_are_never_one_class() -> None:
    g = transforms.megatron(ADAM, 4, 1, 1, 1)
    fast = ir.Topology.preset("a100-hgx", 4)
    devices = list(fast.devices)
    devices[3] = replace(devices[3], peak_flops=1e12, matrix_peak_flops=(), vector_peak_flops=())
    mixed = replace(fast, devices=tuple(devices))
    once, every = ir.simulate(g, mixed), ir.simulate(g, mixed, symmetry=False)
    _same_figures(once, every)
    assert once.busy_s[3] > once.busy_s[0]


def test_a_false_declaration_is_refused_naming_the_device() -> None:
    b = ir.FunctionBuilder("lonely")
    x0 = b.input("x0", ir.TensorType((64, 64), device=0))
    x1 = b.input("x1", ir.TensorType((64, 64), device=1))
    f = b.finish([b.call("MatMul", x0, x0), b.call("Relu", x1)])
    declared = replace(f, rank_classes=((0, 1),))
    with pytest.raises(SimulationError, match="device 1 alone"):
        ir.simulate(declared, ir.Topology.preset("a100-hgx", 2))
    assert ir.simulate(declared, ir.Topology.preset("a100-hgx", 2), symmetry=False).step_time_s
