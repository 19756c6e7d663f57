"""``megatron(..., overlap_grad_reduce=False)``: the gradients' data-parallel reductions
after the backward, on the compute stream, as Megatron-LM runs them by default. Proven by
executing the step and by where the simulator puts the reductions."""

from __future__ import annotations

import numpy as np
import pytest

import ir
from ir import models, transforms
from ir.transforms import megatron


def _adam_gpt(dtype: str = "float64", **sizes) -> ir.Function:
    shape = {"batch": 8, "seq": 16, "hidden": 32, "heads": 4, "vocab": 64, "layers": 2}
    shape.update(sizes)
    return transforms.training(models.gpt(**shape, dtype=dtype), "adam")


def _inputs(t: ir.Function) -> list:
    return [
        np.abs(x) if v.name.startswith("v_") else x  # second moments are non-negative
        for v, x in zip(t.inputs, ir.random_inputs(t, 0))
    ]


def _reductions(g: ir.Function) -> list[ir.Op]:
    return [op for op in g.ops if op.attributes.get("stream") == "compute"]


@pytest.mark.parametrize(("dp", "tp", "pp", "zero"), [(2, 1, 1, 0), (2, 2, 2, 0), (2, 1, 2, 1)])
def test_deferred_reductions_compute_the_same_step(dp: int, tp: int, pp: int, zero: int) -> None:
    t = _adam_gpt()
    g = megatron(t, dp, tp, pp, 4, zero=zero, overlap_grad_reduce=False)
    reductions = _reductions(g)
    kind = "ReduceScatter" if zero else "AllReduce"
    assert reductions and {op.op_type for op in reductions} == {kind}
    # one block after every task of the step: before it no op reads a reduced gradient,
    # after it only the optimizer steps and the outputs (no microbatch's work)
    at = [g.ops.index(op) for op in reductions]
    assert at == list(range(at[0], at[0] + len(at)))
    assert not any("_mb" in v.name for op in g.ops[at[-1] + 1 :] for v in op.outputs)
    assert len(reductions) == len({op.inputs[0] for op in reductions})
    xs = _inputs(t)
    want = ir.execute(t, xs)
    got = ir.collect(g, ir.execute(g, ir.distribute(g, xs, source=t)), rtol=1e-9)
    for v, w, o in zip(t.outputs, want, got):
        np.testing.assert_allclose(o, w, rtol=1e-7, atol=1e-10, err_msg=v.name)


def test_the_overlapped_step_marks_nothing_and_one_replica_has_nothing_to_defer() -> None:
    t = _adam_gpt()
    assert _reductions(megatron(t, 2, 1, 2, 4)) == []
    assert _reductions(megatron(t, 1, 2, 2, 4, overlap_grad_reduce=False)) == []


def test_reductions_after_the_backward_hold_the_compute_stream() -> None:
    """On a GPU-bound step the deferred reductions start once the device's backward is
    done, no compute runs while they do, and the step is longer by about their time."""
    t = _adam_gpt("float16", batch=16, seq=1024, hidden=2048, heads=16, vocab=8192, layers=2)
    topology = ir.Topology.preset("a100-hgx", 4)
    late = ir.simulate(megatron(t, 4, 1, 1, 2, overlap_grad_reduce=False), topology)
    early = ir.simulate(megatron(t, 4, 1, 1, 2), topology)
    compute = late.events_on(0, "compute")
    held = [e for e in late.events_on(0, "communication") if e.op.attributes.get("stream")]
    assert held
    backward_end = max(e.end_s for e in compute if "Adam" not in e.op.op_type)
    assert min(e.start_s for e in held) >= backward_end - 1e-12
    for e in held:  # the compute stream waits for each reduction
        assert not any(c.start_s < e.end_s - 1e-12 and c.end_s > e.start_s + 1e-12 for c in compute)
    reduce_s = sum(e.end_s - e.start_s for e in held)
    assert late.step_time_s >= early.step_time_s
    assert late.step_time_s == pytest.approx(early.step_time_s + reduce_s, rel=0.05)


def test_a_stream_that_is_neither_is_refused() -> None:
    with pytest.raises(ir.DistIRError, match="overlap_grad_reduce must be True or False"):
        megatron(_adam_gpt(), 2, overlap_grad_reduce="no")
    b = ir.FunctionBuilder("f")
    x = b.input("x", ir.TupleType((ir.TensorType((2,), "float32", 0),) * 2))
    with pytest.raises(ir.DistIRError, match="stream"):
        b.call("AllReduce", x, stream="nccl")
