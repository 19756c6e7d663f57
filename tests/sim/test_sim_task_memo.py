"""Repeated tasks timed from an earlier application (``ir.sim.tasks``): the engine's every
column, and so every figure, event and memory curve, equal to the last bit to walking
every application, with the steady state's microbatches not walked."""

from __future__ import annotations

import random
from itertools import pairwise

import pytest

import ir
from ir import models, transforms
from ir.sim.clock import EXACT_BELOW_S, TICKS_PER_S, on_clock
from ir.sim.engine import Engine
from ir.transforms import megatron

F64 = ir.DType.float64
GPT = models.gpt(batch=64, seq=8, hidden=16, heads=4, vocab=32, layers=4, dtype=F64)
MOE = models.gpt(64, 8, 16, 4, 32, 2, dtype=F64, experts=4, top_k=2, shared_experts=1)
CP = models.gpt(64, 16, 16, 4, 32, 2, dtype=F64)

# (model, dp, tp, pp, microbatches, keywords)
CASES = {
    "1f1b": (GPT, 2, 2, 2, 16, {}),
    "1f1b pp4": (GPT, 1, 2, 4, 16, {}),
    "gpipe": (GPT, 1, 2, 2, 16, {"schedule": "gpipe"}),
    "interleaved": (GPT, 1, 2, 2, 16, {"schedule": "interleaved", "chunks": 2}),
    "zero1 sp": (GPT, 2, 2, 2, 16, {"zero": 1, "sequence_parallel": True}),
    "zero2": (GPT, 2, 1, 2, 16, {"zero": 2}),
    "zero3": (GPT, 2, 1, 2, 16, {"zero": 3}),
    "recompute": (GPT, 1, 2, 2, 16, {"recompute": "full", "sequence_parallel": True}),
    "reduce after": (GPT, 2, 2, 2, 16, {"overlap_grad_reduce": False}),
    "experts": (MOE, 2, 1, 2, 16, {"ep": 2}),
    "context": (CP, 1, 1, 2, 16, {"cp": 2}),
}
# a GPU whose host issues kernels and syncs after transfers, a PCIe box, and CPU
# processes whose transfers hold their compute
PRESETS = {"a100-hgx": {}, "a100-pcie": {}, "cpu": {"comm": "blocking"}}

COLUMNS = (
    "inst_where",
    "inst_start",
    "inst_end",
    "inst_dur",
    "inst_cost",
    "use_count",
    "use_slots",
    "slot_ready",
    "slot_bytes",
    "slot_device",
    "slot_producer",
    "comm_instances",
    "comm_channels",
    "comm_groups",
    "app_unit",
    "app_base",
    "app_in_slots",
    "app_first",
    "app_segments",
    "compute_free",
    "host_free",
    "comm_free",
    "p2p_posted",
    "p2p_waited",
    "seg_base",  # a pmap run's registers too (ir.sim.engine)
    "seg_off",
    "host_base",
    "host_off",
    "top_start",
    "pinned",
)


def _engines(g: ir.Function, topology: ir.Topology, **kw) -> tuple[Engine, Engine]:
    walked = Engine(topology, classes=g.rank_classes, share_tasks=False, **kw)
    walked.run(g)
    replayed = Engine(topology, classes=g.rank_classes, **kw)
    replayed.run(g)
    return walked, replayed


def _same(walked: Engine, replayed: Engine) -> None:
    for name in COLUMNS:
        assert getattr(walked, name) == getattr(replayed, name), name
    assert [id(op) for op in walked.inst_op] == [id(op) for op in replayed.inst_op]
    a, b = ir.sim.SimResult(walked), ir.sim.SimResult(replayed)
    assert a.step_time_s == b.step_time_s
    assert a.peak_memory_bytes == b.peak_memory_bytes
    assert a.totals == b.totals
    events = [(e.op, e.device, e.start_s, e.dur_s, e.stream) for e in a.events]
    assert events == [(e.op, e.device, e.start_s, e.dur_s, e.stream) for e in b.events]


