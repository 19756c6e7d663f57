"""Horizontal (Megatron) parallelism is proven by execution on MLPs and a transformer block."""

from __future__ import annotations

import pytest
from _parallel_programs import MODELS, assert_same, biased_mlp, mlp, model, transformer_block
from hypothesis import given, settings
from hypothesis import strategies as st

import ir
import ir.models
from ir.transforms._rewrite import TransformError
from ir.transforms.horizontal import horizontal_parallel


def _kinds(g) -> list[str]:
    return [op.op_type for op in g.ops]


def _split(g) -> dict[str, str]:
    """The step's split inputs and their layouts (``S(1)``: by columns, ``S(0)``: by rows)."""
    return {
        v.name: levels[0]
        for v, levels in zip(g.inputs, g.input_layouts)
        if levels and levels[0] != "R"
    }


@pytest.mark.parametrize("degree", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("layers", [2, 3, 4])
def test_training_mlp_matches_sequential(degree: int, layers: int) -> None:
    f = mlp(8, 4, 6, 5, layers=layers, training=True)
    assert_same(f, horizontal_parallel(f, degree))


@pytest.mark.parametrize("degree", [2, 4])
def test_adam_gelu_mlp(degree: int) -> None:
    f = mlp(5, 4, 8, 4, layers=2, training=True, optimizer="adam", activation="Gelu")
    assert_same(f, horizontal_parallel(f, degree))


def test_forward_pair_is_column_then_row_with_one_allreduce_at_the_end() -> None:
    g = horizontal_parallel(mlp(8, 4, 6, 5), 2)
    assert _kinds(g) == ["Pmap", "Reduce"]
    assert g.input_layouts == (("S(1)",), ("S(0)",), ("R",))
    d = horizontal_parallel(mlp(8, 4, 6, 5), 2, inputs="distribute")
    assert _kinds(d) == ["Scatter", "Scatter", "Broadcast", "Pmap", "Reduce"]
    assert d.ops[0].attributes["dim"] == 1 and d.ops[1].attributes["dim"] == 0


def test_training_pair_has_one_allreduce_forward_none_needed_backward() -> None:
    """The first layer's dx is never used, so backward needs no all-reduce (Megatron's f/g)."""
    f = mlp(8, 4, 6, 5, training=True)
    g = horizontal_parallel(f, 2)
    assert _kinds(g).count("AllReduce") == 1
    # the updated weight shards stay where they live, in their inputs' layouts
    assert "Gather" not in _kinds(g)
    assert g.output_layouts[:2] == g.input_layouts[:2] == (("S(1)",), ("S(0)",))
    assert_same(f, g, steps=3)
    d = horizontal_parallel(f, 2, inputs="distribute")
    assert _kinds(d)[-2:] == ["Gather", "Gather"]


def test_four_layers_make_two_pairs() -> None:
    f = mlp(8, 4, 6, 5, layers=4, training=True)
    g = horizontal_parallel(f, 2)
    assert list(_split(g)) == ["w0", "w1", "w2", "w3"]
    # forward: one per pair; backward: the second pair's dx feeds the first pair
    assert _kinds(g).count("AllReduce") == 3


def test_odd_layer_count_keeps_the_last_layer_whole() -> None:
    g = horizontal_parallel(mlp(8, 4, 6, 5, layers=3, training=True), 3)
    assert g.input_layouts[2] == ("R",) and "w2" not in _split(g)


@pytest.mark.parametrize("degree", [2, 4])
def test_attention_splits_by_heads(degree: int) -> None:
    f = transformer_block(2, 4, 8, 4)
    g = horizontal_parallel(f, degree)
    assert set(_split(g)) == {"wq", "wk", "wv", "wo", "wfc", "wproj"}
    assert _kinds(g).count("AllReduce") == 2  # one after attention, one after the MLP
    assert_same(f, g)


def test_heads_that_do_not_divide_keep_attention_whole() -> None:
    f = transformer_block(2, 4, 8, 4)
    g = horizontal_parallel(f, 3)
    assert set(_split(g)) == {"wfc", "wproj"}
    assert_same(f, g)


def test_degree_larger_than_hidden_is_an_error() -> None:
    with pytest.raises(TransformError, match="larger than dim 1 of 'w0'"):
        horizontal_parallel(mlp(4, 3, 2, 4), 3)


def test_program_without_pairs_is_an_error() -> None:
    with pytest.raises(TransformError, match="no weight to split"):
        horizontal_parallel(mlp(4, 3, 6, 4, layers=1), 2)


@pytest.mark.parametrize("name", MODELS)
def test_models_match_sequential(name: str) -> None:
    f = model(name)
    assert_same(f, horizontal_parallel(f, 2))


def test_gpt_training_splits_every_block_and_sums_twice_per_block_each_way() -> None:
    f = model("gpt_sgd")
    g = horizontal_parallel(f, 2)
    split = set(_split(g))
    for i in range(1):
        assert {f"h{i}_attn_w{c}" for c in "qkvo"} <= split
        assert {f"h{i}_mlp_w1", f"h{i}_mlp_w2"} <= split
    assert "w_head" not in split and "wte" not in split
    # forward: 2 per block; backward: 2 per block (the input gradients of the split pairs)
    assert [op.op_type for op in g.ops].count("AllReduce") == 4


@settings(max_examples=15, deadline=None)
@given(hidden=st.integers(1, 9), layers=st.integers(2, 4), degree=st.integers(1, 9))
def test_any_degree_up_to_the_hidden_size(hidden: int, layers: int, degree: int) -> None:
    f = ir.models.mlp(4, 3, hidden, 4, layers=layers, training=True, dtype=ir.DType.float64)
    if degree > hidden:
        with pytest.raises(TransformError, match="larger than dim"):
            horizontal_parallel(f, degree)
    else:
        assert_same(f, horizontal_parallel(f, degree))


@pytest.mark.parametrize("training", [False, True])
def test_column_bias_is_split_with_its_weight(training: bool) -> None:
    f = biased_mlp(training)
    g = horizontal_parallel(f, 3)
    assert _split(g) == {"w1": "S(1)", "b1": "S(0)", "w2": "S(0)"}
    assert_same(f, g)
