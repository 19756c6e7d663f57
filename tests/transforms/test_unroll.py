"""pmap unrolling gives explicit per-device programs with the same results; transformed
programs print in the seeds' syntax and parse back."""

from __future__ import annotations

import pytest
from _parallel_programs import assert_same, model

import ir
from ir.transforms import (
    data_parallel,
    device_programs,
    horizontal_parallel,
    nested,
    pipeline_parallel,
    place,
    unroll_pmap,
)

TRANSFORMED = {
    "dp uneven": lambda f: data_parallel(f, 3),
    "hp": lambda f: horizontal_parallel(f, 2),
    "pp": lambda f: pipeline_parallel(f, 2, 2, "1f1b"),
    "place": lambda f: place(f, {"wB": 1}),
    "D over H": lambda f: nested(f, ("dp", 2), ("hp", 2)),
    "DxHxP": lambda f: nested(f, ("dp", 2), ("hp", 2), ("pp", 2), microbatches=2),
}


def _all_ops(f: ir.Function):
    for op in f.ops:
        yield op
        for sub in op.subfunctions:
            yield from _all_ops(sub)


@pytest.mark.parametrize("how", ["dp uneven", "hp", "D over H", "DxHxP"])
def test_unrolled_has_no_pmap_and_same_results(how: str) -> None:
    f = model("mlp_sgd")
    g = unroll_pmap(TRANSFORMED[how](f))
    assert not any(op.op_type == "Pmap" for op in _all_ops(g))
    assert all(not isinstance(d, ir.DeviceVar) for d in g.devices)
    assert_same(f, g)


def test_unroll_binds_sub_devices_through_the_device_map() -> None:
    g = unroll_pmap(nested(model("mlp"), ("dp", 2), ("hp", 2)))
    scatters = [op for op in g.ops if op.op_type == "Scatter" and op.attributes["dim"] == 1]
    assert sorted(tuple(op.attributes["devices"]) for op in scatters) == [(0, 1), (2, 3)]


def test_device_programs_lists_each_device() -> None:
    view = device_programs(data_parallel(model("mlp"), 2, inputs="distribute"))
    assert set(view) == {"*", "0", "1"}
    assert sum("MatMul" in line for line in view["1"]) == 3
    assert any("Scatter" in line for line in view["*"])
    # a forward steady-state step needs no communication at all
    assert set(device_programs(data_parallel(model("mlp"), 2))) == {"0", "1"}


def test_unroll_of_a_program_without_pmap_is_equivalent() -> None:
    f = model("mlp_sgd")
    assert unroll_pmap(f).is_equivalent(f)


@pytest.mark.parametrize("how", list(TRANSFORMED))
def test_transformed_programs_print_and_parse_back(how: str) -> None:
    g = TRANSFORMED[how](model("mlp_sgd"))
    assert ir.parse(str(g)).is_equivalent(g)
    u = unroll_pmap(g)
    assert ir.parse(str(u)).is_equivalent(u)


def test_transformed_gpt_prints_and_parses_back() -> None:
    g = nested(model("gpt_sgd"), ("dp", 2), ("hp", 2))
    assert ir.parse(str(g)).is_equivalent(g)
