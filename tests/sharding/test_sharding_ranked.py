"""Ranked lowering (seed 004): per-rank programs, dedup, tail blocks, halo exchange, deadlock."""

from __future__ import annotations

import numpy as np
import pytest
from _sharding_programs import flat, mlp

import ir
from ir import FunctionBuilder, TensorType
from ir.sharding import (
    DeadlockError,
    Mesh,
    R,
    S,
    check_deadlock,
    lower_to_ranks,
    propagate,
    run_ranked,
)

M2, M22 = Mesh((2,)), Mesh((2, 2))


def ranked_equals_original(
    f: ir.Function, annotations, pad: bool = False, inputs: str = "resident"
):
    """Propagate, lower, run the ranks; equal to ``f``. ``inputs="distribute"`` lowers the
    RFC's form, whose scattered inputs become rank inputs (tail blocks, padding)."""
    g, _ = propagate(f, annotations, inputs=inputs)
    ranked = lower_to_ranks(g, pad=pad)
    check_deadlock(ranked)
    xs = ir.random_inputs(f, 1)
    got = ir.collect(g, run_ranked(ranked, ir.distribute(g, xs, source=f)), rtol=1e-5)
    for want, out in zip(ir.execute(f, xs), got, strict=True):
        np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)
    return ranked


def input_shapes(program: ir.Function) -> list[tuple[int, ...]]:
    return [v.type.shape for v in program.inputs]


def test_identical_ranks_share_one_program_with_local_shapes():
    ranked = ranked_equals_original(mlp(), {"w1": (M2, [S(1)])})
    assert ranked.num_unique == 1
    assert ranked.dedup == {0: 0, 1: 0}
    (program,) = ranked.unique
    assert input_shapes(program) == [(8, 6), (6, 5), (5, 4)]
    assert [op.op_type for op in program.ops] == ["MatMul", "Relu", "MatMul"]


def test_tail_blocks_keep_their_own_shapes():
    ranked = ranked_equals_original(mlp(hidden=9), {"w1": (M2, [S(1)])})
    assert ranked.num_unique == 2
    assert input_shapes(ranked.programs[0]) == [(8, 6), (6, 5), (5, 4)]
    assert input_shapes(ranked.programs[1]) == [(8, 6), (6, 4), (4, 4)]


def test_padding_gives_every_rank_the_same_input_shapes():
    # padding is an option of the RFC's form: a scattered input arrives padded
    ranked = ranked_equals_original(
        mlp(hidden=9), {"w1": (M2, [S(1)])}, pad=True, inputs="distribute"
    )
    assert (
        input_shapes(ranked.programs[0])
        == input_shapes(ranked.programs[1])
        == [
            (8, 6),
            (6, 5),
            (5, 4),
        ]
    )
    assert "Slice" in [op.op_type for op in ranked.programs[1].ops]


@pytest.mark.parametrize(
    "annotations",
    [
        {"x": (M22, [S(0), R]), "w1": (M22, [R, S(1)])},
        {"w1": (M2, [S(0)])},
        {"x": (Mesh((3,)), [S(0)]), "w1": (Mesh((3,)), [S(1)])},
    ],
)
def test_training_step_ranked_equals_the_original(annotations):
    ranked = ranked_equals_original(mlp(7, 6, 10, 4, training=True), annotations)
    collective_ops = [
        op for p in ranked.programs.values() for op in p.ops if op.op_type == "RankCollective"
    ]
    assert collective_ops  # communication is explicit in the rank programs


def test_every_collective_is_matched_across_its_group():
    g, report = propagate(mlp(training=True), {"w1": (M2, [S(1)])})
    ranked = lower_to_ranks(g)
    matching = check_deadlock(ranked)
    assert len(matching.collectives) == len(report.collectives)
    assert all(group == (0, 1) for _, group, _ in matching.collectives)


# -- spatial Conv2D with halo exchange (seed 004's example) -------------------------------


def conv(height: int, padding: str = "valid") -> ir.Function:
    b = FunctionBuilder("conv")
    a = b.input("a", TensorType((1, height, 5, 3), device=0))
    w = b.input("w", TensorType((3, 3, 3, 10), device=0))
    r = b.call("Conv2D", a, w, padding=padding, name="r")
    return b.finish([r])


