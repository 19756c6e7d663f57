"""Data parallelism is proven by execution: same outputs and updated weights as the sequential
program, for even and uneven splits, SGD and Adam, forward and training programs."""

from __future__ import annotations

import pytest
from _parallel_programs import MODELS, assert_same, mlp, model
from hypothesis import given, settings
from hypothesis import strategies as st

import ir
import ir.models
from ir.transforms._rewrite import TransformError
from ir.transforms.data_parallel import data_parallel


@pytest.mark.parametrize("degree", [1, 2, 3, 5, 8])
@pytest.mark.parametrize("layers", [1, 2, 3])
def test_training_mlp_matches_sequential(degree: int, layers: int) -> None:
    f = mlp(8, 4, 6, 5, layers=layers, training=True)
    assert_same(f, data_parallel(f, degree))


@pytest.mark.parametrize("degree", [2, 3])
def test_adam_and_gelu(degree: int) -> None:
    f = mlp(7, 3, 5, 4, layers=3, training=True, optimizer="adam", activation="Gelu")
    assert_same(f, data_parallel(f, degree))


def test_forward_step_is_one_pmap_on_resident_inputs() -> None:
    """Steady state: the weights are replicas and the batch shards where they live; y stays
    split (layout S(0)); nothing is scattered, broadcast or gathered."""
    f = mlp(6, 4, 5, 3)
    g = data_parallel(f, 3)
    assert [op.op_type for op in g.ops] == ["Pmap"]
    assert g.input_layouts == (("R",), ("R",), ("S(0)",))
    assert g.output_layouts == (("S(0)",),)
    assert [v.name for v in g.inputs] == [v.name for v in f.inputs]
    assert_same(f, g)


def test_distribute_keeps_the_seed_form() -> None:
    f = mlp(6, 4, 5, 3)
    g = data_parallel(f, 3, inputs="distribute")
    assert [op.op_type for op in g.ops] == ["Broadcast", "Broadcast", "Scatter", "Pmap", "Gather"]
    assert g.input_layouts == ()
    assert_same(f, g)


def test_unknown_input_mode_is_an_error() -> None:
    with pytest.raises(TransformError, match="inputs must be one of"):
        data_parallel(mlp(6, 4, 5, 3), 3, inputs="whole")


def test_training_program_has_the_seed_shape() -> None:
    """Seed 000: scatter/broadcast, pmap(forward + backward), all-reduce grads, pmap(update)."""
    f = mlp(8, 4, 6, 5, training=True)
    g = data_parallel(f, 4, devices=[1, 2, 3, 4], inputs="distribute")
    kinds = [op.op_type for op in g.ops]
    assert kinds == [
        "Broadcast",
        "Broadcast",
        "Scatter",
        "Scatter",
        "Pmap",
        "AllReduce",
        "AllReduce",
        "Pmap",
        "Gather",
        "Reduce",
    ]
    body = g.ops[4].subfunctions[0]
    losses = [op for op in body.ops if op.op_type in ("Loss", "LossGrad")]
    assert all(op.attributes["denominator"] == 8 for op in losses)
    assert g.ops[2].outputs[0].type.devices == (1, 2, 3, 4)
    updated = ir.execute(g, ir.random_inputs(f))[0]
    assert isinstance(updated, tuple) and len(updated) == 4


def test_training_step_keeps_weights_where_they_live() -> None:
    """The steady-state step: pmap(forward + backward), all-reduce grads, pmap(update), the
    loss reduced; the updated weights come back as the replicas they came in as."""
    f = mlp(8, 4, 6, 5, training=True)
    g = data_parallel(f, 4, devices=[1, 2, 3, 4])
    assert [op.op_type for op in g.ops] == ["Pmap", "AllReduce", "AllReduce", "Pmap", "Reduce"]
    assert g.input_layouts == (("R",), ("R",), ("S(0)",), ("S(0)",))
    assert g.output_layouts == (("R",), ("R",), ("S(0)",), None)
    for v, w in zip(g.inputs[:2], g.outputs[:2]):
        assert v.type == w.type and v.type.devices == (1, 2, 3, 4)
    assert_same(f, g, steps=3)


def test_uneven_split_uses_one_pmap_per_shard_shape() -> None:
    f = mlp(7, 4, 6, 5, training=True)
    g = data_parallel(f, 3)
    pmaps = [op for op in g.ops if op.op_type == "Pmap"]
    assert len(pmaps) == 3  # two shard shapes (3, 2, 2 rows) + one update pmap
    assert_same(f, g)


def test_degree_larger_than_batch_is_an_error() -> None:
    with pytest.raises(TransformError, match="larger than the batch size"):
        data_parallel(mlp(4, 3, 5, 4), 5)


@pytest.mark.parametrize("degree", [0, -1, 1.5])
def test_bad_degree_is_an_error(degree) -> None:
    with pytest.raises(TransformError, match="positive integer"):
        data_parallel(mlp(4, 3, 5, 4), degree)


def test_devices_must_be_in_the_topology() -> None:
    topo = ir.Topology.uniform(2)
    with pytest.raises(TransformError, match="not in the topology"):
        data_parallel(mlp(4, 3, 5, 4), 2, devices=[1, 7], topology=topo)


def test_named_batch_inputs_must_exist() -> None:
    with pytest.raises(TransformError, match="no input"):
        data_parallel(mlp(4, 3, 5, 4), 2, batch_inputs=["nope"])


@pytest.mark.parametrize("name", MODELS)
@pytest.mark.parametrize("degree", [2, 3])
def test_models_match_sequential(name: str, degree: int) -> None:
    f = model(name)
    assert_same(f, data_parallel(f, degree))


@settings(max_examples=15, deadline=None)
@given(
    batch=st.integers(1, 9),
    hidden=st.integers(1, 6),
    layers=st.integers(1, 3),
    degree=st.integers(1, 9),
)
def test_any_degree_up_to_the_batch(batch: int, hidden: int, layers: int, degree: int) -> None:
    f = ir.models.mlp(batch, 3, hidden, 4, layers=layers, training=True, dtype=ir.DType.float64)
    if degree > batch:
        with pytest.raises(TransformError, match="larger than the batch size"):
            data_parallel(f, degree)
    else:
        assert_same(f, data_parallel(f, degree))


def test_devices_default_to_the_topology() -> None:
    topo = ir.Topology.uniform(3, first_id=4)
    g = data_parallel(mlp(6, 3, 5, 4), 3, topology=topo)
    assert g.inputs[-1].type.devices == (4, 5, 6)
    with pytest.raises(TransformError, match="only 3 devices"):
        data_parallel(mlp(6, 3, 5, 4), 4, topology=topo)
