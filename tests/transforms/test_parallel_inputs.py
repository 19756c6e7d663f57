"""Issue 25: a parallel transform given a program that is already distributed is a
TransformError saying so (before: ``horizontal_parallel(data_parallel(t, 2), 2)`` leaked
an AttributeError from deep inside, other pairs blamed a missing batch input), and the
transforms that do take distributed programs compute what their input computes."""

from __future__ import annotations

import numpy as np
import pytest

import ir
from ir import models
from ir import transforms as tfm
from ir.sharding import Mesh, propagate
from ir.transforms import TransformError

F64 = ir.DType.float64
FORWARD = models.mlp(8, 4, 6, 4, dtype=F64)
STEP = tfm.training(FORWARD)

DISTRIBUTED = {
    "data_parallel": lambda t: tfm.data_parallel(t, 2),
    "data_parallel (seeds' form)": lambda t: tfm.data_parallel(t, 2, inputs="distribute"),
    "horizontal_parallel": lambda t: tfm.horizontal_parallel(t, 2),
    "pipeline_parallel": lambda t: tfm.pipeline_parallel(t, 2, 2),
    "megatron": lambda t: tfm.megatron(t, dp=2, tp=2),
    "gradient_accumulation": lambda t: tfm.gradient_accumulation(t, 2, dp=2),
    "nested": lambda t: tfm.nested(t, ("dp", 2), ("hp", 2)),
    "parallelize": lambda t: tfm.parallelize(t, dp=2, pp=2, microbatches=2),
    "propagate": lambda t: propagate(t, {"x": (Mesh((2,)), ["S(0)"])})[0],
    "place": lambda t: tfm.place(t, {"x": 1}),
    "unroll_pmap": lambda t: tfm.unroll_pmap(tfm.data_parallel(t, 2, inputs="distribute")),
    # one device, but its inputs are tuples of per-device parts (found by fuzzing: an
    # AttributeError in horizontal_then_data)
    "unroll_pmap, one device": lambda t: tfm.unroll_pmap(tfm.data_parallel(t, 1)),
}

SEQUENTIAL_ONLY = {
    "data_parallel": lambda g: tfm.data_parallel(g, 2),
    "horizontal_parallel": lambda g: tfm.horizontal_parallel(g, 2),
    "pipeline_parallel": lambda g: tfm.pipeline_parallel(g, 2, 2),
    "megatron": lambda g: tfm.megatron(g, dp=2),
    "gradient_accumulation": lambda g: tfm.gradient_accumulation(g, 2),
    "nested": lambda g: tfm.nested(g, ("dp", 2)),
    "data_then_horizontal": lambda g: tfm.data_then_horizontal(g, 2),
    "horizontal_then_data": lambda g: tfm.horizontal_then_data(g, 2),
    "parallelize": lambda g: tfm.parallelize(g, dp=2),
}


@pytest.mark.parametrize("second", list(SEQUENTIAL_ONLY))
@pytest.mark.parametrize("first", list(DISTRIBUTED))
def test_a_parallel_transform_of_a_distributed_program_says_it_is_distributed(first, second):
    g = DISTRIBUTED[first](STEP)
    with pytest.raises(TransformError) as e:
        SEQUENTIAL_ONLY[second](g)
    message = str(e.value)
    assert message.startswith(f"{second} rewrites a sequential program")
    assert f"'{g.name}' is already distributed" in message
    assert "Apply" in message and "sequential program" in message


def test_the_issues_repro():
    """``T.horizontal_parallel(T.data_parallel(T.training(models.mlp(8,4,6,4)), 2), 2)``."""
    g = tfm.data_parallel(tfm.training(models.mlp(8, 4, 6, 4)), 2)
    with pytest.raises(TransformError, match="it has Pmap ops"):
        tfm.horizontal_parallel(g, 2)


def test_a_program_on_one_other_device_is_still_sequential():
    on_three = ir.parse(
        ir.format(FORWARD).replace("float64, 0]", "float64, 3]").replace("int64, 0]", "int64, 3]")
    )
    assert set(on_three.devices) == {3}
    g = tfm.data_parallel(on_three, 2)
    args = ir.random_inputs(on_three, 0)
    for got, want in zip(ir.execute_step(g, args, on_three), ir.execute(on_three, args)):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("first", ["data_parallel (seeds' form)", "pipeline_parallel", "place"])
@pytest.mark.parametrize(
    "second",
    ["recompute", "place", "unroll_pmap"],
)
def test_what_takes_a_distributed_program_computes_what_it_computes(first, second):
    """recompute, place and unroll_pmap accept distributed programs: proven by execution
    on the distributed program's own inputs."""
    g = DISTRIBUTED[first](STEP)
    h = {
        "recompute": lambda: tfm.recompute(g),
        "place": lambda: tfm.place(g, {g.inputs[0].name: 2}),
        "unroll_pmap": lambda: tfm.unroll_pmap(g),
    }[second]()
    args = ir.random_inputs(g, 0)
    for got, want in zip(ir.execute(h, args), ir.execute(g, args)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-9, atol=1e-12)
