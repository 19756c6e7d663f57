"""setup_program: the one-time distribution of a steady-state step's state, proven by
execution (setup, then the step, equals the sequential program) and costed by simulation."""

from __future__ import annotations

import numpy as np
import pytest
from _parallel_programs import inputs_for, mlp, model

import ir
from ir.layout import with_layouts
from ir.transforms import (
    TransformError,
    data_parallel,
    data_then_horizontal,
    horizontal_parallel,
    horizontal_then_data,
    megatron,
    setup_program,
)

STEPS = {
    "dp": lambda f: data_parallel(f, 3),
    "dp on 1..4": lambda f: data_parallel(f, 4, devices=[1, 2, 3, 4]),
    "hp": lambda f: horizontal_parallel(f, 2),
    "D then H": lambda f: data_then_horizontal(f, 2),
    "H then D": lambda f: horizontal_then_data(f, 2),
}


def _setup_then_step(f: ir.Function, g: ir.Function, args: list) -> list:
    laid_out = ir.execute(setup_program(f, g), args)
    return ir.collect(g, ir.execute(g, list(laid_out)))


@pytest.mark.parametrize("how", list(STEPS))
@pytest.mark.parametrize("name", ["mlp", "mlp_sgd", "mlp_adam", "gpt_sgd"])
def test_setup_then_step_equals_the_source(how: str, name: str) -> None:
    f = model(name)
    g = STEPS[how](f)
    setup = setup_program(f, g)
    assert [v.name for v in setup.inputs] == [v.name for v in f.inputs]
    assert [v.type for v in setup.outputs] == [v.type for v in g.inputs]
    args = inputs_for(f)
    laid_out = ir.execute(setup, args)
    for got, want in zip(laid_out, ir.distribute(g, args, source=f)):
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)
    for got, want in zip(_setup_then_step(f, g, args), ir.execute(f, args)):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


MEGATRON = {
    "dp 2": {"dp": 2},
    "tp 2": {"tp": 2},
    "dp 2 x tp 2": {"dp": 2, "tp": 2},
    "dp x tp x pp": {"dp": 2, "tp": 2, "pp": 2, "microbatches": 2},
    "ZeRO-2": {"dp": 2, "zero": 2},
}


def _assert_nested_equal(got, want) -> None:
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want)
        for a, b in zip(got, want):
            _assert_nested_equal(a, b)
    else:
        np.testing.assert_array_equal(got, want)


def _adam() -> ir.Function:
    return ir.transforms.training(
        ir.models.mlp(8, 3, 4, 4, layers=2, dtype=ir.DType.float64), optimizer="adam"
    )


@pytest.mark.parametrize("config", list(MEGATRON))
@pytest.mark.parametrize("name", ["mlp_sgd", "adam", "gpt_sgd"])
def test_setup_of_a_megatron_step_lays_out_mesh_levels(config: str, name: str) -> None:
    """Issue 25 (found by fuzzing transforms of transformed programs): a Megatron step's
    layouts are mesh levels (``("R@2", "S(1)@2")``), which setup_program read as
    ``int("")`` (a ValueError); each element is now sliced from the whole along every
    split mesh axis and sent to its device."""
    f = _adam() if name == "adam" else model(name)
    g = megatron(f, **MEGATRON[config])
    args = inputs_for(f)
    laid_out = ir.execute(setup_program(f, g), args)
    _assert_nested_equal(tuple(laid_out), tuple(ir.distribute(g, args, source=f)))
    for got, want in zip(_setup_then_step(f, g, args), ir.execute(f, args)):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


def test_ops_follow_the_layouts() -> None:
    """Horizontal: w0 by columns, w1 by rows, the batch copied to both devices."""
    f = mlp(8, 4, 6, 5, training=True)
    setup = setup_program(f, horizontal_parallel(f, 2))
    assert [op.op_type for op in setup.ops] == ["Scatter", "Scatter", "Broadcast", "Broadcast"]
    assert [op.attributes["dim"] for op in setup.ops[:2]] == [1, 0]
    assert [op.op_type for op in setup_program(f, data_parallel(f, 2)).ops] == [
        "Broadcast",
        "Broadcast",
        "Scatter",
        "Scatter",
    ]


