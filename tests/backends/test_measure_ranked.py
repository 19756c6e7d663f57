"""torch_dist.measure on a ranked program: every op of every rank's own program timed on gloo,
the state carried between steps, live bytes per rank, and the overlay pairing it with the
simulation of the global program it was lowered from."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import ir
from ir import transforms
from ir.backends.measurement import Measurement
from ir.registry import OpKind, get_op
from ir.sharding import lower_to_ranks

pytest.importorskip("torch.distributed", reason="torch is not installed (pip install torch)")

from ir.backends import torch_dist, torch_kernels
from ir.backends.ranked_measure import measure_ranked
from ir.backends.torch_ranked import carry_of
from widgets.measured import measured_vs_simulated_spec, op_pairs
from widgets.measured_memory import measured_memory_spec

F64 = ir.DType.float64


def _training(dp: int, tp: int, pp: int):
    f = ir.models.mlp(8, 4, 6, 4, layers=2, training=True, dtype=F64)
    g = transforms.megatron(f, dp, tp, pp, 2 if pp > 1 else 1)
    return f, g, ir.distribute(g, ir.random_inputs(f, seed=1), source=f)


def _flat(values) -> list:
    out = []
    for v in values:
        out += _flat(v) if isinstance(v, tuple) else [v]
    return out


@pytest.fixture(scope="module")
def pipeline():
    f, g, inputs = _training(1, 1, 2)
    ranked = lower_to_ranks(g)
    m = torch_dist.measure(ranked, inputs, steps=2, warmup=1, carry=carry_of(f))
    return f, g, ranked, inputs, m


def test_every_op_of_every_rank_program_is_timed_once_per_step(pipeline):
    _, _, ranked, _, m = pipeline
    assert m.function is None and sorted(m.programs) == list(ranked.ranks) == [0, 1]
    assert m.steps == 2 and m.step_time_s == pytest.approx(float(np.median(m.steps_s)))
    for events in m.step_events:
        timed = [(e.op, e.device) for e in events]
        want = [
            (op, r)
            for r, program in m.programs.items()
            for op in program.ops
            if get_op(op.op_type).kind is not OpKind.CONTROL
        ]
        assert len(timed) == len(want) and set(timed) == set(want)  # each op once
        assert all(e.start_s >= 0 and e.dur_s >= 0 for e in events)
    for d in m.devices:  # one rank computes one op at a time
        compute = m.events_on(d, "compute")
        for a, b in itertools.pairwise(compute):
            assert b.start_s >= a.end_s - 1e-9
    assert {e.op.op_type for e in m.events if e.stream == "communication"} == {"SendTo", "RecvFrom"}


def test_the_state_moves_on_between_measured_steps(pipeline):
    """Warm-up 1 and 2 timed steps with carry are 3 training steps: the outputs are those
    of run_ranked's 3 carried steps, not of one step rerun."""
    f, _, ranked, inputs, m = pipeline
    three = torch_dist.run_ranked(ranked, inputs, steps=3, carry=carry_of(f))
    once = torch_dist.run_ranked(ranked, inputs)
    for got, want in zip(_flat(m.outputs), _flat(three), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-12)
    assert not np.allclose(_flat(m.outputs)[0], _flat(once)[0])


def test_live_bytes_start_with_the_inputs_and_end_with_inputs_and_outputs(pipeline):
    _, g, _, _, m = pipeline
    sim = ir.simulate(transforms.unroll_pmap(g), ir.Topology.preset("a100-hgx", 2))
    for r, program in m.programs.items():
        times, live = m.memory_timeline(r)
        inputs = sum(v.type.size_bytes for v in program.inputs)
        outputs = sum(v.type.size_bytes for v in program.outputs)
        assert np.all(np.diff(times) >= 0) and times[0] >= 0
        assert live[0] == inputs and live[-1] == inputs + outputs
        assert m.peak_memory_bytes[r] == live.max() >= inputs + outputs
        # the simulator's liveness of the global program: the same order of size
        assert 0.5 < m.peak_memory_bytes[r] / sim.peak_memory_bytes[r] < 2
    with pytest.raises(ir.errors.ExecutionError, match="no rank 7"):
        m.memory_timeline(7)


def test_the_overlay_pairs_every_rank_op_with_the_global_simulation(pipeline):
    _, g, _, _, m = pipeline
    sim = ir.simulate(transforms.unroll_pmap(g), ir.Topology.preset("a100-hgx", 2))
    pairs = op_pairs(m, sim)
    assert len(pairs) == len(m.events)
    for p in pairs:
        assert p.simulated.device == p.device and p.simulated.stream == p.measured.stream
        if p.measured.stream == "compute":
            assert p.simulated.op.op_type == p.op.op_type
        else:  # SendTo / RecvFrom: a global send on its sender / receiver
            assert p.simulated.op.op_type in ("Send", "SendEach")
    traces, layout = measured_vs_simulated_spec(m, sim)
    assert {t["xaxis"] for t in traces} == {"x"}
    assert [r["device"] for r in layout["meta"]["devices"]] == [0, 1]


