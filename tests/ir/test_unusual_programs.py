"""Issue 25: programs and arguments the fuzzers never built, each a located project error
or a working answer: a collective over a tuple with two parts on one device, random
inputs of a huge or zero-sized tensor, a model of an integer dtype, Concat / Split /
Scatter of a scalar, a mesh of negative device ids."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import ir
from ir import models
from ir.errors import ArgumentError
from ir.sharding import Mesh, ShardingSpec, propagate


def _tuple(devices, shape="(12,)") -> str:
    return "Tuple[" + ", ".join(f"Tensor[{shape}, {d}]" for d in devices) + "]"


COLLECTIVES = [
    "AllReduce(x)",
    "AllGather(x, dim=0)",
    "ReduceScatter(x, dim=0)",
    "AllToAll(x, split_dim=0, concat_dim=0)",
]


@pytest.mark.parametrize("devices", [(0, 0, 1), (0, 1, 1), (2, 2, 1, 1), (0, 0)])
@pytest.mark.parametrize("call", COLLECTIVES)
def test_a_collective_with_two_parts_on_one_device_simulates_and_runs(devices, call):
    """Before: ZeroDivisionError in the ring search (a topology's own diagonal is 0)."""
    f = ir.parse(f"def f(x: {_tuple(devices)}):\n    y = {call}\n    return y")
    topologies = [
        ir.Topology.uniform(3),
        ir.Topology.preset("a100-hgx", 3),
        ir.Topology.preset("cpu", 3),
    ]
    for topology, comm, symmetry in itertools.product(
        topologies, ["channels", "serial"], [True, False]
    ):
        result = ir.simulate(f, topology, comm=comm, symmetry=symmetry)
        assert 0 <= result.step_time_s < float("inf")
    ir.execute(f, ir.random_inputs(f))


def test_the_issues_all_reduce_repro_costs_a_ring_whose_shared_device_moves_nothing():
    """A ring over positions (0, 0, 2): the step between the two parts on device 0 is
    free, the others cross the one link: 2 (n - 1) / n of the bytes and 2 (n - 1)
    latencies for n = 3, on links that differ (so the ring order is searched, where the
    topology's own diagonal, 0, was divided by)."""
    from ir.collectives import collective_time_s
    from ir.device import Device, Topology

    n = 3
    bandwidth = [[0.0 if i == j else 1e10 * (1 + i + j) for j in range(n)] for i in range(n)]
    latency = [[0.0 if i == j else 1e-6 * (1 + i * j) for j in range(n)] for i in range(n)]
    topology = Topology(tuple(Device(i) for i in range(n)), bandwidth, latency, name="links")
    f = ir.parse(f"def f(x: {_tuple((0, 0, 2))}):\n    y = AllReduce(x)\n    return y")
    assert ir.simulate(f, topology, symmetry=True).step_time_s > 0
    size_bytes = 48.0
    want = 2 * 2 / 3 * size_bytes / bandwidth[0][2] + 2 * 2 * latency[0][2]
    assert collective_time_s("allreduce", size_bytes, [0, 0, 2], topology) == pytest.approx(want)


@pytest.mark.parametrize(
    "shape", ["(9223372036854775807, 0)", "(0, 9223372036854775807)", "(4294967296, 4294967296, 0)"]
)
@pytest.mark.parametrize("dtype", ["float32", "int64", "bool"])
def test_random_inputs_of_a_zero_sized_tensor_numpy_cannot_hold_is_an_argument_error(shape, dtype):
    f = ir.parse(f"def f(x: Tensor[{shape}, {dtype}, 0]):\n    return x")
    with pytest.raises(ArgumentError, match=r"input 'x' of 'f' .* cannot be made as numpy"):
        ir.random_inputs(f)


def test_random_inputs_of_a_tensor_this_machine_cannot_hold_is_an_argument_error():
    f = ir.parse("def f(x: Tensor[(16777216, 16777216), 0]):\n    return x")
    with pytest.raises(ArgumentError, match=r"max_bytes"):
        ir.random_inputs(f)
    with pytest.raises(ArgumentError, match=r"input 'x' .* MemoryError"):
        ir.random_inputs(f, max_bytes=2**62)  # 1 PiB allowed, not there to allocate


def test_random_inputs_of_zero_sized_tensors_that_fit_work():
    f = ir.parse("def f(x: Tensor[(0, 4), 0], z: Tensor[(0,), int64, 0]):\n    return x, z")
    x, z = ir.random_inputs(f)
    assert x.shape == (0, 4) and z.shape == (0,) and z.dtype == np.int64


@pytest.mark.parametrize("dtype", ["int8", "int64", "bool", None, 5, "Float32"])
@pytest.mark.parametrize("model", ["mlp", "gpt"])
def test_a_model_of_a_dtype_it_cannot_train_is_a_model_error(model, dtype):
    build = {
        "mlp": lambda: models.mlp(8, 4, 6, 4, dtype=dtype),
        "gpt": lambda: models.gpt(2, 4, 8, 1, 16, 1, dtype=dtype),
    }[model]
    with pytest.raises(models.ModelError, match=r"dtype must be .*float64, float32, float16"):
        build()


@pytest.mark.parametrize(
    "call", ["Concat(x, dim=0)", "Split(x, partitions=2)", "Scatter(x, devices=[0, 1])"]
)
def test_an_op_that_cuts_an_axis_of_a_scalar_names_the_op_and_the_axis(call):
    """Before: a ParseError whose message was an internal IndexError."""
    text = f"def f(x: Tensor[(), 0]):\n    y = {call}\n    return y"
    with pytest.raises(ir.ParseError) as e:
        ir.parse(text)
    message = str(e.value)
    assert "dim 0 is out of range for a rank-0 tensor (a scalar has no axes)" in message
    assert "IndexError" not in message and e.value.line == 2


@pytest.mark.parametrize("devices", [[-1, -2], [0, -1], [65536, 0]])
def test_a_mesh_of_devices_that_are_not_ids_is_a_mesh_error(devices):
    """Before: propagate said 'a topology needs at least one device, got 0'."""
    with pytest.raises(ir.DistIRError, match=r"mesh devices must be device ids, integers from 0"):
        propagate(models.mlp(8, 4, 6, 4), {"x": (Mesh((2,), devices), ["S(0)"])})


def test_a_spec_reaching_a_negative_device_is_an_annotation_error():
    with pytest.raises(ir.DistIRError, match="reach device -1, but a device id is"):
        ShardingSpec([-1, -2], [(0, 2)])
    groups = ShardingSpec([-1, -2], [(0, 2)], {-1: [0, 1], -2: [2, 3]})  # seed 001's groups
    assert groups.physical_devices == (0, 1, 2, 3)


def test_random_labels_split_into_microbatches_stay_below_the_class_count():
    """Found by fuzzing transforms of transformed programs: labels reaching the loss
    through a Split (microbatches) were drawn in [0, 4) whatever the class count, and the
    program then failed to run on its own random inputs."""
    t = ir.transforms.training(models.mlp(8, 4, 6, 3))
    g = ir.transforms.pipeline_parallel(t, 1, 2)  # one stage, two microbatches
    assert "Split" in {op.op_type for op in g.ops}
    for seed in range(5):
        args = ir.random_inputs(g, seed)
        z = args[[v.name for v in g.inputs].index("z")]
        assert z.min() >= 0 and z.max() < 3
        ir.execute(g, args)
