"""The dashboard's "Measure": the step shown runs on real gloo processes (2 here, tiny
tensors), its measured timeline is drawn over the simulated one with the error table, and
a step too big for this machine is refused with the reason."""

from __future__ import annotations

import html
import re

import pytest

import ir
from ir import models
from widgets.measured_table import error_table_html, op_type_errors
from widgets.units import format_time
from workbench import Workbench
from workbench.measuring import MAX_BYTES_PER_RANK, measure_step, why_not_measured

pytest.importorskip("torch.distributed", reason="torch is not installed (pip install torch)")

CPU = ir.Topology.preset("cpu", 4)


@pytest.fixture(scope="module")
def measured_dp() -> Workbench:
    wb = Workbench(models.mlp(16, 8, 8, 4, layers=2, training=True), CPU)
    assert wb.set_strategy(dp=2)
    panel = wb.measure_panel
    panel.topology = CPU
    panel.steps.value = 2
    panel.button.click()  # what a click in the browser does: a task of the kernel
    task = wb.activity.task
    assert task is not None and wb.activity.busy and panel.button.disabled
    assert "distir-cancel" in wb.activity.children[-1]._dom_classes  # Cancel is offered
    task.join(300)
    assert not wb.activity.busy and not panel.button.disabled
    return wb


def test_the_button_measures_the_step_shown_on_two_processes(measured_dp) -> None:
    run = measured_dp.measure_panel.run
    step = measured_dp.session.current.function
    assert run is not None and run.carried and run.topology is CPU
    assert run.measured.devices == (0, 1) and run.measured.steps == 2
    assert sorted(run.measured.programs) == sorted(step.devices)
    # every op of each rank's program timed, the gradients' all-reduce among them
    kinds = {e.op.attributes.get("kind") for e in run.measured.events if e.stream != "compute"}
    assert kinds == {"allreduce"}
    assert run.simulated.devices == (0, 1)
    # the step's ops were profiled on this machine and the step simulated with them
    assert run.profiled is not None and run.compared is run.profiled
    assert run.profiled.step_time_s != run.simulated.step_time_s
    status = measured_dp.measure_panel.status.value
    assert "2 gloo processes" in status and "state carried" in status
    assert "profiled op costs" in status


def test_the_overlay_and_the_error_table_are_shown(measured_dp) -> None:
    run = measured_dp.measure_panel.run
    summary, chart, memory_chart, table = measured_dp.measure_panel.output.children
    figure, memory = chart.to_figure(), memory_chart.to_figure()
    # the step error both ways, in one line above the charts
    assert summary.value == f"<p>{html.escape(run.summary())}</p>"
    for sim in (run.profiled, run.simulated):
        assert f"simulated {sim.step_time_s * 1e3:.2f} ms" in summary.value
    assert {t.yaxis for t in figure.data} == {"y", "y2"}  # measured above simulated
    assert figure.layout.title.text.startswith("measured ")
    # per device a measured and a simulated live-bytes curve, their peaks as measured
    assert [t.name for t in memory.data] == [
        f"{kind}: device {d}" for d in (0, 1) for kind in ("measured", "simulated")
    ]
    for row in memory.layout.meta["devices"]:
        d = row["device"]
        assert row["measured_peak_bytes"] == run.measured.peak_memory_bytes[d] > 0
        assert row["simulated_peak_bytes"] == run.compared.peak_memory_bytes[d]
    text = table.value
    assert f"<td>{format_time(run.measured.step_time_s)}</td>" in text
    assert "device 0 busy" in text and "device 1 busy" in text
    assert "device 1 peak live bytes" in text
    rows = op_type_errors(run.measured, run.compared)
    assert {r.name for r in rows} >= {"MatMul", "allreduce"}
    for r in rows:
        assert r.count > 0 and r.measured_s > 0
        assert f"{r.name} x{r.count}" in text
    assert text == error_table_html(run.measured, run.compared)


def test_a_step_over_more_than_four_devices_is_not_measured() -> None:
    wb = Workbench(models.mlp(16, 8, 8, 4, layers=2), ir.Topology.preset("a100-hgx", 8))
    assert wb.set_strategy(dp=8)
    assert wb.measure(CPU) is None
    assert wb.measure_panel.run is None and wb.measure_panel.output.children == ()
    assert re.search(r"not measured: it uses 8 devices.*at most 4", wb.measure_panel.status.value)


def test_a_step_too_big_for_a_process_is_refused_before_it_runs() -> None:
    source = models.mlp(64, 8192, 8192, 8, layers=2)  # 2 x 256 MiB of float32 weights
    result = ir.simulate(source, CPU)
    assert max(result.peak_memory_bytes.values()) > MAX_BYTES_PER_RANK
    reason = why_not_measured(source, result)
    assert reason is not None and "simulated peak memory" in reason
    with pytest.raises(ir.errors.DistIRError, match="is not measured: a device's simulated peak"):
        measure_step(source, source, CPU)


def test_an_annotated_step_is_measured_with_its_state_carried_as_training_runs() -> None:
    """The propagated step the dashboard shows after a click, measured: warm-up 1 + 2 timed
    steps with the weights carried equal 3 steps of the sequential training program."""
    import numpy as np

    from ir.backends.torch_ranked import carry_of
    from ir.sharding import Mesh, S

    source = models.mlp(16, 8, 8, 4, layers=2, training=True)
    wb = Workbench(source, ir.Topology.preset("a100-hgx", 2))
    assert wb.annotate("x", (Mesh((2,)), [S(0)]))
    wb.measure_panel.steps.value = 2
    run = wb.measure(CPU)
    assert run is not None and run.carried and run.measured.devices == (0, 1)
    inputs = ir.random_inputs(source, seed=0)  # what measure_step runs on
    names = [v.name for v in source.inputs]
    for _ in range(3):
        want = ir.execute(source, inputs)
        for index, name in carry_of(source).items():
            inputs[names.index(name)] = want[index]
    got = ir.collect(wb.session.current.function, list(run.measured.outputs))
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-6)


def test_cancel_stops_a_measurement_and_its_processes() -> None:
    import multiprocessing
    import time

    wb = Workbench(models.mlp(16, 8, 8, 4, layers=2, training=True), CPU)
    assert wb.set_strategy(dp=2)
    wb.measure_panel.topology = CPU
    wb.measure_panel.steps.value = 20
    wb.measure_panel.steps.max = 100_000
    wb.measure_panel.steps.value = 100_000  # far longer than the test waits
    before = set(multiprocessing.active_children())
    wb.measure_panel.button.click()
    task = wb.activity.task
    deadline = time.monotonic() + 30
    while not set(multiprocessing.active_children()) - before and time.monotonic() < deadline:
        time.sleep(0.05)  # until the worker processes run
    assert task.running and set(multiprocessing.active_children()) - before
    wb.activity.cancel_button.click()  # what the browser's click on Cancel does
    task.join(60)
    assert not task.running and task.cancelled
    assert isinstance(task.error, KeyboardInterrupt)
    assert wb.measure_panel.run is None
    assert "cancelled" in wb.measure_panel.status.value
    assert not wb.activity.busy and not wb.measure_panel.button.disabled
    deadline = time.monotonic() + 10
    while set(multiprocessing.active_children()) - before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert set(multiprocessing.active_children()) - before == set()  # the workers stopped
