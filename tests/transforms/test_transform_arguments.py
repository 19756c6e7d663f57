"""Wrong arguments to the public transforms are project errors naming the parameter.

Each class below was found by fuzzing the transforms (``benchmarks/fuzz.py``, target
*transforms*): before, the values gave a bare AttributeError/TypeError/ValueError from
deep inside, a hang, or were silently taken for something else.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import ir
from ir import models
from ir import transforms as tfm
from ir.errors import ArgumentError
from ir.transforms import TransformError

NOT_A_FUNCTION = [None, "mlp", 3, [], {"f": 1}, np.array([1, 2]), ir.Topology.uniform(2)]
NOT_A_FLAG = ["no", "False", 0, 1, 2.0, None, [], [False], np.array([1, 2]), object()]
NOT_A_TOPOLOGY = [True, 4, "a100-hgx", [], {}, np.array([1, 2]), models.mlp(2, 2, 2, 2)]


@pytest.fixture(scope="module")
def mlp() -> ir.Function:
    return models.mlp(8, 16, 32, 4)


@pytest.fixture(scope="module")
def step(mlp: ir.Function) -> ir.Function:
    return tfm.training(mlp)


def _every_transform(f: ir.Function, t: ir.Function) -> dict:
    """Each public transform with its Function argument left to the caller."""
    return {
        "training": lambda g: tfm.training(g),
        "gradients": lambda g: tfm.gradients(g),
        "default_params": lambda g: tfm.default_params(g),
        "data_parallel": lambda g: tfm.data_parallel(g, 2),
        "horizontal_parallel": lambda g: tfm.horizontal_parallel(g, 2),
        "pipeline_parallel": lambda g: tfm.pipeline_parallel(g, 2, 2),
        "megatron": lambda g: tfm.megatron(g, dp=2),
        "parallelize": lambda g: tfm.parallelize(g, dp=2),
        "gradient_accumulation": lambda g: tfm.gradient_accumulation(g, 2),
        "recompute": lambda g: tfm.recompute(g),
        "recomputable": lambda g: tfm.recomputable(g),
        "peak_live_bytes": lambda g: tfm.peak_live_bytes(g),
        "place": lambda g: tfm.place(g, {}),
        "nested": lambda g: tfm.nested(g, ("dp", 2)),
        "data_then_horizontal": lambda g: tfm.data_then_horizontal(g, 2),
        "horizontal_then_data": lambda g: tfm.horizontal_then_data(g, 2),
        "unroll_pmap": lambda g: tfm.unroll_pmap(g),
        "device_programs": lambda g: tfm.device_programs(g),
        "stage_assignment": lambda g: tfm.stage_assignment(g, 2),
        "live_microbatches": lambda g: tfm.live_microbatches(g, 0),
        "setup_program (source)": lambda g: tfm.setup_program(g, f),
        "setup_program (step)": lambda g: tfm.setup_program(f, g),
        "propagate": lambda g: ir.sharding.propagate(g, None, mesh=ir.sharding.Mesh((2,))),
    }


def test_every_transform_refuses_a_function_that_is_not_one(mlp, step) -> None:
    for name, call in _every_transform(mlp, step).items():
        for value in NOT_A_FUNCTION:
            with pytest.raises(ArgumentError, match=r"must be an ir\.Function") as e:
                call(value)
            assert name.split()[0] in str(e.value), (name, value)


@pytest.mark.parametrize(
    "call",
    [
        lambda f, t, v: tfm.data_parallel(f, 2, topology=v),
        lambda f, t, v: tfm.horizontal_parallel(f, 2, topology=v),
        lambda f, t, v: tfm.pipeline_parallel(t, 2, 2, topology=v),
        lambda f, t, v: tfm.megatron(t, dp=2, topology=v),
        lambda f, t, v: tfm.gradient_accumulation(t, 2, topology=v),
        lambda f, t, v: tfm.place(f, {"a": 1}, topology=v),
        lambda f, t, v: tfm.nested(t, ("dp", 2), topology=v),
        lambda f, t, v: tfm.data_then_horizontal(f, 2, topology=v),
        lambda f, t, v: ir.sharding.propagate(f, {"x": (ir.sharding.Mesh((2,)), ["S(0)"])}, v),
    ],
)
def test_a_topology_that_is_not_one_is_refused_by_name(call, mlp, step) -> None:
    for value in NOT_A_TOPOLOGY:
        with pytest.raises(ArgumentError, match=r"topology must be an ir\.Topology"):
            call(mlp, step, value)


@pytest.mark.parametrize(
    ("name", "call"),
    [
        ("return_gradients", lambda f, t, v: tfm.training(f, return_gradients=v)),
        ("resident", lambda f, t, v: tfm.pipeline_parallel(t, 2, 2, resident=v)),
        ("sequence_parallel", lambda f, t, v: tfm.megatron(t, tp=2, sequence_parallel=v)),
        ("sequence_parallel", lambda f, t, v: tfm.parallelize(t, hp=2, sequence_parallel=v)),
        ("symmetry", lambda f, t, v: ir.simulate(f, ir.Topology.uniform(2), symmetry=v)),
    ],
)
def test_a_flag_takes_only_true_or_false(name, call, mlp, step) -> None:
    """Before, any truthy value meant True: ``sequence_parallel="no"`` turned it on."""
    for value in NOT_A_FLAG:
        with pytest.raises(ArgumentError, match=f"{name} must be True or False"):
            call(mlp, step, value)
    call(mlp, step, np.bool_(False))  # numpy's bool is a bool


@pytest.mark.parametrize(
    ("name", "call"),
    [
        ("params", lambda f, v: tfm.training(f, params=v)),
        ("params", lambda f, v: tfm.gradients(f, v)),
        ("values", lambda f, v: tfm.recompute(tfm.training(f), v)),
    ],
)
def test_a_list_of_names_is_not_a_string_or_a_dict(name, call, mlp) -> None:
    """A string was read letter by letter (``params="x"`` meant ``["x"]``)."""
    for value in ["x", "wA", b"x", {"wA": 1}, 3, True, [1], [None]]:
        with pytest.raises(ArgumentError, match=name):
            call(mlp, value)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda f, t, v: tfm.data_parallel(f, 2, batch_inputs=v), "batch_inputs|no input"),
        (lambda f, t, v: tfm.data_parallel(f, 2, inputs=v), "inputs must be one of"),
        (lambda f, t, v: tfm.data_parallel(f, 2, replicated=v), "replicated must be"),
        (lambda f, t, v: tfm.horizontal_parallel(f, 2, output_device=v), "output_device"),
        (lambda f, t, v: tfm.data_parallel(f, 2, var=v), "var must be"),
        (lambda f, t, v: tfm.data_parallel(f, 2, device_map=v), "device_map must"),
        (lambda f, t, v: tfm.pipeline_parallel(t, 2, 2, v), "schedule must be"),
        (lambda f, t, v: tfm.pipeline_parallel(t, 2, 2, output_device=v), "output_device"),
        (lambda f, t, v: tfm.pipeline_parallel(t, 2, 2, stage_of=v), "stage"),
        (lambda f, t, v: tfm.megatron(t, pp=2, microbatches=2, schedule=v), "schedule"),
        (lambda f, t, v: tfm.megatron(t, dp=2, zero=v), "zero must be"),
        (lambda f, t, v: tfm.megatron(t, dp=2, devices=v), "devices"),
        (lambda f, t, v: tfm.nested(t, (v, 2)), "parallelism"),
        (lambda f, t, v: tfm.nested(t, ("pp", 2), microbatches=2, schedule=v), "schedule"),
        (lambda f, t, v: tfm.data_then_horizontal(f, 2, split_at=v), "split_at"),
        (lambda f, t, v: tfm.live_microbatches(f, v), "device"),
    ],
)
def test_options_of_the_wrong_kind_are_transform_errors(call, match, mlp, step) -> None:
    for value in ["", "two words", 1.5, 2.0, -0.0, b"xy", np.array([1, 2]), object(), [[1]]]:
        with pytest.raises(ir.DistIRError, match=match):
            call(mlp, step, value)


def test_zero_takes_integers_only() -> None:
    """``zero=2.0`` (and ``np.float32(2)``) passed the ``in (0, 1, 2)`` test (now 0-3)."""
    t = tfm.training(models.mlp(8, 16, 32, 4))
    for value in (2.0, np.float32(2), -0.0, True):
        with pytest.raises(TransformError, match="zero must be 0, 1, 2 or 3"):
            tfm.megatron(t, dp=2, zero=value)


def test_a_learning_rate_beyond_floats_is_an_argument_error(mlp) -> None:
    with pytest.raises(ArgumentError, match="lr must be a finite number"):
        tfm.training(mlp, lr=10**400)  # float() raised OverflowError


@pytest.mark.parametrize("degree", [2**16, 10**6, 2**70, 10**50])
def test_nested_refuses_a_huge_mesh_at_once(degree: int, step) -> None:
    """``nested(t, ("dp", 2), ("hp", 2**70))`` ran past 10 s."""
    start = time.perf_counter()
    with pytest.raises(TransformError, match="more than the limit"):
        tfm.nested(step, ("dp", 2), ("hp", degree))
    assert time.perf_counter() - start < 2.0


@pytest.mark.parametrize("batch", [1, 2, 3])
def test_horizontal_then_data_checks_the_batch_before_building(batch: int) -> None:
    """A degree above the batch gave a VerifyError of the transform's own Scatter."""
    f = tfm.training(models.mlp(batch, 4, 8, 2, layers=2))
    with pytest.raises(TransformError, match="larger than the batch size"):
        tfm.horizontal_then_data(f, batch + 1)
    g = tfm.horizontal_then_data(f, batch)  # at most the batch: accepted and correct
    inputs = ir.random_inputs(f)
    for a, b in zip(ir.execute_step(g, inputs, f), ir.execute(f, inputs)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "inner",
    [lambda: 1, lambda body, states: 1 / 0, lambda body, states: None, lambda body, states: body.x],
)
def test_a_failing_inner_rewrite_is_named(inner, mlp) -> None:
    with pytest.raises(TransformError, match="inner"):
        tfm.data_parallel(mlp, 2, inner=inner)


