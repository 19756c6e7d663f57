"""Scheduled pmap bodies (ir/sim/bodies.py) give what walking every op gives, to the last
bit: step time, every event, every memory curve, busy, idle and communication times, and
the op that runs out of memory. Random programs apply random bodies many times, their
inputs arriving late (after a transfer, behind other work) at any op of the body."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ir
from ir import DeviceVar, FunctionBuilder, TensorType, models, transforms
from ir.sim import SimResult
from ir.sim.engine import Engine

N = 4  # devices
E = DeviceVar("e")
SHAPES = ((32, 32), (32, 64), (64, 32))


def _run(f: ir.Function, topo: ir.Topology, share: bool, classes=()) -> SimResult:
    engine = Engine(topo, share_bodies=share, classes=classes)
    engine.run(f)
    return SimResult(engine)


def _events(result: SimResult) -> list[tuple]:
    return sorted(
        (e.device, e.stream, e.start_s, e.dur_s, e.flops, e.bytes, e.op.op_type, e.channel)
        for e in result.events
    )


def assert_same(shared: SimResult, walked: SimResult) -> None:
    """Every figure of the two results is equal (floats to the bit)."""
    assert shared.step_time_s == walked.step_time_s
    assert shared.devices == walked.devices
    assert shared.num_ops == walked.num_ops
    assert _events(shared) == _events(walked)
    for name in ("busy_s", "communication_s", "idle_s", "peak_memory_bytes", "oom"):
        assert getattr(shared, name) == getattr(walked, name), name
    a, b = shared.bars, walked.bars
    oa = np.lexsort((a.top, a.start_s, a.stream, a.device))
    ob = np.lexsort((b.top, b.start_s, b.stream, b.device))
    for column in ("device", "stream", "start_s", "dur_s", "flops", "bytes", "top"):
        np.testing.assert_array_equal(getattr(a, column)[oa], getattr(b, column)[ob])
    assert [a.ops[i] for i in oa] == [b.ops[i] for i in ob]
    for d in walked.devices:
        for x, y in zip(shared.memory_timeline(d), walked.memory_timeline(d)):
            np.testing.assert_array_equal(x, y)
        assert shared.events_on(d) == walked.events_on(d)


def _body(spec: list[tuple[int, int]], inputs: int, name: str) -> ir.Function:
    """A body of ``inputs`` (32, 32) inputs and ops ``spec``: (kind, operand) pairs, each
    op reading the latest value and operand ``operand`` (an input for an even operand,
    else an earlier value: an input is often first read deep in the body)."""
    b = FunctionBuilder(name)
    values = [b.input(f"x{i}", TensorType((32, 32), device=E)) for i in range(inputs)]
    latest = values[0]
    for kind, pick in spec:
        other = values[(pick // 2) % (inputs if pick % 2 == 0 else len(values))]
        if kind == 0:
            latest = b.call("MatMul", latest, other)
        elif kind == 1:
            latest = b.call("Add", latest, other)
        else:
            latest = b.call("Relu", other)
        values.append(latest)
    outs = [values[-1]] if len(values) == inputs + 1 else [values[-1], values[inputs]]
    return b.finish(outs)


body_spec = st.tuples(
    st.integers(1, 3),
    st.lists(st.tuples(st.integers(0, 2), st.integers(0, 50)), min_size=1, max_size=8),
)
instruction = st.one_of(
    st.tuples(st.just("pmap"), st.integers(0, 2), st.lists(st.integers(0, 99), max_size=3)),
    st.tuples(st.just("allreduce"), st.integers(0, 99), st.booleans()),
    st.tuples(st.just("late"), st.integers(0, 99), st.integers(0, N - 1)),
)


def build(bodies: list, instructions: list) -> ir.Function:
    """Pmaps of ``bodies`` (three, each applied many times) over a pool of values on all
    N devices, with all-reduces (whole or in pairs) and one device's element delayed (made
    on another device and sent) between them."""
    fns = [_body(spec, inputs, f"body{i}") for i, (inputs, spec) in enumerate(bodies)]
    b = FunctionBuilder("shared")
    row = ir.TupleType(tuple(TensorType((32, 32), device=d) for d in range(N)))
    pool = [b.input(f"v{i}", row) for i in range(3)]
    late: list[ir.Value] = []
    for name, i, extra in instructions:
        x = pool[i % len(pool)]
        if name == "pmap":
            body = fns[sum(extra) % len(fns)]
            operands = [pool[i % len(pool)]]  # then recent values or transfers' (late) ones
            for j in extra:
                recent = late if j % 2 and late else pool
                operands.append(recent[-1 - j % min(4, len(recent))])
            operands = (operands * 3)[: len(body.inputs)]
            out = b.call("Pmap", *operands, subfunctions=[body], device_var="e")
            pool += list(out) if isinstance(out, tuple) else [out]
        elif name == "allreduce":
            groups = [[0, 1], [2, 3]] if extra else [[0, 1, 2, 3]]
            pool.append(b.call("AllReduce", x, op="sum", groups=groups))
            late.append(pool[-1])
        else:  # one element made late: work on the next device, then sent back
            parts = [b.call("TupleGet", x, index=k) for k in range(N)]
            slow = parts[(extra + 1) % N]
            for _ in range(6):
                slow = b.call("MatMul", slow, slow)
            parts[extra] = b.call("Send", slow, to_device=extra)
            pool.append(b.call("MakeTuple", *parts))
            late.append(pool[-1])
    return b.finish(pool[3:] or pool[:1])


def _topology(memory_bytes: float, same: bool = False) -> ir.Topology:
    """N devices linked alike; with ``same`` False, odd devices twice as fast (two device
    models: each body has a timing per model)."""
    base = ir.Topology.uniform(
        N,
        peak_flops=1e11,
        link_bandwidth_bytes_per_s=2e9,
        link_latency_s=2e-5,
        memory_bytes=memory_bytes,
        launch_overhead_s=1e-6,
    )
    if same:
        return base
    devices = tuple(
        replace(d, peak_flops=d.peak_flops * (1 + i % 2)) for i, d in enumerate(base.devices)
    )
    return replace(base, devices=devices)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(body_spec, min_size=3, max_size=3),
    st.lists(instruction, min_size=1, max_size=30),
    st.sampled_from([1e9, 2e4, 6e4]),  # the small ones run out of memory
)
def test_scheduled_bodies_equal_the_walk(bodies, instructions, memory_bytes):
    f = build(bodies, instructions)
    topo = _topology(memory_bytes)
    assert_same(_run(f, topo, True), _run(f, topo, False))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(body_spec, min_size=3, max_size=3),
    st.lists(instruction, min_size=1, max_size=30),
    st.sampled_from(["a100-hgx", "h100-hgx"]),
)
def test_with_a_host_clock_scheduled_bodies_equal_the_walk(bodies, instructions, preset):
    """On a preset's kernel model the host issues every op (small kernels: the host often
    holds the stream, at any op of a body) and waits after each send."""
    f = build(bodies, instructions)
    topo = ir.Topology.preset(preset, N)
    assert not topo.ideal
    assert_same(_run(f, topo, True), _run(f, topo, False))


def test_an_input_arriving_mid_body_starts_a_segment_there():
    """A late input read by the body's third op: its applications on the late device
    have two segments, and the events are the walk's."""
    body = _body([(0, 0), (2, 0), (1, 2), (0, 0)], 2, "body")  # x1 first read by op 2
    b = FunctionBuilder("late_input")
    row = ir.TupleType(tuple(TensorType((32, 32), device=d) for d in range(N)))
    v0, v1 = b.input("v0", row), b.input("v1", row)
    parts = [b.call("TupleGet", v1, index=k) for k in range(N)]
    slow = parts[3]
    for _ in range(3):  # device 2's element comes late from work on device 3
        slow = b.call("MatMul", slow, slow)
    parts[2] = b.call("Send", slow, to_device=2)
    late = b.call("MakeTuple", *parts)
    y = b.call("Pmap", v0, late, subfunctions=[body], device_var="e")
    z = b.call("Pmap", y[0], late, subfunctions=[body], device_var="e")
    f = b.finish([*z])
    topo = _topology(1e9)
    engine = Engine(topo)
    engine.run(f)
    shared = SimResult(engine)
    assert [segments[1][0] for segments in engine.app_segments.values()] == [2]
    assert len(engine.inst_op) < shared.walked_ops
    assert_same(shared, _run(f, topo, False))