def test_conv_halo_exchange_matches_the_rfc_example():
    ranked = ranked_equals_original(conv(5), {"a": (M2, [S(1)])})
    p0, p1 = ranked.programs[0], ranked.programs[1]
    assert input_shapes(p0) == [(1, 3, 5, 3), (3, 3, 3, 10)]
    assert input_shapes(p1) == [(1, 2, 5, 3), (3, 3, 3, 10)]
    # rank 0 receives first, then sends; rank 1 sends first, then receives (as in the RFC)
    assert [op.op_type for op in p0.ops] == ["RecvFrom", "Slice", "SendTo", "Concat", "Conv2D"]
    assert [op.op_type for op in p1.ops] == ["Slice", "SendTo", "RecvFrom", "Concat", "Conv2D"]
    assert p0.outputs[0].type.shape == (1, 2, 3, 10)
    assert p1.outputs[0].type.shape == (1, 1, 3, 10)
    assert check_deadlock(ranked).messages == ((1, 0, 1), (0, 1, 2))


@pytest.mark.parametrize(
    ("height", "padding", "devices", "classes"),
    [(11, "same", 4, ((0,), (1, 2), (3,))), (9, "valid", 3, ((0,), (1,), (2,)))],
)
def test_conv_halo_exchange_over_more_devices_and_uneven_rows(height, padding, devices, classes):
    ranked = ranked_equals_original(conv(height, padding), {"a": (Mesh((devices,)), [S(1)])})
    # the edge ranks differ from the interior ones; interior ranks of equal block size form
    # one class whose ranks differ only in their peers and tags
    assert ranked.classes == classes
    for r in ranked.ranks:
        assert ranked.program_for(r).is_equivalent(ranked.programs[r])
    if devices == 4:
        assert {attr for _, attr in ranked.parameters[2]} == {"peer", "tag"}


# -- deadlock ----------------------------------------------------------------------------


def _rank(name: str, peer: int, first: str) -> ir.Function:
    b = FunctionBuilder(name)
    x = b.input("x", TensorType((2,), device=None))
    tag_out, tag_in = (1, 2) if peer == 1 else (2, 1)

    def recv():
        return b.call("RecvFrom", peer=peer, tag=tag_in, shape=[2], name="got")

    def send():
        return b.call("SendTo", x, peer=peer, tag=tag_out, name="sent")

    if first == "recv":
        got = recv()
        send()
    else:
        send()
        got = recv()
    return b.finish([b.call("Add", x, got, name="y")])


def test_a_cycle_of_waits_names_the_ranks_and_ops():
    programs = {0: _rank("r0", 1, "recv"), 1: _rank("r1", 0, "recv")}
    with pytest.raises(DeadlockError, match=r"cycle of waits between ranks \[0, 1\]") as e:
        check_deadlock(programs)
    assert "rank 0 waits at `got: Tensor[(2,), ?] = RecvFrom(peer=1, tag=2" in str(e.value)
    assert "rank 1 waits at `got: Tensor[(2,), ?] = RecvFrom(peer=0, tag=1" in str(e.value)


def test_synchronous_sends_in_the_same_order_also_deadlock():
    programs = {0: _rank("r0", 1, "send"), 1: _rank("r1", 0, "send")}
    with pytest.raises(DeadlockError, match=r"rank 0 waits at `sent.*SendTo"):
        check_deadlock(programs)


def test_opposite_orders_run():
    programs = {0: _rank("r0", 1, "recv"), 1: _rank("r1", 0, "send")}
    assert len(check_deadlock(programs).messages) == 2


def test_a_send_nobody_receives_is_reported():
    b = FunctionBuilder("lonely")
    x = b.input("x", TensorType((2,), device=None))
    b.call("SendTo", x, peer=1, tag=7, name="sent")
    idle = FunctionBuilder("idle")
    y = idle.input("y", TensorType((2,), device=None))
    programs = {0: b.finish([x]), 1: idle.finish([y])}
    with pytest.raises(DeadlockError, match="for rank 1, which has finished"):
        check_deadlock(programs)


