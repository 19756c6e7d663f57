"""The top-level walk's shared records (ir/sim/walk.py) give what the general walk gives.

Every program is simulated twice: as ``ir.simulate`` does (top-level ops share one
record per identity or structure of their types and attributes) and with
``shared_records=False`` (each op prepared on its own, as in a pmap body). Every
observable must be equal: step time, events, bars, memory curves, peaks, errors.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import sim_programs as programs
from hypothesis import given, settings
from seed_mlp_texts import DATA_PARALLEL
from test_sim_properties import build, link_bandwidths, topology
from test_sim_properties import programs as random_programs

import ir
from ir import models, registry
from ir.sharding import propagate
from ir.sharding.mesh import Mesh, R, Shard
from ir.sim import SimResult, SimulationError
from ir.sim.engine import Engine, paused_gc


def _simulate(
    f: ir.Function, topo: ir.Topology, combine: str, shared: bool, comm: str = "channels"
) -> SimResult:
    engine = Engine(topo, combine, comm=comm, shared_records=shared)
    with paused_gc():
        engine.run(f)
    return SimResult(engine)


def _observed(r: SimResult) -> dict:
    bars = r.bars
    return {
        "step": r.step_time_s,
        "devices": r.devices,
        "num_ops": r.num_ops,
        "events": [
            (
                ev.op,
                ev.device,
                ev.stream,
                ev.channel,
                ev.start_s,
                ev.dur_s,
                ev.flops,
                ev.bytes,
                ev.kind,
            )
            for ev in r.events
        ],
        "bars": (
            bars.ops,
            *(
                (a.dtype.str, a.tolist())
                for a in (
                    bars.device,
                    bars.stream,
                    bars.start_s,
                    bars.dur_s,
                    bars.flops,
                    bars.bytes,
                )
            ),
        ),
        "memory": {d: [a.tolist() for a in r.memory_timeline(d)] for d in r.devices},
        "peaks": r.peak_memory_bytes,
        "oom": r.oom,
        "over": r.over_capacity,
        "busy": (r.busy_s, r.communication_s, r.idle_s),
    }


def assert_same_results(f: ir.Function, topo: ir.Topology) -> SimResult:
    for combine, comm in (
        ("roofline", "serial"),
        ("additive", "channels"),
        ("roofline", "channels"),
    ):
        shared = _simulate(f, topo, combine, shared=True, comm=comm)
        general = _simulate(f, topo, combine, shared=False, comm=comm)
        assert _observed(shared) == _observed(general)
    return shared


def _gpt(mesh_shape: tuple[int, ...], training: bool = False) -> ir.Function:
    f = models.gpt(batch=8, seq=32, hidden=64, heads=4, vocab=128, layers=2, training=training)
    mesh = Mesh(mesh_shape, tuple(range(8)))
    placements = (Shard(0),) + (R,) * (len(mesh_shape) - 1)
    topo = ir.Topology.preset("a100-hgx", 8)
    return propagate(f, {"tokens": (mesh, placements)}, topology=topo)[0]


@pytest.mark.parametrize("mesh_shape", [(8,), (2, 4), (1, 8)])
def test_a_propagated_gpt_gives_the_same_results(mesh_shape):
    f = _gpt(mesh_shape)
    result = assert_same_results(f, ir.Topology.preset("a100-hgx", 8))
    assert len(result.devices) == 8 and (result.bars.stream == 1).any()


def test_a_propagated_training_step_gives_the_same_results():
    assert_same_results(_gpt((2, 4), training=True), ir.Topology.preset("a100-hgx", 8))


@pytest.mark.parametrize(
    "program",
    [
        programs.mlp_sequential,
        programs.mlp_data_parallel,  # pmap bodies, tuple values, collectives
        programs.mlp_horizontal,
        programs.mlp_pipeline,
        programs.nested_pmap_matmul,
        lambda: programs.uniform_pipeline(4, 8),
    ],
)
@pytest.mark.parametrize("memory_bytes", [80e9, 2e4])  # the small one runs out of memory
def test_the_seed_programs_give_the_same_results(program, memory_bytes):
    topo = ir.Topology.uniform(8, memory_bytes=memory_bytes)
    result = assert_same_results(program(), topo)
    if memory_bytes < 1e5:
        assert result.over_capacity


@settings(max_examples=40, deadline=None)
@given(random_programs, link_bandwidths)
def test_random_programs_give_the_same_results(instructions, bandwidths):
    assert_same_results(build(instructions), topology(bandwidths, [1e-6] * 16))


def test_ops_sharing_types_but_not_attributes_are_costed_apart(monkeypatch):
    """One type object for every value, a cost that depends on an attribute's value."""
    old = registry.get_op("Scale")
    rule = lambda c: registry.Cost(flops=1e9 * c.attributes["factor"])  # noqa: E731
    new = replace(old, cost_rule=rule)
    monkeypatch.setitem(registry._REGISTRY, old.name, new)
    for key in (old.name, *old.aliases):
        monkeypatch.setitem(registry._LOOKUP, key.lower(), new)
    b = ir.FunctionBuilder("f")
    x = b.input("x", ir.TensorType((64, 64), device=0))
    ys = [b.call("Scale", x, factor=k) for k in (1.0, 2.0, 2.0, 3.0)]
    result = assert_same_results(b.finish(ys), ir.Topology.uniform(1, peak_flops=1e12))
    assert result.bars.flops.tolist() == [1e9, 2e9, 2e9, 3e9]


def _errors(f: ir.Function, topo: ir.Topology) -> list[str]:
    messages = []
    for shared in (True, False):
        with pytest.raises(SimulationError) as err:
            _simulate(f, topo, "roofline", shared)
        messages.append(str(err.value))
    return messages


def test_bad_programs_give_the_same_errors():
    shared, general = _errors(ir.parse(DATA_PARALLEL), ir.Topology.uniform(2))
    assert shared == general and "not in topology" in shared

    b = ir.FunctionBuilder("f")
    c = b.call("Constant", value=1.0, shape=(4, 4), device=5, name="c")
    shared, general = _errors(b.finish([b.call("Relu", c)]), ir.Topology.uniform(2))
    assert shared == general and "device 5 used by Constant" in shared

    b = ir.FunctionBuilder("f")
    x = b.input("x", ir.TensorType((4, 4), device=0))
    shared, general = _errors(b.finish([b.call("Send", x, to_device=3)]), ir.Topology.uniform(2))
    assert shared == general and "device 3" in shared


def test_bars_stay_columns_of_numbers():
    bars = _simulate(_gpt((2, 4)), ir.Topology.preset("a100-hgx", 8), "roofline", True).bars
    assert bars.device.dtype == np.int64 and bars.stream.dtype == np.int8
    assert len(bars.ops) == len(bars.start_s) == len(bars.flops)


def test_a_result_keeps_no_table_keyed_by_the_ids_of_the_programs_objects():
    # the ids could be reused by new objects once the program is gone
    f = _gpt((2, 4))
    engine = _simulate(f, ir.Topology.preset("a100-hgx", 8), "roofline", shared=True)._e
    assert engine.inst_op  # it ran
    assert not engine._records_by_identity
    assert not engine._type_descriptors
    assert not engine._attribute_keys
