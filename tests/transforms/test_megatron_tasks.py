"""``T.megatron(tasks=True)``: each repeated task one ``Task`` op, proven the same program
by executing it against the sequential step and the flat step, by simulating both (equal
to the last bit) and by writing it out flat (``inline_tasks``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import ir
from ir import models, transforms
from ir.sim.traffic import traffic_bytes
from ir.transforms import inline_tasks, megatron, unroll_pmap

F64 = ir.DType.float64
GPT = models.gpt(batch=8, seq=8, hidden=16, heads=4, vocab=32, layers=4, dtype=F64)
MOE = models.gpt(8, 8, 16, 4, 32, 2, dtype=F64, experts=4, top_k=2, shared_experts=1)
CP = models.gpt(8, 16, 16, 4, 32, 2, dtype=F64)

# (model, dp, tp, pp, microbatches, keywords): every schedule, ZeRO stage, sequence
# parallelism, recomputation, reductions after the backward, experts and context
CASES = {
    "1f1b": (GPT, 2, 2, 2, 4, {}),
    "gpipe": (GPT, 1, 2, 2, 4, {"schedule": "gpipe"}),
    "interleaved": (GPT, 1, 2, 2, 4, {"schedule": "interleaved", "chunks": 2}),
    "zero1 sp": (GPT, 2, 2, 2, 4, {"zero": 1, "sequence_parallel": True}),
    "zero2": (GPT, 2, 1, 2, 4, {"zero": 2}),
    "zero3": (GPT, 2, 1, 2, 4, {"zero": 3}),
    "recompute sp": (GPT, 1, 2, 2, 4, {"recompute": "full", "sequence_parallel": True}),
    "reduce after": (GPT, 2, 2, 2, 4, {"overlap_grad_reduce": False}),
    "one stage": (GPT, 2, 2, 1, 4, {}),
    "experts": (MOE, 2, 1, 2, 4, {"ep": 2}),
    "context": (CP, 1, 1, 2, 4, {"cp": 2}),
}


def _inputs(t: ir.Function, seed: int = 0) -> list:
    # Adam's second moments are non-negative (random ones would make NaN updates)
    return [
        np.abs(x) if v.name.startswith("v_") else x
        for v, x in zip(t.inputs, ir.random_inputs(t, seed))
    ]


@pytest.fixture(scope="module", params=sorted(CASES))
def steps(request):
    f, dp, tp, pp, m, kw = CASES[request.param]
    t = transforms.training(f, "adam")
    return t, megatron(t, dp, tp, pp, m, **kw), megatron(t, dp, tp, pp, m, tasks=True, **kw)


def test_the_tasks_step_computes_what_the_flat_and_the_sequential_steps_do(steps) -> None:
    t, flat, tasks = steps
    assert sum(op.op_type == "Task" for op in tasks.ops) > 0
    assert len(tasks.ops) < len(flat.ops)
    xs = _inputs(t)
    want = ir.execute(t, xs)
    laid = ir.distribute(tasks, xs, source=t)
    got_tasks = ir.execute(tasks, laid)
    got_flat = ir.execute(flat, ir.distribute(flat, xs, source=t))
    for a, b in zip(got_tasks, got_flat):  # the same ops on the same values: bit for bit
        if isinstance(a, tuple):
            for x, y in zip(a, b):
                np.testing.assert_array_equal(x, y)
        else:
            np.testing.assert_array_equal(a, b)
    got = ir.collect(tasks, got_tasks, rtol=1e-9)
    for v, w, o in zip(t.outputs, want, got):
        np.testing.assert_allclose(o, w, rtol=1e-7, atol=1e-10, err_msg=v.name)


def test_the_tasks_step_written_out_is_the_flat_step(steps) -> None:
    _, flat, tasks = steps
    out = inline_tasks(tasks)
    assert not any(op.op_type == "Task" for op in out.ops)
    assert out.is_equivalent(flat)
    assert out.rank_classes == flat.rank_classes
    assert (out.input_layouts, out.output_layouts) == (flat.input_layouts, flat.output_layouts)
    # the per-rank form a backend runs, and the transfers counted, are the flat step's
    assert unroll_pmap(tasks).is_equivalent(unroll_pmap(flat))
    assert traffic_bytes(tasks) == traffic_bytes(flat)


def test_the_tasks_step_simulates_as_the_flat_step_to_the_last_bit(steps) -> None:
    _, flat, tasks = steps
    topology = ir.Topology.preset("a100-hgx", 16)
    a, b = ir.simulate(flat, topology), ir.simulate(tasks, topology)
    assert a.step_time_s == b.step_time_s
    assert a.peak_memory_bytes == b.peak_memory_bytes
    assert a.busy_s == b.busy_s and a.communication_s == b.communication_s
    assert a.totals == b.totals
    # without rank classes and shared bodies (every op on every device walked), too
    c = ir.simulate(tasks, topology, symmetry=False)
    assert c.step_time_s == a.step_time_s
    events = [(e.op.op_type, e.device, e.start_s, e.dur_s) for e in a.events]
    assert events == [(e.op.op_type, e.device, e.start_s, e.dur_s) for e in b.events]


def test_a_task_prints_and_parses_back() -> None:
    t = transforms.training(GPT, "adam")
    g = megatron(t, 1, 2, 2, 4, tasks=True)
    text = str(g)
    assert "= task(" in text
    back = ir.parse(text)
    assert back.is_equivalent(g)


def test_nested_tasks_run_and_simulate_as_their_bodies() -> None:
    """A task whose body holds a task and a pmap, applied twice: executed, simulated and
    written out it is the program of its ops in its place."""
    d = ir.DeviceVar("d")
    local = ir.FunctionBuilder("local")
    y = local.input("y", ir.TensorType((4, 4), F64, d))
    local = local.finish([local.call("Relu", local.call("MatMul", y, y))])
    inner = ir.FunctionBuilder("inner")
    xs = inner.input("xs", ir.TupleType(tuple(ir.TensorType((4, 4), F64, k) for k in (0, 1))))
    (ys,) = inner.add_op("Pmap", [xs], {"device_var": "d"}, subfunctions=[local]).outputs
    inner = inner.finish([inner.call("AllReduce", ys)])
    outer = ir.FunctionBuilder("outer")
    zs = outer.input("zs", xs.type)
    (once,) = outer.add_op("Task", [zs], subfunctions=[inner]).outputs
    outer = outer.finish([outer.call("AllGather", once, dim=0), once])
    b = ir.FunctionBuilder("f")
    x = b.input("x", xs.type)
    first = b.add_op("Task", [x], subfunctions=[outer], names=["a", "b"]).outputs
    second = b.add_op("Task", [first[1]], subfunctions=[outer], names=["c", "d"]).outputs
    f = b.finish([first[0], second[0], second[1]])
    flat = inline_tasks(f)
    assert [op.op_type for op in flat.ops].count("Task") == 0
    assert len(flat.ops) == 2 * 3
    xs_in = ir.random_inputs(f, 1)
    for u, v in zip(ir.execute(f, xs_in), ir.execute(flat, xs_in)):
        for p, q in zip(u, v):
            np.testing.assert_array_equal(p, q)
    topology = ir.Topology.preset("a100-hgx", 2)
    r, s = ir.simulate(f, topology), ir.simulate(flat, topology)
    assert r.step_time_s == s.step_time_s > 0
    assert r.peak_memory_bytes == s.peak_memory_bytes


def test_a_task_given_operands_its_body_does_not_take_is_refused() -> None:
    body = ir.FunctionBuilder("body")
    x = body.input("x", ir.TensorType((2, 3), F64, 0))
    body = body.finish([body.call("Relu", x)])
    b = ir.FunctionBuilder("f")
    wrong = b.input("w", ir.TensorType((3, 2), F64, 0))
    with pytest.raises(ir.VerifyError, match=r"task operand 0 is .* but the body's input 'x'"):
        b.add_op("Task", [wrong], subfunctions=[body])
    with pytest.raises(ir.VerifyError, match="the body takes 1 inputs but the task is given 2"):
        b.add_op("Task", [wrong, wrong], subfunctions=[body])


def test_a_task_of_no_operands_prints_and_parses_back() -> None:
    body = ir.FunctionBuilder("zeros")
    body = body.finish([body.call("Constant", shape=[2, 3], value=0.0, device=0)])
    b = ir.FunctionBuilder("f")
    (z,) = b.add_op("Task", [], subfunctions=[body], names=["z"]).outputs
    f = b.finish([b.call("Relu", z)])
    text = str(f)
    assert "fn=lambda (): {" in text
    assert ir.parse(text).is_equivalent(f)


def test_tasks_without_a_pmap_lower_to_ranks_as_their_ops() -> None:
    """A program of tasks (no top-level pmap) splits into the per-rank programs its
    tasks written out do."""
    from ir.sharding.lower import lower_to_ranks

    text = (Path(__file__).parent / "task_program.txt").read_text()
    f = ir.parse(text)
    assert [op.op_type for op in f.ops] == ["Task", "Task"]
    got, want = lower_to_ranks(f), lower_to_ranks(inline_tasks(f))
    assert got.ranks == want.ranks
    for rank in got.ranks:
        assert got.programs[rank].is_equivalent(want.programs[rank])
