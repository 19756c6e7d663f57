"""Communication channels: one FIFO per directed peer pair and per collective group
(``comm="channels"``), against one FIFO stream per device (``comm="serial"``)."""

from __future__ import annotations

import pytest

import ir
from ir import FunctionBuilder, TensorType
from ir.sim.clock import on_clock

LINKS = dict(
    peak_flops=1e12,
    mem_bandwidth_bytes_per_s=1e12,
    launch_overhead_s=0.0,
    link_bandwidth_bytes_per_s=1e9,
    link_latency_s=0.0,
)
SIZE_BYTES = 64 * 64 * 4
SEND_S = on_clock(SIZE_BYTES / 1e9)  # on the engine's clock (ir.sim.clock)


def _x(b: FunctionBuilder, name: str, device: int) -> ir.Value:
    return b.input(name, TensorType((64, 64), device=device))


def _starts(result: ir.SimResult, op_type: str) -> list[float]:
    seen: dict[ir.Op, float] = {}
    for ev in result.events:
        if ev.op.op_type == op_type:
            seen.setdefault(ev.op, ev.start_s)
    return list(seen.values())


def _late_send_then_ready_send(second_to: int) -> ir.Function:
    """Device 0 sends a value made by a long compute chain to 1, then a ready input to
    ``second_to``."""
    b = FunctionBuilder("hol")
    x, w, y = _x(b, "x", 0), _x(b, "w", 0), _x(b, "y", 0)
    h = x
    for i in range(8):
        h = b.call("MatMul", h, w, name=f"h{i}")
    late = b.call("Send", h, to_device=1, name="late")
    ready = b.call("Send", y, to_device=second_to, name="ready")
    return b.finish([late, ready])


def test_a_ready_send_to_another_peer_does_not_wait_behind_a_late_one():
    f = _late_send_then_ready_send(second_to=2)
    topology = ir.Topology.uniform(3, **LINKS)
    late_start = ir.simulate(f, topology).events[8].start_s
    channels = ir.simulate(f, topology)
    serial = ir.simulate(f, topology, comm="serial")
    assert _starts(channels, "Send") == [late_start, 0.0]
    assert _starts(serial, "Send") == [late_start, late_start + SEND_S]
    assert channels.step_time_s == pytest.approx(late_start + SEND_S)


def test_sends_on_one_peer_pair_and_direction_stay_in_program_order():
    f = _late_send_then_ready_send(second_to=1)
    result = ir.simulate(f, ir.Topology.uniform(2, **LINKS))
    late, ready = _starts(result, "Send")
    assert ready == pytest.approx(late + SEND_S)
    names = {ev.channel for ev in result.events if ev.stream == "communication"}
    assert names == {"send 0->1"}


def test_the_two_directions_of_a_link_are_separate_channels():
    b = FunctionBuilder("both_ways")
    x, w, y = _x(b, "x", 0), _x(b, "w", 0), _x(b, "y", 1)
    late = b.call("Send", b.call("MatMul", x, w, name="h"), to_device=1, name="late")
    back = b.call("Send", y, to_device=0, name="back")
    f, topology = b.finish([late, back]), ir.Topology.uniform(2, **LINKS)
    assert _starts(ir.simulate(f, topology), "Send")[1] == 0.0
    serial = ir.simulate(f, topology, comm="serial")
    assert _starts(serial, "Send")[1] > 0.0


def _two_groups(first: tuple[int, int], second: tuple[int, int]) -> ir.Function:
    """An all-reduce over ``first`` whose operands come late, then one over ``second`` whose
    operands are inputs."""
    b = FunctionBuilder("groups")
    w = _x(b, "w", first[0])
    late = [b.call("MatMul", _x(b, f"a{d}", d), w, name=f"m{d}") for d in first[:1]]
    late += [_x(b, f"a{d}", d) for d in first[1:]]
    r1 = b.call("AllReduce", b.call("MakeTuple", *late), name="tp")
    r2 = b.call("AllReduce", b.call("MakeTuple", *[_x(b, f"b{d}", d) for d in second]), name="dp")
    return b.finish([r1, r2])


