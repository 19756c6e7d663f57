"""Every program the transforms build lowers to rank programs that compute what it does.

Pipelines (GPipe, 1F1B, interleaved), nested compositions, the training versions
of seed 003's sequential compositions and Megatron 3D steps (grouped collectives,
SendEach, ZeRO) are unrolled, lowered with ``lower_to_ranks`` and run with the
numpy ``run_ranked``: equal to ``ir.execute`` of the same program and, through the
step's layouts, to the sequential program. Seed 002's nested programs (a device
map tree two levels deep too) lower and run, and ranks that differ only in slice
offsets, peers and groups share one program (rank classes).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from _sharding_programs import flat

import ir
import ir.models
from ir import transforms
from ir.sharding import (
    LoweringError,
    Mesh,
    S,
    check_deadlock,
    lower_to_ranks,
    propagate,
    run_ranked,
)

F64 = ir.DType.float64


def mlp_sgd(layers: int = 2) -> ir.Function:
    return ir.models.mlp(8, 4, 6, 4, layers=layers, training=True, dtype=F64)


def gpt_sgd() -> ir.Function:
    return ir.models.gpt(4, 3, 8, 2, 12, 1, training=True, dtype=F64)


PROGRAMS = {
    "gpipe": (mlp_sgd, lambda f: transforms.pipeline_parallel(f, 2, 2)),
    "1f1b": (mlp_sgd, lambda f: transforms.pipeline_parallel(f, 2, 4, "1f1b")),
    "interleaved": (
        lambda: mlp_sgd(4),
        lambda f: transforms.pipeline_parallel(f, 2, 2, "interleaved", chunks=2),
    ),
    "nested D over H": (mlp_sgd, lambda f: transforms.nested(f, ("dp", 2), ("hp", 2))),
    "nested D over P": (
        mlp_sgd,
        lambda f: transforms.nested(f, ("dp", 2), ("pp", 2), microbatches=2),
    ),
    "nested D over H over P": (
        mlp_sgd,
        lambda f: transforms.nested(
            f, ("dp", 2), ("hp", 2), ("pp", 2), microbatches=2, schedule="1f1b"
        ),
    ),
    "D then H training": (mlp_sgd, lambda f: transforms.data_then_horizontal(f, 2)),
    "H then D training": (mlp_sgd, lambda f: transforms.horizontal_then_data(f, 2)),
    "megatron dp2 tp2": (mlp_sgd, lambda f: transforms.megatron(f, 2, 2, 1)),
    "megatron dp2 pp2": (mlp_sgd, lambda f: transforms.megatron(f, 2, 1, 2, 2)),
    "megatron gpt 2x2x2": (gpt_sgd, lambda f: transforms.megatron(f, 2, 2, 2, 2)),
    "megatron interleaved": (
        lambda: mlp_sgd(4),
        lambda f: transforms.megatron(f, 1, 1, 2, 2, "interleaved", chunks=2),
    ),
    "megatron zero 2": (mlp_sgd, lambda f: transforms.megatron(f, 2, 1, 1, zero=2)),
}


def assert_all_close(got, want, rtol: float = 1e-9) -> None:
    """Equal leaf by leaf (float64 programs: to rounding; float32 ones: ``rtol=1e-5``)."""
    got, want = flat(got), flat(want)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol * 1e-3, err_msg=f"leaf {i}")


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_transformed_programs_lower_and_run_like_the_global_and_sequential_program(name):
    make, transform = PROGRAMS[name]
    f = make()
    g = transform(f)
    u = transforms.unroll_pmap(g)
    ranked = lower_to_ranks(u)
    check_deadlock(ranked)
    seq_inputs = ir.random_inputs(f, 0)
    inputs = ir.distribute(g, seq_inputs, source=f)
    got = run_ranked(ranked, inputs)
    assert_all_close(got, ir.execute(u, inputs))
    # through the step's layouts, the ranks computed the sequential step
    for got_whole, want in zip(ir.collect(g, list(got)), ir.execute(f, seq_inputs)):
        for copy in got_whole if isinstance(got_whole, tuple) else (got_whole,):
            np.testing.assert_allclose(copy, want, rtol=1e-9, atol=1e-12)
    # each rank's program is its class program with its parameters
    for r in ranked.ranks:
        assert ranked.program_for(r).is_equivalent(ranked.programs[r])


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "interleaved"])
def test_a_pipeline_gives_one_program_per_stage_talking_point_to_point(name):
    make, transform = PROGRAMS[name]
    ranked = lower_to_ranks(transforms.unroll_pmap(transform(make())))
    assert ranked.classes == ((0,), (1,))
    kinds = {op.op_type for p in ranked.unique for op in p.ops}
    assert {"SendTo", "RecvFrom"} <= kinds and "RankCollective" not in kinds
    matching = check_deadlock(ranked)
    assert {(s, r) for s, r, _ in matching.messages} == {(0, 1), (1, 0)}  # forward and back


@pytest.mark.parametrize(("dp", "tp", "pp"), [(2, 2, 1), (2, 1, 2), (2, 2, 2), (1, 2, 2)], ids=str)
def test_megatron_rank_classes_are_the_transforms_own(dp, tp, pp):
    g = transforms.megatron(gpt_sgd(), dp, tp, pp, 2)
    ranked = lower_to_ranks(transforms.unroll_pmap(g))
    assert ranked.classes == g.rank_classes
    # a grouped collective is one RankCollective per group: each rank names its own group
    groups = {
        tuple(op.attributes["group"])
        for r in ranked.ranks
        for op in ranked.programs[r].ops
        if op.op_type == "RankCollective"
    }
    assert all(len(group) in (dp, tp) for group in groups)


def test_ranks_that_differ_only_in_slice_offsets_share_one_program():
    f = ir.models.mlp(8, 4, 8, 4, training=True)
    # data parallel by propagation: each rank updates its rows of the weights (Slice)
    g, _ = propagate(f, {"x": (Mesh((4,)), [S(0)])}, inputs="distribute")
    ranked = lower_to_ranks(g)
    assert ranked.num_unique == 1
    (program,) = ranked.unique
    slices = [i for i, op in enumerate(program.ops) if op.op_type == "Slice"]
    assert len(slices) == 2
    for r in ranked.ranks:
        params = ranked.parameters[r]
        assert {i for i, _ in params} == (set(slices) if r else set())
        assert all(program.ops[i].op_type == "Slice" for i, _ in params)
    starts = [ranked.program_for(r).ops[slices[0]].attributes["start"] for r in ranked.ranks]
    assert starts == [0, 2, 4, 6]  # wB's 8 rows, 2 per rank
    inputs = ir.random_inputs(f, 1)
    assert_all_close(run_ranked(ranked, inputs), ir.execute(f, inputs), rtol=1e-5)


def test_a_2x2_mesh_gives_one_program_whose_groups_are_rank_parameters():
    f = ir.models.mlp(8, 4, 6, 4, training=True)
    mesh = Mesh((2, 2))
    g, _ = propagate(f, {"x": (mesh, [S(0), "R"]), "wA": (mesh, ["R", S(1)])}, inputs="distribute")
    ranked = lower_to_ranks(g)
    assert ranked.num_unique == 1
    assert {a for r in ranked.ranks for _, a in ranked.parameters[r]} >= {"group"}
    text = str(ranked)
    assert text.startswith("# ranks [0, 1, 2, 3] (rank parameters: ")
    inputs = ir.random_inputs(f, 2)
    assert_all_close(run_ranked(ranked, inputs), ir.execute(f, inputs), rtol=1e-5)


# -- seed 002: nested pmaps and device map trees -----------------------------------------

GOLDEN = Path(__file__).resolve().parents[1] / "ir" / "golden" / "nested_pmap.txt"
DEEP_MAP = "{1: {1: [1, 5], 3: [3, 7]}, 2: {2: [2, 6], 4: [4, 8]}}"


def seed_002_deep() -> str:
    """Seed 002's nested pmap with a device map tree two levels deep: ``d.1.1`` names the
    second sub-device of ``d``'s second sub-device (device 7 for d = 1)."""
    text = GOLDEN.read_text().replace("{1: [1, 3], 2: [2, 4]}", DEEP_MAP)
    return text.replace(
        "            return ai\n",
        "            moved: Tensor[(4, 6), d.1.1] = Send(ai, to_device=d.1.1)\n"
        "            back: Tensor[(4, 6), d] = Send(moved, to_device=d)\n"
        "            return back\n",
    )


