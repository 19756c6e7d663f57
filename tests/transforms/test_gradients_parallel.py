"""A gradients-only program (``T.gradients``: no optimizer) under data parallelism returns
each weight's gradient on every replica, all-reduced (summed) as DDP does, in both
``data_parallel`` and ``megatron``; executed equal to the sequential gradients (float64).

Each replica's loss divides by the global batch, so the sum of the replicas' gradients is
the sequential gradient: DDP's mean of per-replica means over equal shards.
"""

from __future__ import annotations

import numpy as np
import pytest

import ir
from ir import models
from ir import transforms as T  # noqa: N812

F64 = ir.DType.float64
MODELS = {
    "mlp": models.mlp(8, 4, 6, 3, layers=3, dtype=F64),
    "gpt": models.gpt(8, 4, 8, 2, 16, 2, dtype=F64),
}


def _gradient_outputs(g: ir.Function) -> list[int]:
    return [i for i, v in enumerate(g.outputs) if v.name.startswith("d")]


def _execute(g: ir.Function, step: ir.Function) -> tuple[list, list]:
    xs = ir.random_inputs(g, 0)
    return ir.execute(g, xs), ir.execute(step, ir.distribute(step, xs, source=g))


@pytest.mark.parametrize("name", MODELS)
def test_data_parallel_all_reduces_the_gradients_onto_every_replica(name) -> None:
    g = T.gradients(MODELS[name])
    step = T.data_parallel(g, 2)
    grads = _gradient_outputs(g)
    assert grads
    want, out = _execute(g, step)
    for i in grads:
        assert step.output_layouts[i] == ("R",)
        replicas = out[i]
        assert len(replicas) == 2  # the full gradient on each replica
        for replica in replicas:
            np.testing.assert_allclose(replica, want[i], rtol=1e-9, atol=1e-12)
    reduced = {op.outputs[0].name for op in step.ops if op.op_type == "Reduce"}
    assert reduced == {"l"}  # only the loss goes to one device
    assert sum(op.op_type == "AllReduce" for op in step.ops) == len(grads)
    got = ir.collect(step, out)
    for w, o in zip(want, got, strict=True):
        np.testing.assert_allclose(o, w, rtol=1e-9, atol=1e-12)
    # the all-reduces cost time: the step communicates
    result = ir.simulate(step, ir.Topology.preset("a100-hgx", 2))
    assert any(e.kind != "compute" and e.op.op_type == "AllReduce" for e in result.events)


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize(
    ("dp", "tp", "pp", "m", "zero"),
    [(2, 1, 1, 1, 0), (2, 2, 1, 2, 0), (2, 1, 2, 2, 0), (4, 1, 1, 2, 1)],
)
def test_megatron_all_reduces_the_gradients_among_the_replicas(name, dp, tp, pp, m, zero) -> None:
    g = T.gradients(MODELS[name])
    step = T.megatron(g, dp, tp, pp, m, zero=zero)
    grads = _gradient_outputs(g)
    for i in grads:
        assert step.output_layouts[i][0] == f"R@{dp}"
    groups = [
        op.attributes["groups"]
        for op in step.ops
        if op.op_type == "AllReduce" and len(op.attributes["groups"][0]) == dp
    ]
    assert len(groups) >= len(grads)  # one all-reduce per gradient (more with tp peers)
    want, out = _execute(g, step)
    got = ir.collect(step, out, rtol=1e-12)  # replicas must agree: each holds the sum
    for v, w, o in zip(g.outputs, want, got, strict=True):
        np.testing.assert_allclose(o, w, rtol=1e-9, atol=1e-12, err_msg=v.name)


def test_horizontal_parallel_returns_whole_gradients_too() -> None:
    g = T.gradients(MODELS["mlp"])
    step = T.horizontal_parallel(g, 2)
    want, out = _execute(g, step)
    for v, w, o in zip(g.outputs, want, ir.collect(step, out), strict=True):
        np.testing.assert_allclose(o, w, rtol=1e-9, atol=1e-12, err_msg=v.name)