def test_reordering_collectives_on_one_rank_deadlocks():
    b = FunctionBuilder("two")
    x = b.input("x", TensorType((4, 6), device=0))
    w, v = (b.input(n, TensorType((6, 3), device=0)) for n in ("w", "v"))
    outs = [
        b.call("Relu", b.call("MatMul", x, m, name=f"{m.name}_y"), name=f"{m.name}_r")
        for m in (w, v)
    ]
    f = b.finish(outs)
    g, report = propagate(f, {"w": (M2, [S(0)]), "v": (M2, [S(0)])})
    assert [c.value for c in report.collectives] == ["w_y", "v_y"]  # one collective each
    ranked = lower_to_ranks(g)
    p1 = ranked.programs[1]
    ops = list(p1.ops)
    i, j = [k for k, op in enumerate(ops) if op.op_type == "RankCollective"]
    # A "local optimisation" on rank 1 only: run the second collective first.
    ops.insert(i, ops.pop(j))
    swapped = ir.Function(p1.name, p1.inputs, tuple(ops), p1.outputs)
    with pytest.raises(DeadlockError, match=r"cycle of waits between ranks \[0, 1\]"):
        check_deadlock({0: ranked.programs[0], 1: swapped})


@pytest.mark.parametrize(
    ("training", "annotations"),
    [
        (True, {"tokens": (M2, [S(0)])}),
        (False, {"tokens": (M22, [S(0), R]), "h0_mlp_w1": (M22, [R, S(1)])}),
    ],
)
def test_gpt_ranked_equals_the_original(training, annotations):
    import ir.models

    f = ir.models.gpt(batch=2, seq=4, hidden=8, heads=2, vocab=11, layers=1, training=training)
    ranked = ranked_equals_original(f, annotations)
    assert len(ranked.ranks) == len(next(iter(annotations.values()))[0].devices)


def test_a_pmap_program_lowers_as_its_unrolled_form():
    body = FunctionBuilder("body")
    xi = body.input("xi", TensorType((2, 3), device=ir.DeviceVar("d")))
    body_f = body.finish([body.call("Relu", xi, name="yi")])
    b = FunctionBuilder("mapped")
    x = b.input("x", TensorType((4, 3), device=0))
    xs = b.call("Scatter", x, dim=0, devices=[1, 2], name="xs")
    ys = b.call("Pmap", xs, subfunctions=[body_f], name="ys")
    f = b.finish([b.call("Gather", ys, dim=0, to_device=0, name="y")])
    ranked = lower_to_ranks(f)
    assert all(op.op_type != "Pmap" for p in ranked.unique for op in p.ops)
    x = np.arange(-6.0, 6.0).reshape(4, 3).astype(np.float32)
    (got,) = run_ranked(ranked, [x])
    np.testing.assert_array_equal(got, np.maximum(x, 0))


@pytest.mark.parametrize("transform", ["data_parallel", "horizontal_parallel"])
def test_unrolled_transform_outputs_lower_and_run_like_the_global_program(transform):
    import ir.models
    from ir import transforms

    f = ir.models.mlp(8, 4, 6, 4, training=True)
    g = transforms.unroll_pmap(getattr(transforms, transform)(f, 2))
    ranked = lower_to_ranks(g)
    assert ranked.num_unique == 1  # both ranks run the same SPMD program
    # a steady-state step: each rank's resident weights and batch slice are its inputs
    inputs = ir.distribute(g, ir.random_inputs(f, 0), source=f)
    for want, got in zip(flat(ir.execute(g, inputs)), flat(run_ranked(ranked, inputs))):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_conv_batch_and_spatial_sharding_on_a_2x2_mesh():
    b = FunctionBuilder("conv2")
    a = b.input("a", TensorType((2, 7, 5, 3), device=0))
    w = b.input("w", TensorType((3, 3, 3, 4), device=0))
    r = b.call("Conv2D", a, w, padding="same", name="r")
    f = b.finish([b.call("Relu", r, name="y")])
    _, report = propagate(f, {"a": (M22, [S(0), S(1)])})
    assert report.strategies[0][1] == "axis 0: split n; axis 1: halo exchange along tensor axis 1"
    assert report.collectives == []  # only point-to-point halo rows move
    ranked = ranked_equals_original(f, {"a": (M22, [S(0), S(1)])})
    assert len(check_deadlock(ranked).messages) == 4  # each of 2 pairs swaps one row each way