def test_shared_analyses_are_checked_and_a_recomputed_steps_named() -> None:
    """``megatron(shared=)``: a value that is no ``SharedAnalyses`` raised AttributeError
    ('str' object has no attribute 'program'); analyses of ``t`` with ``recompute=`` said
    "of another program" of the very program passed. With analyses of the recomputed step
    the step is the one built without them."""
    from ir.transforms._megatron_shared import SharedAnalyses

    t = tfm.training(models.gpt(8, 4, 8, 2, 8, 2, dtype=ir.DType.float64), "adam")
    with pytest.raises(TransformError, match=r"shared must be a SharedAnalyses.*'x'"):
        tfm.megatron(t, shared="x")
    with pytest.raises(TransformError, match=r"recompute='full'.*SharedAnalyses\(step\)"):
        tfm.megatron(t, pp=2, microbatches=2, recompute="full", shared=SharedAnalyses(t))
    with pytest.raises(TransformError, match="another program"):
        tfm.megatron(t, shared=SharedAnalyses(tfm.training(models.mlp(8, 4, 4, 2))))
    step = tfm.recompute(t, "full")
    shared = SharedAnalyses(step)
    tfm.megatron(step, tp=2, pp=2, microbatches=2, shared=shared)
    built = tfm.megatron(step, pp=2, microbatches=2, shared=shared)
    assert str(built) == str(tfm.megatron(t, pp=2, microbatches=2, recompute="full"))


def test_megatron_names_its_own_recompute_layers_in_errors() -> None:
    """``megatron``'s ``recompute_layers`` is ``T.recompute``'s ``layers``: an error says
    the name the caller used."""
    from ir.transforms.recompute import RecomputeError

    t = tfm.training(models.gpt(8, 16, 32, 4, 64, 2))
    with pytest.raises(RecomputeError, match=r"^recompute_layers= counts layers"):
        tfm.megatron(t, pp=2, microbatches=2, recompute="selective", recompute_layers=1)
    with pytest.raises(RecomputeError, match=r"^recompute_layers must be an integer"):
        tfm.megatron(t, pp=2, microbatches=2, recompute="full", recompute_layers=-1)
