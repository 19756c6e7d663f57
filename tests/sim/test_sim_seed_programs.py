"""The seed's MLP programs, written in the text format, simulated: the shape of each timeline."""

from __future__ import annotations

import pytest
from seed_mlp_texts import DATA_PARALLEL, HORIZONTAL, PIPELINE, SEQUENTIAL
from sim_programs import assert_streams_never_overlap, mlp_pipeline, nested_pmap_matmul

import ir

# compute-heavy enough that matmuls dominate launch overheads
TOPOLOGY = ir.Topology.uniform(
    3,
    peak_flops=1e9,
    mem_bandwidth_bytes_per_s=1e10,
    link_bandwidth_bytes_per_s=1e9,
    link_latency_s=1e-6,
    launch_overhead_s=1e-6,
)


def events(result: ir.SimResult, op_type: str, device: int | None = None) -> list[ir.sim.Event]:
    return [
        ev
        for ev in result.events
        if ev.op.op_type == op_type and (device is None or ev.device == device)
    ]


@pytest.mark.parametrize("text", [SEQUENTIAL, DATA_PARALLEL, HORIZONTAL, PIPELINE])
def test_every_seed_program_simulates_with_streams_that_never_overlap(text):
    result = ir.simulate(ir.parse(text), TOPOLOGY)
    assert result.step_time_s > 0
    assert_streams_never_overlap(result)


def test_data_parallel_runs_the_body_on_each_worker_and_ends_with_allreduces():
    result = ir.simulate(ir.parse(DATA_PARALLEL), TOPOLOGY)
    workers = (1, 2)
    for d in workers:
        assert len(events(result, "MatMul", d)) == 2
        assert len(events(result, "MatMulGrad", d)) == 2
    allreduces = events(result, "AllReduce")
    assert {ev.device for ev in allreduces} == set(workers)
    backward_end = max(ev.end_s for ev in events(result, "MatMulGrad"))
    last_allreduce = max(allreduces, key=lambda ev: ev.start_s)
    # the last gradient's all-reduce waits for the end of backward on every worker ...
    assert last_allreduce.start_s >= backward_end
    # ... and the first one overlaps the last gradient's computation (separate streams)
    first_allreduce = min(allreduces, key=lambda ev: ev.start_s)
    assert first_allreduce.start_s < backward_end
    # after the all-reduces, the workers only update weights: the step ends with them
    for d in workers:
        after = [ev for ev in result.events_on(d, "compute") if ev.start_s >= first_allreduce.end_s]
        assert {ev.op.op_type for ev in after} == {"SGDOptimizer"}


def test_horizontal_all_reduces_activations_between_forward_and_backward():
    result = ir.simulate(ir.parse(HORIZONTAL), TOPOLOGY)
    (allreduce, _) = events(result, "AllReduce")  # one op, one event per worker
    forward_end = max(ev.end_s for ev in events(result, "MatMul"))
    backward_start = min(ev.start_s for ev in events(result, "Loss"))
    assert forward_end <= allreduce.start_s
    assert allreduce.end_s <= backward_start
    # each worker holds half of each weight
    assert events(result, "MatMul", 1)[0].flops == 2 * 64 * 24 * 32


def test_pipeline_shows_bubbles():
    result = ir.simulate(ir.parse(PIPELINE), TOPOLOGY)
    stage0 = result.events_on(0, "compute")
    stage1 = result.events_on(1, "compute")

    def busy(evs, t):
        return any(ev.start_s <= t < ev.end_s for ev in evs)

    # while the last stage runs the forward of the last microbatch, stage 0 is idle
    forward_last = [ev for ev in stage1 if ev.op.op_type == "MatMul"][-1]
    mid = (forward_last.start_s + forward_last.end_s) / 2
    assert not busy(stage0, mid)
    # and before the first activation arrives, stage 1 is idle
    first = stage0[0]
    assert not busy(stage1, (first.start_s + first.end_s) / 2)
    assert result.idle_fraction(0) > 0.2 and result.idle_fraction(1) > 0.2


def test_more_microbatches_shrink_the_bubble():
    idle = []
    for k in (2, 4, 8):
        result = ir.simulate(mlp_pipeline(k), TOPOLOGY)
        idle.append(result.idle_fraction(0))
    assert idle[0] > idle[1] > idle[2]


def test_the_presets_simulate_the_seed_programs():
    f = ir.parse(DATA_PARALLEL)
    times = {
        name: ir.simulate(f, ir.Topology.preset(name, 3)).step_time_s
        for name in ir.Topology.presets()
    }
    assert all(t > 0 for t in times.values())
    assert times["h100-hgx"] < times["v100-dgx2"]


def test_nested_pmap_resolves_sub_devices_through_the_device_map():
    f = nested_pmap_matmul()  # seed 002: d.1 is device 3 for d = 1, device 4 for d = 2
    result = ir.simulate(f, ir.Topology.uniform(5))
    matmuls = events(result, "MatMul")
    assert sorted(ev.device for ev in matmuls) == [1, 2, 3, 4]
    assert len({ev.start_s for ev in matmuls}) == 1  # all four run at once
    assert all(ev.flops == 2 * 32 * 24 * 32 for ev in matmuls)
    inner_broadcasts = [ev for ev in events(result, "Broadcast") if ev.device in (3, 4)]
    assert len(inner_broadcasts) == 2
    assert result.peak_memory_bytes[3] > 0 and result.peak_memory_bytes[4] > 0
