"""Data parallelism by annotation builds the training step DDP and Megatron run.

With the weights and optimizer state resident and replicated, each gradient is
all-reduced where the backward makes it and every device updates the whole weights
(``megatron(dp=n)``'s step, timed identically); with the state annotated sharded the
update runs on shards (ZeRO); and where the simulator finds a sharded update faster
(slow compute, fast links) propagation picks it, because it costs the choice as the
step runs it.
"""

from __future__ import annotations

import numpy as np
import pytest

import ir
from ir import models, transforms
from ir.sharding import Mesh, S, propagate

A100 = ir.Topology.preset("a100-hgx", 8)
# compute 1000x slower than an A100, links 3x faster than its NVLink
SLOW_COMPUTE = ir.Topology.uniform(
    4,
    peak_flops=1e10,
    mem_bandwidth_bytes_per_s=1e9,
    link_bandwidth_bytes_per_s=1e12,
    link_latency_s=1e-7,
)


def _gpt_step(optimizer: str, layers: int = 2) -> ir.Function:
    f = models.gpt(batch=8, seq=8, hidden=16, heads=2, vocab=24, layers=layers)
    return transforms.training(f, optimizer)


def _weights(t: ir.Function) -> list[str]:
    """The names of the weights the step updates (operand 0 of each optimizer op)."""
    return [op.inputs[0].name for op in t.ops if op.op_type in ("SGDOptimizer", "Adam")]


def _assert_executes_as_the_sequential_step(t: ir.Function, g: ir.Function) -> None:
    xs = ir.random_inputs(t, 0)
    for want, got in zip(ir.execute(t, xs), ir.execute_step(g, xs, rtol=1e-5), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("n", [2, 4, 8])
def test_replicated_state_gives_the_all_reduce_step_of_megatron(optimizer, n):
    t = _gpt_step(optimizer, layers=4)
    g, report = propagate(t, {"tokens": (Mesh((n,)), [S(0)])}, A100)
    weights = _weights(t)
    # one all-reduce per gradient, nothing else: no reduce-scatter, no all-gather of weights
    assert sorted((c.kind, c.value) for c in report.collectives) == sorted(
        ("allreduce", f"d{w}") for w in weights
    )
    assert not {"AllGather", "ReduceScatter", "KeepShard"} & {op.op_type for op in g.ops}
    state = [x.name for x in t.inputs if x.name not in ("tokens", "labels")]
    names = [x.name for x in t.inputs]
    assert all(g.input_layouts[names.index(x)] == ("R",) for x in state)
    # the step megatron(dp=n) builds: the same simulated time
    megatron = ir.simulate(transforms.megatron(t, dp=n), A100).step_time_s
    assert ir.simulate(g, A100).step_time_s == pytest.approx(megatron, rel=1e-9)
    _assert_executes_as_the_sequential_step(t, g)


def test_each_gradient_is_all_reduced_where_the_backward_makes_it():
    t = _gpt_step("adam")
    g, _ = propagate(t, {"tokens": (Mesh((4,)), [S(0)])}, A100)
    made = {}  # value -> index of the op that makes it
    for i, op in enumerate(g.ops):
        made.update({v: i for v in op.outputs})
    first_update = min(
        i
        for i, op in enumerate(g.ops)
        if op.op_type == "Pmap" and any(o.op_type == "Adam" for o in op.subfunctions[0].ops)
    )
    reductions = [i for i, op in enumerate(g.ops) if op.op_type == "AllReduce"]
    assert len(reductions) == len(_weights(t))
    for i in reductions:
        maker = made[g.ops[i].inputs[0]]
        # right after the op that makes the gradient (or the reductions emitted with it)
        assert all(g.ops[k].op_type == "AllReduce" for k in range(maker + 1, i)), g.ops[i]
        assert i < first_update  # long before the optimizer runs


@pytest.mark.parametrize("weights_too", [False, True], ids=["zero-1", "zero-3"])
def test_state_annotated_sharded_keeps_the_sharded_update(weights_too):
    # ZeRO-1: the Adam moments sharded, the weights replicated; "ZeRO-3": the weights
    # sharded too (gathered for the forward and backward)
    t = transforms.training(models.mlp(8, 4, 8, 4, layers=2), "adam")
    mesh = Mesh((4,))
    weights = _weights(t)
    state = [name for w in weights for name in ([w] if weights_too else []) + [f"m_{w}", f"v_{w}"]]
    g, report = propagate(t, {"x": (mesh, [S(0)]), **{x: (mesh, [S(0)]) for x in state}}, A100)
    # each gradient reduce-scattered to the shard its state lives on
    kinds = {(c.kind, c.value) for c in report.collectives}
    assert {("reducescatter", f"d{w}") for w in weights} <= kinds
    assert not any(kind == "allreduce" for kind, _ in kinds)
    assert [how for op, how in report.op_strategies if op.op_type == "Adam"] == [
        "axis 0: split f0"
    ] * len(weights)
    # what comes back gathered: the new weights if they came in replicated, else nothing
    gathered = {value for kind, value in kinds if kind == "allgather" and value.endswith("1")}
    assert gathered == (set() if weights_too else {f"{w}1" for w in weights})
    outs = {v.name: i for i, v in enumerate(t.outputs)}
    for x in state:  # the updated state stays sharded where it came from
        assert g.output_layouts[outs[f"{x}1"]] == ("S(0)",)
    _assert_executes_as_the_sequential_step(t, g)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_the_choice_follows_the_simulated_cost_where_sharded_updates_are_faster(optimizer):
    # On slow compute and fast links, 1/n of the update and an all-gather beat the whole
    # update on every device: propagation shards the larger weights' updates, and its
    # step is faster than megatron's all-reduce step.
    t = _gpt_step(optimizer)
    g, report = propagate(t, {"tokens": (Mesh((4,)), [S(0)])}, SLOW_COMPUTE)
    kinds = {c.kind for c in report.collectives}
    assert {"reducescatter", "allgather"} <= kinds
    scattered = {c.value for c in report.collectives if c.kind == "reducescatter"}
    assert "dh0_mlp_w1" in scattered and "dw_head" in scattered
    step_s = ir.simulate(g, SLOW_COMPUTE).step_time_s
    ddp_s = ir.simulate(transforms.megatron(t, dp=4), SLOW_COMPUTE).step_time_s
    assert step_s < 0.95 * ddp_s
    _assert_executes_as_the_sequential_step(t, g)
