"""Bad input gets errors that name what is wrong; the Chrome trace is well formed."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from seed_mlp_texts import DATA_PARALLEL, SEQUENTIAL

import ir
from ir import registry
from ir.sim import SimulationError


def test_a_device_the_topology_lacks_is_named_with_its_op():
    f = ir.parse(DATA_PARALLEL)  # devices 0, 1, 2
    with pytest.raises(SimulationError, match=r"device 2 .*Scatter.*not in topology") as err:
        ir.simulate(f, ir.Topology.uniform(2))
    assert "xs" in str(err.value)  # the printed op


def test_an_input_on_a_missing_device_is_named():
    f = ir.parse(SEQUENTIAL)
    with pytest.raises(SimulationError, match=r"input 'wA' .* device 0"):
        ir.simulate(f, ir.Topology.uniform(2, first_id=1))


def test_a_compute_op_on_a_missing_device_is_named():
    b = ir.FunctionBuilder("f")
    c = b.call("Constant", value=1.0, shape=(4, 4), device=5, name="c")
    f = b.finish([b.call("Relu", c)])
    with pytest.raises(SimulationError, match=r"device 5 used by Constant .*\n  in: c: "):
        ir.simulate(f, ir.Topology.uniform(2))


@pytest.mark.parametrize("bandwidth", [0.0, -1e9])
def test_a_topology_with_a_non_positive_bandwidth_is_refused(bandwidth):
    good = ir.Topology.uniform(2)
    bw = ((0.0, bandwidth), good.bandwidth_bytes_per_s[1])
    with pytest.raises(ir.TopologyError, match=r"link 0 -> 1 has bandwidth"):
        replace(good, bandwidth_bytes_per_s=bw)
    with pytest.raises(ir.TopologyError, match=r"bandwidth"):
        ir.Topology.uniform(2, link_bandwidth_bytes_per_s=bandwidth)


def _without(monkeypatch, name: str, **changes) -> None:
    """Replace the registry record of ``name`` for the duration of one test."""
    old = registry.get_op(name)
    new = replace(old, **changes)
    monkeypatch.setitem(registry._REGISTRY, old.name, new)
    for key in (old.name, *old.aliases):
        monkeypatch.setitem(registry._LOOKUP, key.lower(), new)


def test_an_op_without_a_cost_rule_is_named(monkeypatch):
    _without(monkeypatch, "Relu", cost_rule=None)
    b = ir.FunctionBuilder("f")
    f = b.finish([b.call("Relu", b.input("x", ir.TensorType((4, 4), device=0)))])
    with pytest.raises(SimulationError, match=r"op Relu has no cost rule"):
        ir.simulate(f, ir.Topology.uniform(1))


def test_a_communication_op_without_a_comm_rule_is_named(monkeypatch):
    _without(monkeypatch, "Send", comm_rule=None)
    b = ir.FunctionBuilder("f")
    x = b.input("x", ir.TensorType((4, 4), device=0))
    f = b.finish([b.call("Send", x, to_device=1)])
    with pytest.raises(SimulationError, match=r"Send has no comm_rule"):
        ir.simulate(f, ir.Topology.uniform(2))


def test_an_unknown_combine_mode_is_refused():
    with pytest.raises(SimulationError, match="combine must be one of roofline, additive"):
        ir.simulate(ir.parse(SEQUENTIAL), ir.Topology.uniform(1), combine="max")


def test_an_unknown_preset_lists_the_presets():
    with pytest.raises(ir.TopologyError, match="a100-hgx"):
        ir.Topology.preset("tpu-v9", 4)


def test_chrome_trace_is_json_with_one_process_per_device_and_one_thread_per_stream():
    result = ir.simulate(ir.parse(DATA_PARALLEL), ir.Topology.preset("a100-hgx", 3), comm="serial")
    trace = json.loads(json.dumps(result.to_chrome_trace()))
    events = trace["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == len(result.events)
    for e, ev in zip(complete, result.events):
        assert e["pid"] == ev.device
        assert e["tid"] == {"compute": 0, "communication": 1}[ev.stream]
        assert e["ts"] == pytest.approx(ev.start_s * 1e6)
        assert e["dur"] == pytest.approx(ev.dur_s * 1e6)
        assert e["name"] == ev.op.op_type and e["args"]["op"] == ev.label
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert names == {
        (d, t): s for d in (0, 1, 2) for t, s in enumerate(["compute", "communication"])
    }
    counters = [e for e in events if e["ph"] == "C"]
    assert {e["pid"] for e in counters} == {0, 1, 2}
    peak = max(e["args"]["live_bytes"] for e in counters if e["pid"] == 1)
    assert peak == result.peak_memory_bytes[1]


def test_chrome_trace_gives_each_communication_channel_of_a_device_its_own_thread():
    result = ir.simulate(ir.parse(DATA_PARALLEL), ir.Topology.preset("a100-hgx", 3))
    events = result.to_chrome_trace()["traceEvents"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    complete = [e for e in events if e["ph"] == "X"]
    for e, ev in zip(complete, result.events):
        want = "compute" if ev.stream == "compute" else f"comm {ev.channel}"
        assert names[(e["pid"], e["tid"])] == want
    channels = {ev.channel for ev in result.events if ev.stream == "communication"}
    assert channels and all(c.startswith(("send ", "group ")) for c in channels)
    for device in (0, 1, 2):  # tids 1, 2, ... one per channel the device uses
        tids = sorted(t for d, t in names if d == device and t > 0)
        assert tids == list(range(1, len(tids) + 1))


def test_an_unknown_comm_mode_is_refused():
    with pytest.raises(SimulationError, match="comm must be one of channels, serial"):
        ir.simulate(ir.parse(SEQUENTIAL), ir.Topology.uniform(1), comm="fifo")


def test_events_carry_op_label_flops_and_bytes():
    result = ir.simulate(ir.parse(SEQUENTIAL), ir.Topology.uniform(1))
    first = result.events[0]
    assert first.op.op_type == "MatMul" and first.kind == "compute"
    assert first.label.startswith("a: Tensor[(64, 48), 0] = MatMul(x, wA)")
    assert first.flops == 2 * 64 * 48 * 32
    assert first.bytes == (64 * 32 + 32 * 48 + 64 * 48) * 4