def test_tensor_parallel_collectives_pair_with_the_global_all_reduce():
    _, g, inputs = _training(1, 2, 1)
    m = torch_dist.measure(lower_to_ranks(g), inputs, steps=1, warmup=0)
    sim = ir.simulate(transforms.unroll_pmap(g), ir.Topology.preset("a100-hgx", 2))
    comm = [p for p in op_pairs(m, sim) if p.measured.stream == "communication"]
    assert comm and len(comm) == sum(e.stream == "communication" for e in m.events)
    for p in comm:
        assert p.op.op_type == "RankCollective"
        assert p.simulated.op.op_type.lower() == p.op.attributes["kind"]


def test_a_failing_rank_in_a_measured_step_names_its_rank_and_op(monkeypatch):
    def broken(xs, a):
        raise RuntimeError("relu broke")

    monkeypatch.setitem(torch_kernels.TORCH_KERNELS, "Relu", broken)  # forked workers see it
    _, g, inputs = _training(1, 1, 2)
    with pytest.raises(torch_dist.BackendError, match=r"rank 0 failed at `(.|\n)*Relu(.|\n)*broke"):
        torch_dist.measure(lower_to_ranks(g), inputs, steps=1, warmup=0, timeout_s=60)


def test_bad_arguments_are_refused_before_any_process_starts():
    f, g, inputs = _training(1, 1, 2)
    ranked = lower_to_ranks(g)
    with pytest.raises(torch_dist.BackendError, match="steps >= 1 and warmup >= 0"):
        torch_dist.measure(ranked, inputs, steps=0)
    with pytest.raises(torch_dist.BackendError, match="steps >= 1 and warmup >= 0"):
        measure_ranked(ranked, inputs, warmup=-1)
    with pytest.raises(torch_dist.BackendError, match="needs a ranked program"):
        torch_dist.measure(g, inputs, carry=carry_of(f))
    with pytest.raises(torch_dist.BackendError, match="lower_to_ranks returns, got Function"):
        measure_ranked(g, inputs)
    with pytest.raises(torch_dist.BackendError, match="carry: output 99 does not exist"):
        measure_ranked(ranked, inputs, carry={99: "wA"})


def test_a_global_measurement_has_no_memory_curves():
    f = ir.models.mlp(4, 3, 5, 2)
    m = Measurement.from_records(f, {0: [(0.0, [(0, 0.0, 1.0)])]})
    assert not m.has_memory and m.peak_memory_bytes == {}
    with pytest.raises(ir.errors.ExecutionError, match="only ranked programs"):
        m.memory_timeline(0)
    sim = ir.simulate(f, ir.Topology.preset("a100-hgx", 1))
    with pytest.raises(ir.errors.ExecutionError, match="needs a ranked program"):
        measured_memory_spec(m, sim)


def _dp2_measured(overlap: bool):
    """A 3-layer MLP's data-parallel training step on 2 ranks, measured one step."""
    f = ir.models.mlp(16, 32, 64, 4, layers=3, training=True, dtype=F64)
    g = transforms.megatron(f, 2, 1, 1, 1)
    inputs = ir.distribute(g, ir.random_inputs(f, seed=1), source=f)
    ranked = lower_to_ranks(g)
    m = torch_dist.measure(ranked, inputs, steps=1, warmup=0, carry=carry_of(f), overlap=overlap)
    return g, inputs, m


def test_a_rank_computes_while_its_gradient_all_reduce_is_in_flight():
    """Data parallelism's all-reduces are posted asynchronously, as DDP overlaps them with
    the rest of the backward: on each rank some compute op starts after an all-reduce was
    posted and before it completed (a blocking all-reduce would end before the next op)."""
    g, inputs, m = _dp2_measured(overlap=True)
    for rank in (0, 1):
        events = [e for e in m.events if e.device == rank]
        reduces = [e for e in events if e.op.op_type == "RankCollective"]
        assert reduces and all(e.op.attributes["kind"] == "allreduce" for e in reduces)
        overlapped = [
            (r, c)
            for r in reduces
            for c in events
            if c.stream == "compute" and r.start_s < c.start_s < r.start_s + r.dur_s
        ]
        assert overlapped, f"rank {rank}: no compute op ran while an all-reduce was in flight"
    # and the values are still exact: the reference executor's on the global program
    for got, want in zip(_flat(m.outputs), _flat(ir.execute(g, inputs)), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_without_overlap_a_rank_waits_for_each_all_reduce_at_once():
    """overlap=False (what 2 ranks get on a 2-core machine): an all-reduce is waited for
    where it is posted, so no compute op of its rank runs while it is in flight; the
    values are the same."""
    g, inputs, m = _dp2_measured(overlap=False)
    for rank in (0, 1):
        events = [e for e in m.events if e.device == rank]
        for r in [e for e in events if e.op.op_type == "RankCollective"]:
            for c in events:
                if c.stream == "compute":
                    assert not r.start_s < c.start_s < r.start_s + r.dur_s - 1e-9
    for got, want in zip(_flat(m.outputs), _flat(ir.execute(g, inputs)), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


def test_overlap_by_default_follows_the_cores_and_refuses_non_booleans():
    from ir.backends.torch_ranked import _overlap
    from ir.calibration import comm_mode

    assert _overlap(None, "cpu", 2) == (comm_mode(2) == "channels")
    assert _overlap(None, "cuda", 2) is True
    assert _overlap(False, "cuda", 2) is False
    with pytest.raises(torch_dist.BackendError, match="overlap must be True, False or None"):
        _overlap("yes", "cpu", 2)