def test_classes_and_schedules_together_equal_every_op_on_every_device():
    bodies = [(2, [(0, 0), (1, 1)]), (1, [(2, 0)]), (3, [(0, 2), (0, 1)])]
    instructions = [("pmap", k % 3, [k, k + 1]) for k in range(12)] + [("allreduce", 5, True)]
    f = build(bodies, instructions)
    topo = _topology(1e9, same=True)
    classes = (tuple(range(N)),)
    shared = _run(f, topo, True, classes)
    assert shared.scheduled_units < _run(f, topo, False).scheduled_units
    assert_same(shared, _run(f, topo, False))


GPT = transforms.training(models.gpt(batch=16, seq=16, hidden=32, heads=4, vocab=64, layers=4))


@pytest.mark.parametrize(
    ("dp", "tp", "pp", "m", "schedule", "options"),
    [
        (2, 2, 2, 8, "1f1b", {}),
        (1, 2, 4, 4, "gpipe", {}),
        (2, 1, 2, 4, "interleaved", {"chunks": 2, "zero": 2}),
        (1, 4, 2, 4, "1f1b", {"sequence_parallel": True, "zero": 1}),
    ],
)
def test_a_3d_step_scheduled_once_per_body_equals_the_walk(dp, tp, pp, m, schedule, options):
    g = transforms.megatron(GPT, dp, tp, pp, m, schedule, **options)
    topo = ir.Topology.preset("a100-hgx", dp * tp * pp)
    shared = ir.simulate(g, topo)
    walked = ir.simulate(g, topo, symmetry=False)
    assert_same(shared, walked)
    assert shared.scheduled_units * 4 < walked.scheduled_units


