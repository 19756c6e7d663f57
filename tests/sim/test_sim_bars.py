"""``SimResult.bars``: the events as numpy columns, row for row."""

from __future__ import annotations

import numpy as np
import pytest
from sim_programs import mlp_data_parallel, mlp_pipeline, nested_pmap_matmul

import ir


@pytest.mark.parametrize(
    "program, devices",
    [(mlp_data_parallel, 3), (mlp_pipeline, 4), (nested_pmap_matmul, 8)],
)
def test_bars_are_the_events_as_columns(program, devices):
    result = ir.simulate(program(), ir.Topology.uniform(devices))
    bars, events = result.bars, result.events
    assert len(bars) == len(events) > 0
    assert list(bars.ops) == [ev.op for ev in events]
    assert bars.device.tolist() == [ev.device for ev in events]
    assert bars.stream.tolist() == [int(ev.stream == "communication") for ev in events]
    for column in ("start_s", "dur_s", "flops", "bytes"):
        np.testing.assert_array_equal(getattr(bars, column), [getattr(ev, column) for ev in events])
    assert (bars.stream == 1).any() and (bars.stream == 0).any()


def test_a_collective_gives_one_bar_per_participant():
    result = ir.simulate(mlp_data_parallel(2), ir.Topology.uniform(3))
    comm = result.bars.stream == 1
    ops = [op for op, c in zip(result.bars.ops, comm) if c]
    for op in set(ops):
        where = result.bars.device[comm][[o is op for o in ops]]
        assert len(where) == len(set(where.tolist())) >= 2


@pytest.mark.parametrize(
    "program, devices",
    [(mlp_data_parallel, 3), (mlp_pipeline, 4), (nested_pmap_matmul, 8)],
)
def test_each_bar_knows_the_top_level_op_it_ran_under(program, devices):
    f = program()
    result = ir.simulate(f, ir.Topology.uniform(devices))
    bars = result.bars
    assert bars.top is not None and len(bars.top) == len(bars)
    inside: dict[ir.Op, set[int]] = {}  # every op of a body, with the pmaps it is in

    def walk(op: ir.Op, k: int) -> None:
        inside.setdefault(op, set()).add(k)
        for body in op.subfunctions:
            for inner in body.ops:
                walk(inner, k)

    for k, op in enumerate(f.ops):
        walk(op, k)
    for op, top in zip(bars.ops, bars.top.tolist()):
        assert top in inside[op]  # the op itself, or a pmap whose body holds it
    assert any(f.ops[k].op_type == "Pmap" for k in bars.top.tolist()) == any(
        op.op_type == "Pmap" for op in f.ops
    )