@pytest.fixture(scope="module", params=sorted(CASES))
def tasks_step(request):
    f, dp, tp, pp, m, kw = CASES[request.param]
    t = transforms.training(f, "adam")
    return request.param, megatron(t, dp, tp, pp, m, tasks=True, **kw)


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_replayed_tasks_are_the_walk_to_the_last_bit(tasks_step, preset) -> None:
    name, g = tasks_step
    walked, replayed = _engines(g, ir.Topology.preset(preset, 16), **PRESETS[preset])
    _same(walked, replayed)
    memo = replayed.task_memo
    applications = sum(op.op_type == "Task" for op in g.ops)
    assert memo.hits + memo.walked == applications
    if preset == "a100-hgx":  # the steady state is replayed: most microbatches not walked
        assert memo.hits >= applications // 2, (name, memo.hits, applications)


def test_the_steady_state_is_walked_once_per_phase() -> None:
    # 1F1B over 2 stages: each stage's forward and backward body is walked in warm-up and
    # cool-down and at the steady state's first microbatch; the rest are replays, so the
    # number walked does not grow with the microbatches
    t = transforms.training(GPT, "adam")
    topology = ir.Topology.preset("a100-hgx", 8)
    walked = {}
    for m in (8, 16, 32):
        g = megatron(t, 2, 2, 2, m, tasks=True)
        a, b = _engines(g, topology)
        _same(a, b)
        walked[m] = b.task_memo.walked
    assert walked[8] == walked[16] == walked[32], walked


def test_without_shared_tasks_every_application_is_walked() -> None:
    g = megatron(transforms.training(GPT, "adam"), 2, 2, 2, 16, tasks=True)
    engine = Engine(ir.Topology.preset("a100-hgx", 8), classes=g.rank_classes, share_bodies=False)
    engine.run(g)
    assert engine.task_memo is None
    # ir.simulate(symmetry=False), the reference, walks every op on every device
    a = ir.simulate(g, ir.Topology.preset("a100-hgx", 8), symmetry=False)
    b = ir.simulate(g, ir.Topology.preset("a100-hgx", 8))
    assert a.step_time_s == b.step_time_s and a.peak_memory_bytes == b.peak_memory_bytes


def test_past_the_exact_range_applications_are_walked_and_equal() -> None:
    # a device this slow puts the step far past EXACT_BELOW_S: nothing is replayed there
    f = models.mlp(64, 64, 64, 64, layers=4, dtype=F64)
    g = megatron(transforms.training(f), 1, 1, 2, 16, tasks=True)
    topology = ir.Topology.uniform(2, peak_flops=1e3, mem_bandwidth_bytes_per_s=1e4)
    walked, replayed = _engines(g, topology)
    _same(walked, replayed)
    assert ir.sim.SimResult(replayed).step_time_s > EXACT_BELOW_S
    assert replayed.task_memo.hits == 0


def test_the_clock_adds_whole_ticks_exactly() -> None:
    # what the memo rests on: below EXACT_BELOW_S a time plus a duration, shifted by any
    # delta, is the shifted time plus the duration, bit for bit
    rng = random.Random(7)
    for _ in range(2000):
        t, d, delta = (on_clock(rng.uniform(0, EXACT_BELOW_S / 4)) for _ in range(3))
        assert (t + delta) + d == (t + d) + delta
        assert ((t + d) - t) == d
    assert on_clock(1e-6) == pytest.approx(1e-6, rel=1e-7)
    assert on_clock(1e-6) * TICKS_PER_S == round(on_clock(1e-6) * TICKS_PER_S)
    assert on_clock(float("inf")) == float("inf")


