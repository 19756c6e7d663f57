"""Memory by liveness: timelines, peaks, capacity flags, per-device tuple elements."""

from __future__ import annotations

import numpy as np
import pytest
from seed_mlp_texts import DATA_PARALLEL, HORIZONTAL, PIPELINE, SEQUENTIAL

import ir
from ir import FunctionBuilder, TensorType
from ir.sim.clock import on_clock

KB = 64 * 64 * 4  # bytes of one 64 x 64 float32 tensor


def chain() -> ir.Function:
    """x -> a = Relu(x) -> b = Relu(a) -> c = Relu(b); returns c."""
    bld = FunctionBuilder("chain")
    x = bld.input("x", TensorType((64, 64), device=0))
    a = bld.call("Relu", x, name="a")
    b = bld.call("Relu", a, name="b")
    c = bld.call("Relu", b, name="c")
    return bld.finish([c])


def test_liveness_of_a_chain_by_hand():
    topology = ir.Topology.uniform(1, peak_flops=1e12, mem_bandwidth_bytes_per_s=1e11)
    result = ir.simulate(chain(), topology)
    t = on_clock(2 * KB / 1e11)  # each Relu reads and writes one tensor (engine's clock)
    times, live = result.memory_timeline(0)
    # x resident from 0; a allocated at 0; b at t (a freed at 2t, after b's op);
    # c at 2t; b freed at 3t; c (an output) stays to the end.
    np.testing.assert_allclose(times, [0, t, 2 * t, 3 * t], rtol=1e-12)
    np.testing.assert_array_equal(live, [2 * KB, 3 * KB, 3 * KB, 2 * KB])
    assert result.peak_memory_bytes == {0: 3 * KB}
    assert result.oom == {} and not result.oom  # fits: nothing to report


@pytest.mark.parametrize("text", [SEQUENTIAL, DATA_PARALLEL, HORIZONTAL, PIPELINE])
def test_the_peak_of_each_memory_curve_is_the_reported_peak(text):
    result = ir.simulate(ir.parse(text), ir.Topology.uniform(3))
    for device in result.devices:
        times, live = result.memory_timeline(device)
        assert len(times) == len(live) and np.all(np.diff(times) > 0)
        assert times[0] == 0 and times[-1] == pytest.approx(result.step_time_s)
        assert live.max() == result.peak_memory_bytes[device]
        assert live.min() >= 0


def test_inputs_stay_resident_and_outputs_stay_live_to_the_end():
    f = ir.parse(SEQUENTIAL)
    result = ir.simulate(f, ir.Topology.uniform(1))
    _, live = result.memory_timeline(0)
    inputs = sum(v.type.size_bytes for v in f.inputs)
    outputs = sum(v.type.size_bytes for v in f.outputs)
    first = sum(v.type.size_bytes for v in f.ops[0].outputs)
    assert live[0] == inputs + first  # at time 0 the first op has allocated its result
    assert live[-1] == inputs + outputs  # every activation and gradient freed
    assert live.min() >= inputs


def test_an_unused_result_is_freed_when_its_op_ends():
    # MatMulGrad's second result (the seed's `_`) is read by no one
    f = ir.parse(SEQUENTIAL)
    result = ir.simulate(f, ir.Topology.uniform(1))
    last = [ev for ev in result.events if ev.op.op_type == "MatMulGrad"][-1]
    times, live = result.memory_timeline(0)
    during = live[np.searchsorted(times, last.start_s, side="right") - 1]
    after = live[np.searchsorted(times, last.end_s, side="right") - 1]
    unused = last.op.outputs[1].type.size_bytes
    assert during - after >= unused


def test_tuple_elements_count_on_their_own_devices():
    bld = FunctionBuilder("scatter")
    x = bld.input("x", TensorType((64, 64), device=0))
    xs = bld.call("Scatter", x, dim=0, devices=[1, 2])
    f = bld.finish([xs])
    result = ir.simulate(f, ir.Topology.uniform(3))
    assert result.peak_memory_bytes == {0: KB, 1: KB / 2, 2: KB / 2}


def test_optimizer_state_is_counted():
    bld = FunctionBuilder("adam")
    w = bld.input("w", TensorType((64, 64), device=0))
    dw = bld.input("dw", TensorType((64, 64), device=0))
    m = bld.input("m", TensorType((64, 64), device=0))
    v = bld.input("v", TensorType((64, 64), device=0))
    f = bld.finish(list(bld.call("Adam", w, dw, m, v)))
    result = ir.simulate(f, ir.Topology.uniform(1))
    assert result.peak_memory_bytes[0] == 7 * KB  # w, dw, m, v and the new w, m, v


def test_the_op_that_exceeds_capacity_is_flagged():
    topology = ir.Topology.uniform(1, memory_bytes=2.5 * KB)
    f = chain()
    result = ir.simulate(f, topology)
    # x and a fit (2 KB); b's allocation makes 3 KB
    assert result.oom == {0: f.ops[1]}
    assert result.over_capacity == (0,)
    if not result.oom:  # the documented test: true when a device runs out
        raise AssertionError("result.oom is falsy although device 0 runs out")
    roomy = ir.simulate(f, ir.Topology.uniform(1, memory_bytes=3 * KB))
    assert roomy.oom == {} and roomy.over_capacity == ()
    assert roomy.oom.get(0) is None


def test_oom_names_only_the_devices_that_run_out():
    # two devices, only device 1's chain is long enough to exceed 2.5 KB
    b = ir.FunctionBuilder("two")
    x0 = b.input("x0", ir.TensorType((KB // 4,), ir.DType.float32, 0))
    x1 = b.input("x1", ir.TensorType((KB // 4,), ir.DType.float32, 1))
    y0 = b.call("Relu", x0, name="y0")
    a1 = b.call("Relu", x1, name="a1")
    b1 = b.call("Relu", a1, name="b1")
    c1 = b.call("Relu", b1, name="c1")
    f = b.finish([y0, c1])
    result = ir.simulate(f, ir.Topology.uniform(2, memory_bytes=2.5 * KB))
    assert result.over_capacity == (1,)
    assert list(result.oom) == [1] and result.oom[1].outputs[0].name == "b1"


def test_a_device_the_program_does_not_use_has_no_timeline():
    result = ir.simulate(chain(), ir.Topology.uniform(2))
    assert result.devices == (0,)
    with pytest.raises(ir.DistIRError, match="does not use device 1"):
        result.memory_timeline(1)