def test_recomputation_and_a_small_device_name_the_same_op_out_of_memory():
    t = transforms.recompute(GPT, models.gpt_layer_activations(GPT))
    g = transforms.megatron(t, 1, 2, 2, 4)
    roomy = ir.simulate(g, ir.Topology.uniform(4, peak_flops=1e12))
    inputs = min(roomy.memory_timeline(d)[1][0] for d in roomy.devices)
    peak = max(roomy.peak_memory_bytes.values())
    # room for the inputs, not for the step's peak: an op's allocation overflows
    topo = ir.Topology.uniform(4, peak_flops=1e12, memory_bytes=(inputs + peak) / 2)
    shared, walked = ir.simulate(g, topo), ir.simulate(g, topo, symmetry=False)
    assert any(op is not None for op in walked.oom.values())
    assert_same(shared, walked)


@pytest.mark.parametrize(
    ("model", "dp", "tp", "pp", "m"),
    [
        (transforms.training(models.mlp(64, 128, 128, 64, layers=8)), 1, 1, 4, 8),
        (transforms.training(models.mlp(64, 128, 128, 64, layers=8)), 2, 2, 2, 4),
        (GPT, 1, 2, 4, 4),
    ],
)
def test_bodies_of_one_shape_share_a_schedule_and_equal_the_walk(model, dp, tp, pp, m):
    """Stages of equal layers run bodies alike (other ops and values, the same costs and
    wiring): they share one schedule's tables and timings, each keeping its own ops, so
    the events still name each stage's own ops, and every figure is the walk's."""
    g = transforms.megatron(model, dp, tp, pp, m)
    topo = ir.Topology.preset("a100-hgx", dp * tp * pp)
    shared = ir.simulate(g, topo)
    engine = shared._e
    bodies = {schedule.body for schedule in engine.app_schedule}
    assert len(set(engine.app_timing)) < len(bodies)
    for schedule in engine.app_schedule:
        scheduled = [op for op in schedule.body.ops if op.op_type != "PipelineStage"]
        assert schedule.ops == tuple(scheduled)
    assert_same(shared, ir.simulate(g, topo, symmetry=False))