def test_collectives_over_different_groups_overlap():
    f = _two_groups((0, 1), (0, 2))  # a tensor-parallel and a data-parallel group of device 0
    topology = ir.Topology.uniform(3, **LINKS)
    tp, dp = _starts(ir.simulate(f, topology), "AllReduce")
    assert tp > 0.0 and dp == 0.0
    tp_serial, dp_serial = _starts(ir.simulate(f, topology, comm="serial"), "AllReduce")
    assert tp_serial == tp and dp_serial > tp_serial


@pytest.mark.parametrize("second", [(0, 1), (1, 0)])
def test_collectives_over_one_group_stay_in_program_order(second):
    f = _two_groups((0, 1), second)
    result = ir.simulate(f, ir.Topology.uniform(2, **LINKS))
    tp, dp = _starts(result, "AllReduce")
    (event,) = [ev for ev in result.events if ev.op.op_type == "AllReduce" and ev.device == 0][:1]
    assert dp == pytest.approx(tp + event.dur_s)
    assert {ev.channel for ev in result.events if ev.stream == "communication"} == {"group 0,1"}


def test_communication_time_of_a_device_is_the_union_of_its_channels_busy_spans():
    f = _late_send_then_ready_send(second_to=2)
    topology = ir.Topology.uniform(3, **LINKS)
    assert ir.simulate(f, topology, comm="serial").communication_s[0] == pytest.approx(2 * SEND_S)
    overlapping = ir.simulate(f, topology)
    late_start = _starts(overlapping, "Send")[0]
    assert 0 < late_start < SEND_S  # the two sends overlap: counted once
    assert overlapping.communication_s[0] == pytest.approx(late_start + SEND_S)
    assert overlapping.communication_s[1] == pytest.approx(SEND_S)


def test_blocking_comm_holds_the_compute_of_its_participants():
    """comm="blocking": a transfer starts when its participants' compute is free and their
    compute waits for its end; with "channels" the same compute overlaps it."""
    f = ir.models.mlp(8, 16, 32, 4, layers=3, training=True, dtype=ir.DType.float32)
    g = ir.transforms.unroll_pmap(ir.transforms.megatron(f, 2, 1, 1, 1))
    topo = ir.Topology.uniform(
        2, peak_flops=1e9, link_bandwidth_bytes_per_s=1e6, link_latency_s=1e-4
    )
    overlapped = ir.simulate(g, topo)
    blocking = ir.simulate(g, topo, comm="blocking")
    for d in (0, 1):
        compute = blocking.events_on(d, "compute")
        transfers = [e for e in blocking.events if e.stream != "compute" and e.device == d]
        assert transfers
        for t in transfers:
            for c in compute:  # no compute op runs while a transfer of its device does
                assert c.end_s <= t.start_s + 1e-12 or c.start_s >= t.end_s - 1e-12
    # with channels some compute overlaps an all-reduce, so blocking is slower by at least
    # the overlapped compute, and never faster than the sum of one device's busy times
    some = [
        (c, t)
        for t in overlapped.events
        if t.stream != "compute" and t.device == 0
        for c in overlapped.events_on(0, "compute")
        if t.start_s < c.start_s < t.end_s
    ]
    assert some and blocking.step_time_s > overlapped.step_time_s
    busy = sum(e.dur_s for e in blocking.events if e.device == 0)
    assert blocking.step_time_s >= busy - 1e-12


@pytest.mark.parametrize("comm", ["blocking", "serial", "channels"])
def test_rank_classes_walk_a_3d_step_exactly_as_every_device_in_each_comm_mode(comm):
    """A blocking transfer holds the compute of mirrored members too (their compute moves
    only through transfers when their class's representative is walked): the class walk
    and the walk of every device agree event for event."""
    f = ir.models.mlp(8, 16, 32, 4, layers=4, training=True, dtype=ir.DType.float32)
    g = ir.transforms.megatron(f, 2, 2, 2, 2)
    assert g.rank_classes
    topo = ir.Topology.uniform(
        8, peak_flops=1e9, link_bandwidth_bytes_per_s=1e6, link_latency_s=1e-4
    )
    classes = ir.simulate(g, topo, comm=comm)
    every = ir.simulate(g, topo, comm=comm, symmetry=False)

    def events(result):
        return sorted((e.device, e.stream, e.start_s, e.dur_s, e.op.op_type) for e in result.events)

    assert classes.step_time_s == every.step_time_s
    assert events(classes) == events(every)
    assert classes.peak_memory_bytes == every.peak_memory_bytes