def test_plain_tensors_move_by_send_or_stay() -> None:
    """A pipeline-like step: each weight a plain tensor on its stage's device."""
    f = mlp(4, 3, 5, 2)
    b = ir.FunctionBuilder("staged")
    w0 = b.input("w0", f.inputs[0].type)
    w1 = b.input("w1", f.inputs[1].type.with_device(1))
    x = b.input("x", f.inputs[2].type)
    h = b.call("Relu", b.call("MatMul", x, w0, name="a0"), name="h0")
    y = b.call("MatMul", b.call("Send", h, to_device=1, name="h0_1"), w1, name="y")
    g = b.finish([b.call("Send", y, to_device=0, name="y0")])
    setup = setup_program(f, g)
    assert [op.op_type for op in setup.ops] == ["Send"]
    args = inputs_for(f)
    np.testing.assert_allclose(_setup_then_step(f, g, args)[0], ir.execute(f, args)[0])


def test_nested_layouts_lay_out_level_by_level() -> None:
    """2 replicas of 2 column shards: ("R", "S(1)"), and 2 row blocks of 2 replicas."""
    b = ir.FunctionBuilder("f")
    w = b.input("w", ir.TensorType((4, 6), ir.DType.float64, 0))
    f = b.finish([b.call("Relu", w, name="y")])
    col = [ir.TensorType((4, 3), ir.DType.float64, d) for d in range(4)]
    row = [ir.TensorType((2, 6), ir.DType.float64, d) for d in range(4)]
    for levels, parts in ((("R", "S(1)"), col), (("S(0)", "R"), row)):
        t = ir.TupleType((ir.TupleType(tuple(parts[:2])), ir.TupleType(tuple(parts[2:]))))
        sb = ir.FunctionBuilder("step")
        ws = sb.input("w", t)
        step = with_layouts(sb.finish([ws]), inputs={"w": levels}, outputs=[levels])
        setup = setup_program(f, step)
        arg = np.arange(24.0).reshape(4, 6)
        (laid_out,) = ir.execute(setup, [arg])
        np.testing.assert_array_equal(ir.collect(step, [laid_out])[0], arg)
        (want,) = ir.distribute(step, {"w": arg})
        for got_part, want_part in zip(laid_out, want):
            for a, c in zip(got_part, want_part):
                np.testing.assert_array_equal(a, c)


def test_names_and_layouts_are_checked() -> None:
    f = mlp(6, 4, 5, 3)
    g = data_parallel(f, 2)
    other = mlp(6, 4, 5, 3, layers=3)
    with pytest.raises(TransformError, match="are not inputs of"):
        setup_program(mlp(6, 4, 5, 3, layers=1), g)
    bare = g.__class__(g.name, g.inputs, g.ops, g.outputs)  # the layouts dropped
    with pytest.raises(TransformError, match="tuple without a layout"):
        setup_program(f, bare)
    with pytest.raises(TransformError, match="gives"):
        setup_program(other, data_parallel(mlp(6, 4, 7, 3, layers=3), 2))


def test_setup_is_the_one_time_cost_the_step_no_longer_pays() -> None:
    f = ir.models.mlp(64, 256, 256, 16, layers=4, training=True)
    topology = ir.Topology.preset("a100-hgx", 4)
    step = data_parallel(f, 4)
    old = data_parallel(f, 4, inputs="distribute")
    setup_s = ir.simulate(setup_program(f, step), topology).step_time_s
    step_s = ir.simulate(step, topology).step_time_s
    old_s = ir.simulate(old, topology).step_time_s
    assert setup_s > 0 and step_s < old_s