def _irregular_feed(lengths: list[int]) -> ir.Function:
    """Device 0 makes each input by a chain of ``lengths[k]`` MatMuls and sends it to
    device 1, whose task (one body, applied per input) computes on it: device 1 waits
    for each input by a time that follows the lengths, not its own stream."""
    body = ir.FunctionBuilder("consume")
    x = body.input("x", ir.TensorType((64, 64), device=1))
    w = body.input("w", ir.TensorType((64, 64), device=1))
    body = body.finish([body.call("Relu", body.call("MatMul", x, w))])
    b = ir.FunctionBuilder("feed")
    h = b.input("h", ir.TensorType((64, 64), device=0))
    v = b.input("v", ir.TensorType((64, 64), device=0))
    w = b.input("w", ir.TensorType((64, 64), device=1))
    outs = []
    for k, n in enumerate(lengths):
        for _ in range(n):
            h = b.call("MatMul", h, v)
        sent = b.call("Send", h, to_device=1)
        outs += b.add_op("Task", [sent, w], subfunctions=[body], names=[f"y{k}"]).outputs
    return b.finish(outs)


def test_an_input_that_holds_its_stream_is_part_of_the_key() -> None:
    # the inputs arrive 2 or 4 MatMuls apart, device 1 idle in between: two phases that
    # alternate, each replayed from its own walk; were the inputs' times left out of the
    # key, every task would be replayed from the first (and start too early)
    topology = ir.Topology.uniform(
        2,
        peak_flops=1e9,
        mem_bandwidth_bytes_per_s=1e12,
        launch_overhead_s=0.0,
        link_bandwidth_bytes_per_s=1e9,
        link_latency_s=0.0,
    )
    g = _irregular_feed([2, 4] * 8)
    walked, replayed = _engines(g, topology)
    _same(walked, replayed)
    assert replayed.task_memo.hits >= 10
    starts = [e.start_s for e in ir.sim.SimResult(walked).events if e.op.op_type == "Relu"]
    gaps = {round(b - a, 12) for a, b in pairwise(starts)}
    assert len(gaps) == 2  # the two phases, alternating


def test_a_tuple_passed_as_a_class_slot_or_as_its_elements_keeps_its_positions() -> None:
    # a rank class's tuple is one slot (~s) in one application and a tuple of slots in
    # another: the slots then sit at other positions, so each form has its own plan
    import dataclasses

    t0, t1 = ir.TensorType((64, 64), F64, 0), ir.TensorType((64, 64), F64, 1)
    pair = ir.TupleType((t0, t1))
    body = ir.FunctionBuilder("body")
    x, y = body.input("x", pair), body.input("y", pair)
    first = body.call("TupleGet", x, index=0)
    body = body.finish([body.call("MatMul", first, body.call("TupleGet", y, index=0))])
    b = ir.FunctionBuilder("f")
    whole, other = b.input("whole", pair), b.input("other", pair)
    a = b.call("MakeTuple", b.input("a0", t0), b.input("a1", t1))
    c = b.call("MakeTuple", b.input("c0", t0), b.input("c1", t1))
    outs = []
    for operands in ([whole, a], [whole, a], [c, other], [c, other]):
        outs += b.add_op("Task", operands, subfunctions=[body]).outputs
    f = b.finish(outs)
    topology = ir.Topology.uniform(2)
    for g in (f, dataclasses.replace(f, rank_classes=((0, 1),))):
        _same(*_engines(g, topology))


def test_a_task_given_an_empty_tuple_is_timed() -> None:
    t0 = ir.TensorType((8, 8), F64, 0)
    body = ir.FunctionBuilder("body")
    x = body.input("x", t0)
    body.input("nothing", ir.TupleType(()))
    body = body.finish([body.call("Relu", x)])
    b = ir.FunctionBuilder("f")
    x, nothing = b.input("x", t0), b.input("nothing", ir.TupleType(()))
    outs = []
    for _ in range(3):
        outs += b.add_op("Task", [x, nothing], subfunctions=[body]).outputs
    walked, replayed = _engines(b.finish(outs), ir.Topology.uniform(1))
    _same(walked, replayed)
    assert replayed.task_memo.hits == 1
