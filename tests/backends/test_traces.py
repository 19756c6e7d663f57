"""A PyTorch profiler (Kineto) trace of a real training step, read into the measured
against simulated view: the trace is made here by torch.profiler on the CPU."""

from __future__ import annotations

import json

import pytest

import ir
from ir import models, transforms

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")

from ir.backends.traces import TraceError, label, profile_step, read_trace  # noqa: E402
from widgets.measured import measured_vs_simulated_spec, op_pairs  # noqa: E402


@pytest.fixture(scope="module")
def step():
    f = transforms.training(models.mlp(32, 64, 128, 16, layers=3), "adam")
    return f, ir.random_inputs(f, seed=0)


def test_a_profiled_step_reads_back_op_for_op(step, tmp_path) -> None:
    f, inputs = step
    path = profile_step(f, inputs, tmp_path / "trace.json", steps=3)
    trace = json.loads(path.read_text())
    # a real Kineto trace: the profiler's own events (aten ops) beside the op ranges
    names = {e.get("name", "") for e in trace["traceEvents"] if isinstance(e, dict)}
    assert any(n.startswith("aten::") for n in names)
    assert label(0, f.ops[0].op_type) in names
    measured = read_trace(path, f)
    assert measured.steps == 3 and measured.devices == (0,)
    events = measured.events
    assert [e.op for e in sorted(events, key=lambda e: e.start_s)] == list(f.ops)  # in order
    assert all(e.dur_s >= 0 for e in events) and measured.step_time_s > 0
    # the ranges nest the aten ops that ran them: the MatMul's range holds an aten::mm
    matmul = next(i for i, op in enumerate(f.ops) if op.op_type == "MatMul")
    (outer,) = [e for e in trace["traceEvents"] if e.get("name") == label(matmul, "MatMul")][:1]
    inside = [
        e
        for e in trace["traceEvents"]
        if str(e.get("name", "")).startswith(("aten::mm", "aten::matmul"))
        and outer["ts"] <= e["ts"] <= outer["ts"] + outer["dur"]
    ]
    assert inside


def test_the_trace_is_drawn_over_the_simulation(step, tmp_path) -> None:
    f, inputs = step
    measured = read_trace(profile_step(f, inputs, tmp_path / "t.json"), f)
    simulated = ir.simulate(f, ir.Topology.preset("cpu", 1))
    traces, layout = measured_vs_simulated_spec(measured, simulated)
    assert layout["title"]["text"].startswith("measured ")
    assert {t["yaxis"] for t in traces if t.get("type") == "bar"} == {"y", "y2"}
    pairs = op_pairs(measured, simulated)
    timed = [op for op in f.ops if ir.registry.get_op(op.op_type).kind.value == "compute"]
    assert len(pairs) == len(timed)  # every compute op of the step paired with its simulation


def test_a_trace_of_something_else_says_what_is_wrong(step, tmp_path) -> None:
    f, _ = step
    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "aten::mm", "ts": 0}]}))
    with pytest.raises(TraceError, match="no 'distir op"):
        read_trace(foreign, f)
    other = tmp_path / "other.json"
    other.write_text(json.dumps([{"ph": "X", "name": label(10_000, "MatMul"), "ts": 0}]))
    with pytest.raises(TraceError, match="another program"):
        read_trace(other, f)
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(TraceError, match="not JSON"):
        read_trace(broken, f)
    with pytest.raises(TraceError, match="one device"):
        profile_step(transforms.data_parallel(f, 2), [], tmp_path / "x.json")


def test_the_dashboard_reads_a_trace_of_the_step_it_shows(step, tmp_path) -> None:
    from workbench import Workbench

    f, inputs = step
    wb = Workbench(f, ir.Topology.preset("cpu", 1))
    path = profile_step(wb.session.current.function, inputs, tmp_path / "step.json", steps=2)
    panel = wb.measure_panel
    panel.trace_path.value = str(path)
    panel.trace_button.click()  # what the browser's click does
    chart, table = panel.output.children
    assert chart.figure_layout["title"]["text"].startswith("measured ")
    assert "read 2 step(s)" in panel.status.value and "error" in table.value.lower()
    panel.trace_path.value = str(tmp_path / "missing.json")
    panel.trace_button.click()
    assert "cannot read the trace" in panel.status.value and panel.output.children == ()


def test_a_trace_is_a_measurement_to_calibrate_with(tmp_path) -> None:
    """``ir.Measurement.from_trace``: the median step a profiler trace holds, ready for
    ``ir.calibrate(..., preset=)``. (This machine's CPU times say nothing of a GPU's, and
    vary with its load: the test checks the plumbing, not the fitted figures.)"""
    steps = []
    for layers in (2, 4):
        f = transforms.training(models.mlp(16, 32, 32, 8, layers=layers), "adam")
        path = profile_step(f, ir.random_inputs(f, seed=0), tmp_path / f"l{layers}.json", steps=3)
        m = ir.Measurement.from_trace(f"mlp {layers} layers", f, path, group="mlp")
        assert m.step_time_s == pytest.approx(read_trace(path, f).step_time_s)
        assert m.program is f and m.group == "mlp"
        steps.append(m)
    fit = ir.calibrate(steps, preset="a100-hgx", factors=("host",))
    assert [r.measured_s for r in fit.rows] == [m.step_time_s for m in steps]
    assert fit.factors.host > 1.0  # a CPU's eager ops are slower than an A100 host's issue
    with pytest.raises(TraceError):  # the 2-layer trace is not a step of the 4-layer program
        ir.Measurement.from_trace("wrong program", steps[1].program, tmp_path / "l2.json")
