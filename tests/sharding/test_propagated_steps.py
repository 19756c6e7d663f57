"""Propagation builds the steady-state step real training runs, written once for the mesh.

The step takes its state laid out on the mesh and returns the updated state in the same
layouts (so step N+1 takes step N's outputs as they are); an op every device runs alike is
one Pmap, consecutive ones fused, so the program does not grow with the mesh; and the
logical step computes and times exactly what its per-device (unrolled) form does.
"""

from __future__ import annotations

import numpy as np
import pytest

import ir
from ir import models, transforms
from ir.sharding import Mesh, R, S, fuse_pmaps, propagate

F64 = ir.DType.float64
TOPOLOGY = ir.Topology.preset("a100-hgx", 8)


def _gpt(training: bool = True) -> ir.Function:
    return models.gpt(batch=8, seq=8, hidden=16, heads=2, vocab=20, layers=2, training=training)


CASES = {
    "megatron mlp": (models.mlp(8, 4, 6, 4), {"wA": (Mesh((2,)), [S(1)])}),
    "dp adam mlp": (
        transforms.training(models.mlp(8, 4, 6, 4, layers=3), "adam"),
        {"x": (Mesh((4,)), [S(0)])},
    ),
    "uneven 2x2": (
        transforms.training(models.mlp(8, 4, 6, 4), "adam"),
        {"wA": (Mesh((2, 2)), [S(1), S(1)])},
    ),
    "gpt 2x4": (_gpt(), {"tokens": (Mesh((2, 4)), [S(0), S(1)])}),
    "gpt dp8": (_gpt(), {"tokens": (Mesh((8,)), [S(0)])}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_logical_step_times_exactly_as_its_per_device_form(case):
    f, annotations = CASES[case]
    g, _ = propagate(f, annotations, TOPOLOGY)
    explicit = ir.simulate(transforms.unroll_pmap(g), TOPOLOGY, symmetry=False)
    fused = fuse_pmaps(g)
    assert len(fused.ops) <= len(g.ops)
    for step in (g, fused):  # a pmap body walked once per rank class
        logical = ir.simulate(step, TOPOLOGY)
        assert logical.step_time_s == pytest.approx(explicit.step_time_s, rel=1e-12)
        assert logical.peak_memory_bytes == explicit.peak_memory_bytes
        assert logical.busy_s == pytest.approx(explicit.busy_s, rel=1e-12)
        xs = ir.random_inputs(f, 0)
        outs = ir.execute_step(step, xs, rtol=1e-5)
        for want, got in zip(ir.execute(f, xs), outs, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_a_symmetric_step_does_not_grow_with_the_mesh():
    # every dimension splits evenly over 8 (else the devices' pieces differ)
    f = models.gpt(batch=8, seq=8, hidden=16, heads=2, vocab=32, layers=2, training=True)
    sizes = {}
    for n in (2, 4, 8):
        g, _ = propagate(f, {"tokens": (Mesh((n,)), [S(0)])}, TOPOLOGY)
        assert g.rank_classes == (tuple(range(n)),)
        # outside pmap bodies only collectives and structure: no op written once per device
        assert all(op.device is None for op in g.ops)
        sizes[n] = len(g.ops)
    assert sizes[2] == sizes[4] == sizes[8]


def test_the_forward_pass_of_data_parallelism_is_one_pmap_and_times_as_the_transform():
    f = models.gpt(batch=16, seq=32, hidden=64, heads=4, vocab=100, layers=2)
    g, report = propagate(f, {"tokens": (Mesh((8,)), [S(0)])}, TOPOLOGY)
    assert report.collectives == [] and {op.op_type for op in g.ops} == {"Pmap"}
    assert [op.op_type for op in fuse_pmaps(g).ops] == ["Pmap"]
    # annotation and transform build the same step: the same simulated time
    dp = ir.simulate(transforms.parallelize(f, dp=8), TOPOLOGY)
    assert ir.simulate(g, TOPOLOGY).step_time_s == pytest.approx(dp.step_time_s, rel=1e-12)


@pytest.mark.parametrize(
    "annotations",
    [
        {"x": (Mesh((4,)), [S(0)])},  # data parallel: the optimizer may update shards
        {"wA": (Mesh((2,)), [S(1)])},  # Megatron's split
        {"x": (Mesh((2, 2)), [S(0), R]), "wA": (Mesh((2, 2)), [R, S(1)])},
    ],
)
def test_two_steps_in_a_row_take_the_first_steps_outputs_as_they_are(annotations):
    t = transforms.training(models.mlp(8, 4, 8, 4, layers=2, dtype=F64), "adam")
    g, _ = propagate(t, annotations)
    names = [v.name for v in t.inputs]
    carried = {}  # output position -> the input it is the next value of
    for op in t.ops:
        if op.op_type == "Adam":
            for out, state in zip(op.outputs, [op.inputs[0], *op.inputs[2:]]):
                carried[t.outputs.index(out)] = names.index(state.name)
    assert len(carried) == 6  # two weights, each with its two moments
    xs = ir.random_inputs(t, 3)
    first = ir.execute(t, xs)
    xs2 = list(xs)
    for out, into in carried.items():
        xs2[into] = first[out]
    second = ir.execute(t, xs2)

    step_in = ir.distribute(g, xs, source=t)
    out1 = ir.execute(g, step_in)
    step2 = list(step_in)
    for out, into in carried.items():
        assert g.output_layouts[out] == g.input_layouts[into]  # back where it came from
        step2[into] = out1[out]
    for want, got in zip(second, ir.collect(g, ir.execute(g, step2)), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


def test_the_seed_form_still_distributes_every_step():
    f = models.mlp(8, 4, 6, 4)
    g, _ = propagate(f, {"wA": (Mesh((2,)), [S(1)])}, inputs="distribute")
    kinds = {op.op_type for op in g.ops}
    assert {"Scatter", "Broadcast"} <= kinds and not g.input_layouts
    xs = ir.random_inputs(f, 1)
    for want, got in zip(ir.execute(f, xs), ir.execute(g, xs), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ir.DistIRError, match="inputs must be one of"):
        propagate(f, {"wA": (Mesh((2,)), [S(1)])}, inputs="scatter")
