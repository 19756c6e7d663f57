"""The vectorised memory curves (ir/sim/memory.py) equal a plain event-by-event sweep.

The sweep below is the documented rule written out directly: a slot is allocated
when its producer starts (function inputs at 0) and freed when its last reader
ends (or its producer, if nothing reads it), pinned slots never; at equal times
frees come before allocations, otherwise events keep their order.
"""

from __future__ import annotations

import pytest
import sim_programs as programs
from hypothesis import given, settings
from test_sim_properties import build, link_bandwidths, topology
from test_sim_properties import programs as random_programs
from test_sim_walk import gpt as _gpt

import ir
from ir.sim import SimResult
from ir.sim.engine import Engine


def _result(f: ir.Function, topo: ir.Topology) -> SimResult:
    engine = Engine(topo, share_bodies=False)  # every op run a unit, read below
    engine.run(f)
    return SimResult(engine)


def swept(result: SimResult) -> dict[int, tuple[list[float], list[float], float, object]]:
    """Device id -> (times, live bytes, peak, op over capacity or None), event by event."""
    e = result._e
    ends = e.inst_end
    last: dict[int, float] = {}
    k = 0
    for i, count in enumerate(e.use_count):
        for s in e.use_slots[k : k + count]:
            last[s] = max(last.get(s, -1.0), ends[i])
        k += count
    pinned = set(e.pinned)
    allocs, frees = [], []
    for s, (size, dev, producer) in enumerate(zip(e.slot_bytes, e.slot_device, e.slot_producer)):
        made = producer >= 0
        allocs.append((dev, e.inst_start[producer] if made else 0.0, 1, float(size), producer))
        if s not in pinned:
            free = last.get(s, ends[producer] if made else 0.0)
            frees.append((dev, free, 0, -float(size), -1))
    events = sorted(
        enumerate(allocs + frees), key=lambda item: (item[1][0], item[1][1], item[1][2], item[0])
    )
    out = {}
    ids = result.topology.device_ids
    for d in result._used:
        mine = [ev for _, ev in events if ev[0] == d]
        capacity = result.topology.devices[d].memory_bytes
        times: list[float] = []
        levels: list[float] = []
        level, oom, crossed = 0.0, None, False
        for j, (_, t, _, delta, _) in enumerate(mine):
            level += delta
            if level > capacity and not crossed:
                crossed = True
                later = [ev[4] for ev in mine[j:] if ev[4] >= 0]
                oom = later[0] if later else -1
            if times and times[-1] == t:
                levels[-1] = level
            else:
                times.append(t)
                levels.append(level)
        if not times or times[0] > 0:
            times.insert(0, 0.0)
            levels.insert(0, 0.0)
        if times[-1] < result.step_time_s:
            times.append(result.step_time_s)
            levels.append(levels[-1])
        levels = [max(x, 0.0) for x in levels]
        if oom is not None and oom >= 0:
            oom = e.inst_op[oom]
        elif oom == -1:
            first = [i for i, where in enumerate(e.inst_where) if where == d]
            oom = e.inst_op[first[0]] if first else None
        out[ids[d]] = (times, levels, max(levels), oom)
    return out


def assert_curves_match(result: SimResult) -> None:
    expected = swept(result)
    assert set(expected) == set(result.devices)
    for device, (times, levels, peak, oom) in expected.items():
        got_times, got_levels = result.memory_timeline(device)
        assert got_times.tolist() == times
        assert got_levels.tolist() == levels
        assert result.peak_memory_bytes[device] == peak
        assert result.oom.get(device) is oom
        assert (device in result.oom) == (device in result.over_capacity)


@pytest.mark.parametrize(
    "program",
    [
        programs.mlp_sequential,
        programs.mlp_data_parallel,
        programs.mlp_horizontal,
        programs.mlp_pipeline,
        programs.nested_pmap_matmul,
        lambda: programs.uniform_pipeline(4, 8),
    ],
)
@pytest.mark.parametrize("memory_bytes", [80e9, 2e4, 1e3])  # the small ones run out
def test_seed_programs_match_the_sweep(program, memory_bytes):
    assert_curves_match(_result(program(), ir.Topology.uniform(8, memory_bytes=memory_bytes)))


def test_a_propagated_gpt_matches_the_sweep():
    result = _result(_gpt((2, 4), training=True), ir.Topology.preset("a100-hgx", 8))
    assert_curves_match(result)


@settings(max_examples=40, deadline=None)
@given(random_programs, link_bandwidths)
def test_random_programs_match_the_sweep(instructions, bandwidths):
    assert_curves_match(_result(build(instructions), topology(bandwidths, [1e-6] * 16)))
