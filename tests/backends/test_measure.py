"""torch_dist.measure times every op on every rank; the overlay pairs it with the simulator's."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import ir
from ir.backends import torch_dist
from ir.backends.measurement import Measurement
from widgets.measured import (
    device_errors,
    measured_vs_simulated_figure,
    measured_vs_simulated_spec,
    op_pairs,
)

pytest.importorskip("torch.distributed", reason="torch is not installed (pip install torch)")


def _data_parallel_step():
    t = ir.transforms.training(ir.models.mlp(16, 8, 16, 4, layers=2), "sgd")
    g = ir.transforms.megatron(t, 2)  # a Pmap: measure runs it unrolled
    return g, ir.distribute(g, ir.random_inputs(t, seed=3), source=t)


@pytest.fixture(scope="module")
def measured():
    g, inputs = _data_parallel_step()
    return torch_dist.measure(g, inputs, steps=3, warmup=1)


def test_every_op_on_every_device_is_timed_as_the_simulator_places_it(measured):
    sim = ir.simulate(measured.function, ir.Topology.preset("a100-hgx", 2))
    assert measured.devices == (0, 1)
    for events in measured.step_events:
        placed = {(e.op, e.device, e.stream) for e in events}
        assert placed == {(e.op, e.device, e.stream) for e in sim.events}
        assert len(placed) == len(events)  # each op once per device per step
        assert all(e.dur_s >= 0 and e.start_s >= 0 for e in events)


def test_warm_up_is_excluded_and_the_step_is_the_median(measured):
    assert measured.steps == len(measured.steps_s) == len(measured.step_events) == 3
    assert measured.step_time_s == pytest.approx(float(np.median(measured.steps_s)))
    assert measured.events == list(measured.step_events[measured.median_step])


def test_step_time_is_bounded_by_each_ranks_own_work(measured):
    """A rank runs its ops one after another: they do not overlap, the step covers them."""
    step_s = measured.steps_s[measured.median_step]
    for d in measured.devices:
        mine = measured.events_on(d)
        for a, b in itertools.pairwise(mine):
            assert b.start_s >= a.end_s - 1e-9
        assert measured.busy_s[d] + measured.communication_s[d] <= step_s + 1e-9
        assert measured.busy_s[d] > 0
    assert step_s == pytest.approx(max(e.end_s for e in measured.events))


def test_a_collective_waits_for_its_last_caller(measured):
    for (op, device), wait_s in measured.wait_s.items():
        mine = [e for e in measured.events if e.op is op]
        event = next(e for e in mine if e.device == device)
        latest = max(e.start_s for e in mine)
        assert wait_s == pytest.approx(min(latest - event.start_s, event.dur_s))
        assert wait_s >= 0
    assert any(w == 0 for w in measured.wait_s.values())  # the last caller waits for nobody


def test_the_overlay_pairs_the_same_ops(measured):
    topology = ir.Topology.preset("a100-hgx", 2)
    for program in (measured.function, _data_parallel_step()[0]):  # unrolled, and with Pmap
        sim = ir.simulate(program, topology)
        pairs = op_pairs(measured, sim)
        assert len(pairs) == len(measured.events)
        for p in pairs:
            assert p.simulated.device == p.device and p.simulated.stream == p.measured.stream
            assert p.simulated.op.op_type == p.op.op_type
    traces, layout = measured_vs_simulated_spec(measured, sim)
    half = len(traces) // 2  # the same Gantt traces (one per device's compute, ...) twice
    assert half >= 3 and [t["yaxis"] for t in traces] == ["y"] * half + ["y2"] * half
    names = [t["name"].removeprefix("measured: ").removeprefix("simulated: ") for t in traces]
    assert names[:half] == names[half:]
    assert {t["xaxis"] for t in traces} == {"x"}  # one time axis
    assert [r["device"] for r in layout["meta"]["devices"]] == [0, 1]
    assert "measured" in layout["title"]["text"] and "simulated" in layout["title"]["text"]
    assert measured_vs_simulated_figure(measured, sim).layout.yaxis2.domain[1] < 0.5


def test_device_errors_from_records():
    f = ir.models.mlp(4, 3, 5, 2)
    n = len(f.ops)
    steps = [
        (10.0 + k, [(i, 10.0 + k + i, 10.0 + k + i + 1 + k) for i in range(n)]) for k in (0, 1, 2)
    ]
    m = Measurement.from_records(f, {0: steps})
    assert m.steps_s == pytest.approx((n, n + 1, n + 2))  # the last op of step k lasts 1 + k
    assert m.median_step == 1 and m.step_time_s == pytest.approx(n + 1)
    assert m.median_dur_s[(f.ops[0], 0)] == pytest.approx(2.0)
    sim = ir.simulate(f, ir.Topology.preset("a100-hgx", 1))
    (row,) = device_errors(m, sim)
    assert row.measured_busy_s == pytest.approx(2.0 * n)
    assert row.busy_error == pytest.approx(sim.busy_s[0] / (2.0 * n) - 1)


def test_a_failing_rank_gives_a_project_error_naming_its_device(monkeypatch):
    def broken(rank, op, xs):
        if rank.device == 1:
            raise RuntimeError("rank 1 broke")
        return torch_dist._allreduce(rank, op, xs)

    monkeypatch.setitem(torch_dist._LOWERINGS, "AllReduce", broken)  # forked workers see it
    g, inputs = _data_parallel_step()
    with pytest.raises(
        torch_dist.BackendError,
        match=r"device 1 \(rank 1 of 2\)(.|\n)*AllReduce(.|\n)*rank 1 broke",
    ) as e:
        torch_dist.measure(g, inputs, steps=1, warmup=0, timeout_s=60)
    assert e.value.device == 1 and "AllReduce" in e.value.op


def test_measure_refuses_no_steps():
    g, inputs = _data_parallel_step()
    with pytest.raises(torch_dist.BackendError, match="steps >= 1"):
        torch_dist.measure(g, inputs, steps=0)
