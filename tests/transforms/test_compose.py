"""Compositions of D, H and P (seed 003), proven by execution, plus their structure."""

from __future__ import annotations

import pytest
from _parallel_programs import MODELS, assert_same, biased_mlp, mlp, model

import ir
import ir.models
from ir.transforms import (
    TransformError,
    data_then_horizontal,
    horizontal_then_data,
    nested,
    unroll_pmap,
)
from ir.transforms._emit import carried_inputs

COMPOSITIONS = {
    "D then H": lambda f: data_then_horizontal(f, 2),
    "H then D": lambda f: horizontal_then_data(f, 2),
    "D over H": lambda f: nested(f, ("dp", 2), ("hp", 2)),
    "H over D": lambda f: nested(f, ("hp", 2), ("dp", 2)),
    "D over P": lambda f: nested(f, ("dp", 2), ("pp", 2), microbatches=2),
    "H over P": lambda f: nested(f, ("hp", 2), ("pp", 2), microbatches=2),
    "D over H over P": lambda f: nested(
        f, ("dp", 2), ("hp", 2), ("pp", 2), microbatches=2, schedule="1f1b"
    ),
}


def _kinds(g) -> list[str]:
    return [op.op_type for op in g.ops]


def _depth(f: ir.Function) -> int:
    return max([0] + [1 + _depth(op.subfunctions[0]) for op in f.ops if op.op_type == "Pmap"])


def _devices(g: ir.Function) -> list[int]:
    return sorted(d for d in unroll_pmap(g).devices if isinstance(d, int))


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("how", list(COMPOSITIONS))
def test_compositions_match_sequential(name: str, how: str) -> None:
    f = model(name)
    g = COMPOSITIONS[how](f)
    assert_same(f, g)
    assert_same(f, unroll_pmap(g))


def test_data_then_horizontal_has_the_seed_shape() -> None:
    g = data_then_horizontal(mlp(8, 4, 6, 6), 2)
    assert _kinds(g) == ["Pmap", "AllGather", "Pmap"]
    # wA replicated, wB by columns, x by rows; y stays split along its columns
    assert g.input_layouts == (("R",), ("S(1)",), ("S(0)",))
    assert g.output_layouts == (("S(1)",),)
    d = data_then_horizontal(mlp(8, 4, 6, 6), 2, inputs="distribute")
    assert _kinds(d) == ["Broadcast", "Scatter", "Scatter", "Pmap", "AllGather", "Pmap", "Gather"]
    assert d.ops[1].attributes["dim"] == 1  # wB by columns
    assert d.ops[-1].attributes["dim"] == 1  # y gathered along its columns
    assert_same(mlp(8, 4, 6, 6), d)


def test_horizontal_then_data_switches_split_with_an_all_to_all() -> None:
    g = horizontal_then_data(mlp(8, 4, 6, 6), 2)
    assert _kinds(g) == ["Pmap", "AllToAll", "Pmap"]
    assert g.input_layouts == (("S(1)",), ("R",), ("R",))
    assert g.output_layouts == (("S(0)",),)
    d = horizontal_then_data(mlp(8, 4, 6, 6), 2, inputs="distribute")
    assert _kinds(d) == ["Scatter", "Broadcast", "Broadcast", "Pmap", "AllToAll", "Pmap", "Gather"]
    assert d.ops[-1].attributes["dim"] == 0


@pytest.mark.parametrize("how", ["D then H", "H then D"])
@pytest.mark.parametrize("batch", [8, 7])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_sequential_training_steps_keep_their_state(how: str, batch: int, optimizer: str) -> None:
    """Three steps in a row on the step's own outputs equal three sequential steps; the
    updated weights and optimizer state come back in their inputs' layouts."""
    forward = ir.models.mlp(batch, 3, 6, 4, layers=4, dtype=ir.DType.float64)
    f = ir.transforms.training(forward, optimizer=optimizer)
    g = COMPOSITIONS[how](f)
    carried = carried_inputs(f)
    assert len(carried) == (12 if optimizer == "adam" else 4)
    for out, source in carried.items():
        i, j = f.outputs.index(out), f.inputs.index(source)
        assert g.output_layouts[i] == g.input_layouts[j] and g.outputs[i].type == g.inputs[j].type
    assert_same(f, g, steps=3)


@pytest.mark.parametrize(
    ("levels", "depth", "devices"),
    [
        ((("dp", 2), ("hp", 2)), 2, 4),
        ((("hp", 2), ("dp", 3)), 2, 6),
        ((("dp", 3), ("pp", 2)), 1, 6),
        ((("hp", 2), ("pp", 2)), 1, 4),
        ((("dp", 2), ("hp", 2), ("pp", 2)), 2, 8),
    ],
)
def test_recursive_levels_nest_pmaps_over_a_mesh(levels, depth: int, devices: int) -> None:
    f = model("mlp_sgd")
    g = nested(f, *levels, microbatches=2)
    assert _depth(g) == depth
    assert _devices(g) == list(range(devices))
    outer = next(op for op in g.ops if op.op_type == "Pmap")
    assert outer.attributes["device_map"] is not None
    assert_same(f, g)


def test_errors() -> None:
    f = model("mlp_sgd")
    with pytest.raises(TransformError, match="innermost"):
        nested(f, ("pp", 2), ("dp", 2))
    with pytest.raises(TransformError, match="unknown parallelism"):
        nested(f, ("tp", 2))
    with pytest.raises(TransformError, match="positive integer"):
        nested(f, ("dp", 0))
    with pytest.raises(TransformError, match="not in the topology"):
        nested(f, ("dp", 2), ("hp", 2), topology=ir.Topology.uniform(2))
    with pytest.raises(TransformError, match="larger than"):
        data_then_horizontal(mlp(8, 4, 6, 3), 4)
    with pytest.raises(TransformError, match="at least two weights"):
        horizontal_then_data(mlp(8, 4, 6, 3, layers=1), 2)


def test_bad_inner_degrees_are_errors_not_silent_fallbacks() -> None:
    f = ir.models.mlp(8, 3, 4, 4, layers=2, training=True, dtype=ir.DType.float64)
    with pytest.raises(TransformError, match="rows per replica"):
        nested(f, ("dp", 2), ("pp", 2), microbatches=5)
    with pytest.raises(TransformError, match="stages more than layers"):
        nested(f, ("dp", 2), ("pp", 3), microbatches=2)
    with pytest.raises(TransformError, match="larger than dim"):
        nested(f, ("dp", 2), ("hp", 5))
    with pytest.raises(TransformError, match="larger than the batch size"):
        nested(f, ("hp", 2), ("dp", 9))


@pytest.mark.parametrize("how", list(COMPOSITIONS))
def test_compositions_of_a_biased_mse_mlp(how: str) -> None:
    f = biased_mlp()
    assert_same(f, COMPOSITIONS[how](f))
