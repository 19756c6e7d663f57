"""The RFC's second uneven convention: fixed blocks with a short tail (``S(i, b)``).

Beside the balanced split (the first ``n % k`` shards one element more), a placement
``S(i, b)`` cuts axis ``i`` into blocks of ``b`` with a short tail: seed 004's
66-wide weight over 2 devices in blocks of 64 is 64 + 2. The blocks flow through
propagation (an operand's blocks carry to the factor it splits), redistribution
(a reduce-scatter or all-to-all makes balanced blocks, so fixed blocks come from an
all-reduce or all-gather and a slice), lowering (tail ranks keep their own shapes,
or arrive padded with ``pad=True``) and the ranked runs.
"""

from __future__ import annotations

import numpy as np
import pytest

import ir
from ir.ops.communication import block_sizes, shard_sizes
from ir.sharding import (
    Layout,
    Mesh,
    S,
    check_deadlock,
    lower_to_ranks,
    placement,
    propagate,
    run_ranked,
)

M2, M22 = Mesh((2,)), Mesh((2, 2))


def test_block_sizes_are_fixed_blocks_with_a_short_tail():
    assert block_sizes(66, 2, 64) == [64, 2]
    assert block_sizes(127, 2, 64) == [64, 63]
    assert block_sizes(10, 4, 3) == [3, 3, 3, 1]
    assert shard_sizes(10, 4) == [3, 3, 2, 2]  # balanced, as before
    with pytest.raises(ir.DistIRError, match=r"64 < 64 <= 128"):
        block_sizes(64, 2, 64)  # the tail would be empty
    with pytest.raises(ir.DistIRError, match=r"64 < 130 <= 128"):
        block_sizes(130, 2, 64)  # the blocks do not cover the axis


def test_a_block_placement_reads_prints_splits_and_merges():
    assert placement("S(1, 64)") == S(1, block=64) != S(1)
    assert str(S(1, block=64)) == "S(1, 64)" and str(S(1)) == "S(1)"
    layout = Layout(M2, ["S(1, 64)"])
    x = np.arange(8 * 66).reshape(8, 66)
    parts = layout.split(x)
    assert [p.shape for p in parts] == [(8, 64), (8, 2)]
    np.testing.assert_array_equal(layout.merge(parts), x)
    assert Layout.from_attributes(layout.attributes()) == layout
    with pytest.raises(ir.DistIRError, match="blocks of 64 over 2 devices"):
        Layout(M2, [S(1, block=64)]).check((8, 200))
    with pytest.raises(ir.DistIRError, match="a block is an int >= 1"):
        S(0, block=0)


def rfc_matmul() -> ir.Function:
    """Seed 004's ranked-lowering example: x @ A -> gelu -> @ B, A (8, 66) and B (66, 8)."""
    b = ir.FunctionBuilder("rfc")
    x = b.input("x", ir.TensorType((8, 8), device=0))
    a = b.input("A", ir.TensorType((8, 66), device=0))
    w = b.input("B", ir.TensorType((66, 8), device=0))
    y = b.call("Gelu", b.call("MatMul", x, a, name="lv0"), name="Y")
    z = b.call("MatMul", y, w, name="Z")
    return b.finish([b.call("Softmax", z, axis=0, name="W")])


def _equal(f: ir.Function, g: ir.Function, ranked, seed: int = 0) -> None:
    inputs = ir.random_inputs(f, seed)
    (want,) = ir.execute(f, inputs)
    np.testing.assert_allclose(ir.execute(g, inputs)[0], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(run_ranked(ranked, inputs)[0], want, rtol=1e-5, atol=1e-6)


def test_the_rfc_tail_block_64_plus_2_propagates_lowers_and_runs():
    f = rfc_matmul()
    g, _ = propagate(f, {"A": (M2, [S(1, block=64)])}, inputs="distribute")
    ranked = lower_to_ranks(g)
    check_deadlock(ranked)
    shapes = {r: [v.type.shape for v in p.inputs] for r, p in ranked.programs.items()}
    # B follows A's blocks through the contraction factor they share
    assert shapes == {0: [(8, 8), (8, 64), (64, 8)], 1: [(8, 8), (8, 2), (2, 8)]}
    assert ranked.classes == ((0,), (1,))  # the tail rank has its own program
    _equal(f, g, ranked)
    padded = lower_to_ranks(g, pad=True)
    assert [v.type.shape for v in padded.programs[1].inputs] == [(8, 8), (8, 64), (64, 8)]
    _equal(f, g, padded)
    balanced, _ = propagate(f, {"A": (M2, [S(1)])}, inputs="distribute")
    assert lower_to_ranks(balanced).num_unique == 1  # 33 + 33: one program


@pytest.mark.parametrize(
    "annotations",
    [
        {"A": (M2, [S(1, block=64)]), "Z": (M2, [S(0, block=6)])},  # P(sum) -> S(0, 6)
        {"x": (M2, [S(0, block=6)]), "A": (M2, [S(1)])},  # blocks beside a balanced split
        {"x": (M2, [S(0)]), "lv0": (M2, [S(0, block=6)])},  # balanced -> blocks
        {"A": (M22, [S(1, block=64), S(1)])},  # blocks split again, balanced
        {"x": (M22, [S(0, block=5), S(1, block=6)])},
    ],
    ids=["partial to blocks", "blocks and balanced", "balanced to blocks", "nested", "2x2"],
)
def test_redistribution_into_and_out_of_blocks_keeps_the_values(annotations):
    f = rfc_matmul()
    g, _ = propagate(f, annotations, inputs="distribute")  # the RFC's form: inputs scattered
    ranked = lower_to_ranks(g)
    check_deadlock(ranked)
    _equal(f, g, ranked, seed=3)


def test_fixed_blocks_come_from_an_all_reduce_and_a_slice_not_a_reduce_scatter():
    f = rfc_matmul()

    def kinds(annotations) -> set[str]:
        g, _ = propagate(f, annotations)
        return {op.op_type for op in g.ops}

    assert "ReduceScatter" in kinds({"A": (M2, [S(1)]), "Z": (M2, [S(0)])})
    blocks = kinds({"A": (M2, [S(1, block=64)]), "Z": (M2, [S(0, block=6)])})
    assert "ReduceScatter" not in blocks and {"AllReduce", "Slice"} <= blocks
