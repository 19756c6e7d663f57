"""The simulator's one walk (top level and pmap bodies alike): ops that share types are
still costed by their own attributes, bad programs are refused with the op named, and
the result keeps columns of numbers."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from seed_mlp_texts import DATA_PARALLEL

import ir
from ir import models, registry
from ir.sharding import propagate
from ir.sharding.mesh import Mesh, R, Shard
from ir.sim import SimulationError


def gpt(mesh_shape: tuple[int, ...], training: bool = False) -> ir.Function:
    """A 2-layer GPT propagated over 8 devices by its tokens split on the first mesh axis."""
    f = models.gpt(batch=8, seq=32, hidden=64, heads=4, vocab=128, layers=2, training=training)
    mesh = Mesh(mesh_shape, tuple(range(8)))
    placements = (Shard(0),) + (R,) * (len(mesh_shape) - 1)
    topo = ir.Topology.preset("a100-hgx", 8)
    return propagate(f, {"tokens": (mesh, placements)}, topology=topo)[0]


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
    result = ir.simulate(b.finish(ys), ir.Topology.uniform(1, peak_flops=1e12))
    assert result.bars.flops.tolist() == [1e9, 2e9, 2e9, 3e9]


def _error(f: ir.Function, topo: ir.Topology) -> str:
    with pytest.raises(SimulationError) as err:
        ir.simulate(f, topo)
    return str(err.value)


def test_bad_programs_are_refused_with_the_device_and_op():
    assert "not in topology" in _error(ir.parse(DATA_PARALLEL), ir.Topology.uniform(2))

    b = ir.FunctionBuilder("f")
    c = b.call("Constant", value=1.0, shape=(4, 4), device=5, name="c")
    message = _error(b.finish([b.call("Relu", c)]), ir.Topology.uniform(2))
    assert "device 5 used by Constant" in message

    b = ir.FunctionBuilder("f")
    x = b.input("x", ir.TensorType((4, 4), device=0))
    assert "device 3" in _error(b.finish([b.call("Send", x, to_device=3)]), ir.Topology.uniform(2))


@pytest.mark.parametrize("mesh_shape", [(8,), (2, 4), (1, 8)])
def test_a_propagated_gpt_keeps_columns_of_numbers(mesh_shape):
    result = ir.simulate(gpt(mesh_shape, training=True), ir.Topology.preset("a100-hgx", 8))
    bars = result.bars
    assert bars.device.dtype == np.int64 and bars.stream.dtype == np.int8
    assert len(bars.ops) == len(bars.start_s) == len(bars.flops)
    assert len(result.devices) == 8 and (bars.stream == 1).any()