@pytest.mark.parametrize("text", [GOLDEN.read_text(), seed_002_deep()], ids=["d.1", "d.1.1"])
def test_seed_002_nested_programs_simulate_unroll_lower_and_run(text):
    f = ir.parse(text)
    inputs = ir.random_inputs(f, 0)
    (want,) = ir.execute(f, inputs)
    np.testing.assert_allclose(want, inputs[1] @ inputs[0], rtol=1e-5)
    result = ir.simulate(f, ir.Topology.uniform(9))
    assert result.step_time_s > 0
    u = transforms.unroll_pmap(f)
    ranked = lower_to_ranks(u)
    (got,) = run_ranked(ranked, inputs)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    if "d.1.1" in text:
        assert {7, 8} <= set(u.devices)  # the leaves of the tree take part
        assert {7, 8} <= set(ranked.ranks)


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (DEEP_MAP, "{1: [1, 3], 2: [2, 4]}", r"sub-device 1 of device 1 -> 3, .* lists 0"),
        ("3: [3, 7]}", "3: [3]}", r"sub-device 1 of device 1 -> 3, .* lists 1 sub-device"),
    ],
    ids=["map one level deep", "short leaf"],
)
def test_a_device_map_tree_too_shallow_for_its_sub_devices_is_a_type_error(old, new, message):
    f = ir.parse(seed_002_deep().replace(old, new))
    with pytest.raises(ir.DistIRError, match=message):
        ir.simulate(f, ir.Topology.uniform(9))
    with pytest.raises(ir.DistIRError, match=message):
        transforms.unroll_pmap(f)


# -- what cannot lower ------------------------------------------------------------------


def test_a_max_reduction_inside_a_program_is_refused_with_a_reason():
    b = ir.FunctionBuilder("maxed")
    xs = [b.input(f"x{d}", ir.TensorType((2, 3), F64, d)) for d in range(2)]
    m = b.call("Reduce", b.call("MakeTuple", *xs, name="xs"), to_device=0, op="max", name="m")
    f = b.finish([b.call("Relu", m, name="y")])
    with pytest.raises(LoweringError, match="reduction by 'max' inside a program"):
        lower_to_ranks(f)


def test_a_mean_reduction_inside_a_program_runs():
    b = ir.FunctionBuilder("meaned")
    xs = [b.input(f"x{d}", ir.TensorType((2, 3), F64, d)) for d in range(3)]
    m = b.call("Reduce", b.call("MakeTuple", *xs, name="xs"), to_device=1, op="mean", name="m")
    f = b.finish([b.call("Relu", m, name="y")])
    ranked = lower_to_ranks(f)
    inputs = ir.random_inputs(f, 3)
    assert_all_close(run_ranked(ranked, inputs), ir.execute(f, inputs), rtol=1e-5)
    assert len(check_deadlock(ranked).messages) == 2  # ranks 0 and 2 send to rank 1
