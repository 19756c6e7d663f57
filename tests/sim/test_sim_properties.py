"""Properties over random small programs: monotone in bandwidth, streams never overlap,
deterministic traces."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st
from sim_programs import assert_streams_never_overlap

import ir
from ir import FunctionBuilder, TensorType

NUM_DEVICES = 4
SHAPE = (32, 32)

instruction = st.one_of(
    st.tuples(st.just("MatMul"), st.integers(0, 99), st.integers(0, 99)),
    st.tuples(st.just("Relu"), st.integers(0, 99), st.integers(0, 99)),
    st.tuples(st.just("Send"), st.integers(0, 99), st.integers(0, NUM_DEVICES - 1)),
    st.tuples(st.just("AllReduce"), st.integers(0, 99), st.integers(2, NUM_DEVICES)),
    st.tuples(st.just("Broadcast"), st.integers(0, 99), st.integers(2, NUM_DEVICES)),
)


def build(instructions: list[tuple[str, int, int]]) -> ir.Function:
    """A program of ``instructions`` over NUM_DEVICES devices (every value is 32 x 32)."""
    b = FunctionBuilder("random")
    pool = [b.input(f"x{d}", TensorType(SHAPE, device=d)) for d in range(NUM_DEVICES)]
    for name, i, j in instructions:
        x = pool[i % len(pool)]
        dev = x.type.device
        if name == "MatMul":
            same = [v for v in pool if v.type.device == dev]
            pool.append(b.call("MatMul", x, same[j % len(same)]))
        elif name == "Relu":
            pool.append(b.call("Relu", x))
        elif name == "Send":
            if j != dev:
                pool.append(b.call("Send", x, to_device=j))
        elif name == "AllReduce":
            latest = {}
            for v in pool:
                latest[v.type.device] = v
            group = [latest[d] for d in sorted(latest)][:j]
            summed = b.call("AllReduce", b.call("MakeTuple", *group))
            pool += [b.call("TupleGet", summed, index=k) for k in range(len(group))]
        else:
            devices = [(dev + k) % NUM_DEVICES for k in range(j)]
            copies = b.call("Broadcast", x, devices=devices)
            pool += [b.call("TupleGet", copies, index=k) for k in range(1, j)]
    return b.finish(pool[NUM_DEVICES:] or pool[:1])


def topology(bandwidths: list[float], latencies: list[float]) -> ir.Topology:
    n = NUM_DEVICES
    bw = tuple(tuple(0.0 if i == j else bandwidths[i * n + j] for j in range(n)) for i in range(n))
    lat = tuple(tuple(0.0 if i == j else latencies[i * n + j] for j in range(n)) for i in range(n))
    devices = tuple(ir.Device(i, peak_flops=1e11 * (1 + i)) for i in range(n))
    return ir.Topology(devices, bw, lat)


programs = st.lists(instruction, min_size=1, max_size=25)
link_bandwidths = st.lists(st.sampled_from([1e9, 3e9, 1e10, 5e10, 3e11]), min_size=16, max_size=16)
link_latencies = st.lists(st.sampled_from([0.0, 1e-6, 5e-6]), min_size=16, max_size=16)


@settings(max_examples=60, deadline=None)
@given(programs, link_bandwidths, link_latencies, st.integers(0, 15))
def test_doubling_a_link_bandwidth_never_increases_step_time(instrs, bws, lats, link):
    f = build(instrs)
    before = ir.simulate(f, topology(bws, lats))
    i, j = divmod(link, NUM_DEVICES)
    if i == j:
        j = (j + 1) % NUM_DEVICES
    faster = list(bws)
    faster[i * NUM_DEVICES + j] *= 2
    after = ir.simulate(f, topology(faster, lats))
    assert after.step_time_s <= before.step_time_s * (1 + 1e-12)
    assert_streams_never_overlap(before)
    assert_streams_never_overlap(after)


@settings(max_examples=30, deadline=None)
@given(programs, link_bandwidths, st.integers(0, NUM_DEVICES - 1))
def test_a_faster_device_never_increases_step_time(instrs, bws, device):
    f = build(instrs)
    base = topology(bws, [1e-6] * 16)
    devices = list(base.devices)
    devices[device] = replace(devices[device], peak_flops=2 * devices[device].peak_flops)
    quicker = replace(base, devices=tuple(devices))
    assert ir.simulate(f, quicker).step_time_s <= ir.simulate(f, base).step_time_s * (1 + 1e-12)


@settings(max_examples=20, deadline=None)
@given(programs, link_bandwidths)
def test_the_trace_is_deterministic(instrs, bws):
    f = build(instrs)
    topo = topology(bws, [2e-6] * 16)
    first, second = ir.simulate(f, topo), ir.simulate(f, topo)
    key = [(ev.op, ev.device, ev.stream, ev.start_s, ev.dur_s) for ev in first.events]
    assert key == [(ev.op, ev.device, ev.stream, ev.start_s, ev.dur_s) for ev in second.events]
    assert first.to_chrome_trace() == second.to_chrome_trace()
