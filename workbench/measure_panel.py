"""The dashboard's measure panel: run the program shown on real processes, and compare.

"Measure" runs the dashboard's current distributed step on one gloo process per
device of this CPU (:func:`workbench.measuring.measure_step`: lowered to ranks,
training state carried between steps) when it is small enough, and otherwise says
why not. It shows the measured Gantt chart above the simulated one on one time axis
(:func:`widgets.measured.measured_vs_simulated_figure`), each rank's live bytes
against the simulator's memory curve (:func:`widgets.measured_memory.measured_memory_figure`)
and the error table: step,
per device, per op type (:func:`widgets.measured_table.error_table_html`). The
simulation is on this machine's calibrated topology (calibrated once, on the first
measurement, unless a topology is given), not the dashboard's hardware, with the
step's ops profiled on this machine (``MeasuredRun.profiled``); a line above the
charts gives the step error with the profiled costs and with the topology's models.
:meth:`MeasurePanel.measure` does what a click does, for code and tests.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import ipywidgets as w

from ir.device import Topology
from ir.errors import DistIRError
from widgets.chart import Chart
from widgets.measured import measured_vs_simulated_figure
from widgets.measured_memory import measured_memory_figure
from widgets.measured_table import error_table_html

from .measuring import MAX_PROCESSES, MeasuredRun, measure_step, why_not_measured
from .tasks import Activity, Task


class MeasurePanel(w.VBox):
    """A "Measure" button, its steps, a status line, and the overlay and table below.

    ``current()`` returns ``(source, step, simulated)``: the sequential program, the
    distributed step the dashboard shows, and its simulation (for the size check).
    ``topology`` (default: calibrated on the first measurement) is what the step is
    simulated on for the comparison; ``calibrate`` makes it for a number of devices.
    """

    def __init__(
        self,
        current: Callable[[], tuple[Any, Any, Any]],
        topology: Topology | None = None,
        calibrate: Callable[[int], Topology] | None = None,
        activity: Activity | None = None,
    ) -> None:
        self._current = current
        self.activity = activity
        self.topology = topology
        self._calibrate = calibrate or _calibrated_topology
        self.run: MeasuredRun | None = None
        self.button = w.Button(
            description="Measure",
            tooltip="run this step on one gloo process per device of this CPU and compare "
            "it with the simulator (small programs: at most 4 devices)",
            layout={"width": "110px"},
        )
        self.button.add_class("distir-measure")
        self.button.on_click(lambda _b: self.start())
        self.steps = w.BoundedIntText(
            value=3, min=1, max=20, description="steps", layout={"width": "130px"}
        )
        self.status = w.HTML()
        self.status.add_class("distir-measure-status")
        self.output = w.VBox(layout={"width": "100%"})
        self.output.add_class("distir-measure-output")
        self.trace_path = w.Text(
            placeholder="trace.json (torch.profiler, one file per rank: a.json, b.json)",
            description="trace",
            layout={"width": "420px"},
        )
        self.trace_path.add_class("distir-trace-path")
        self.trace_button = w.Button(description="Read trace", layout={"width": "100px"})
        self.trace_button.tooltip = (
            "draw a PyTorch profiler trace of this step (ops marked 'distir op <i> <type>': "
            "ir.backends.traces) over the simulator's timeline"
        )
        self.trace_button.add_class("distir-read-trace")
        self.trace_button.on_click(lambda _b: self.read_trace())
        super().__init__(
            [
                w.HBox([self.button, self.steps, self.status]),
                w.HBox([self.trace_path, self.trace_button], layout={"flex_flow": "row wrap"}),
                self.output,
            ],
            layout={"width": "100%"},
        )
        self._say("run the step shown on real processes and compare it with the simulator")

    def measure(self) -> MeasuredRun | None:
        """Measure the current step and show the overlay and the table; None (and the
        reason in the status line) when the step is not measured. Waits for the end (the
        button runs :meth:`start` instead)."""
        source, step, simulated = self._current()
        if not self._measurable(step, simulated):
            return None
        try:
            run = self._measure(source, step)
        except DistIRError as e:
            self._failed(str(e))
            return None
        return self._show(run)

    def start(self) -> Task | None:
        """What the "Measure" button does: the measurement as a task of the kernel (the
        activity line says which part runs; Cancel stops it and its worker processes)."""
        source, step, simulated = self._current()
        if self.activity is None:
            self.measure()
            return None
        if not self._measurable(step, simulated):
            return None

        def done(run: MeasuredRun | None, error: BaseException | None) -> None:
            if isinstance(error, KeyboardInterrupt):
                self._failed("cancelled: nothing measured")
            elif isinstance(error, DistIRError):
                self._failed(str(error))
            elif error is not None:
                raise error
            else:
                self._show(run)

        what = f"measuring {step.name} on {len(step.devices)} gloo processes…"
        return self.activity.run(what, lambda: self._measure(source, step), done)

    def _measurable(self, step: Any, simulated: Any) -> bool:
        reason = why_not_measured(step, simulated)
        if reason is not None:
            self._failed(f"not measured: {reason}")
            return False
        return True

    def _failed(self, text: str) -> None:
        self.run = None
        self.output.children = []
        self._say(text, error=True)

    def _measure(self, source: Any, step: Any) -> MeasuredRun:
        self._say(f"measuring {step.name} on {len(step.devices)} processes…")
        if self.topology is None or len(self.topology.devices) < len(step.devices):
            self._progress("calibrating this machine (once, about 10 s)…")
        topology = self._topology(len(step.devices))
        self._progress(f"running {self.steps.value} steps and profiling each op…")
        return measure_step(source, step, topology, steps=self.steps.value)

    def _progress(self, text: str) -> None:
        if self.activity is not None and self.activity.busy:
            self.activity.step(0, 0, text)

    def _show(self, run: MeasuredRun) -> MeasuredRun:
        self.run = run
        m = run.measured
        figure = measured_vs_simulated_figure(m, run.compared)
        self.output.children = [
            w.HTML(f"<p>{html.escape(run.summary())}</p>"),
            Chart.of(figure),
            Chart.of(measured_memory_figure(m, run.compared)),
            w.HTML(error_table_html(m, run.compared)),
        ]
        carried = "state carried between steps" if run.carried else run.note
        costs = "profiled op costs" if run.profiled is not None else "its cost models"
        self._say(
            f"measured {m.steps} steps after warm-up on {len(m.devices)} gloo processes "
            f"({carried}); simulated on {run.topology.name} with {costs}"
        )
        return run

    def read_trace(self, paths: str | list[str] | None = None) -> Any:
        """What "Read trace" does: the profiler trace(s) at ``paths`` (default: the path
        box; several paths separated by commas, one per rank) read as the step shown
        (:func:`ir.backends.traces.read_trace`) and drawn over its simulation on the
        dashboard's hardware, with the error table. The Measurement, or None (the reason
        in the status line)."""
        from ir.backends.traces import read_trace

        _source, step, simulated = self._current()
        if paths is None:
            paths = [p.strip() for p in self.trace_path.value.split(",") if p.strip()]
        if not paths:
            self._failed("give the path of a trace (torch.profiler's Chrome trace JSON)")
            return None
        working = self.activity.working if self.activity is not None else None
        with working("reading the trace…") if working else _nothing():
            try:
                measured = read_trace(paths, step)
            except DistIRError as e:
                self._failed(str(e))
                return None
            figure = measured_vs_simulated_figure(measured, simulated)
            self.run = None
            self.output.children = [Chart.of(figure), w.HTML(error_table_html(measured, simulated))]
        self._say(
            f"read {measured.steps} step(s) of {step.name} from {len(paths)} trace(s); "
            f"simulated on {simulated.topology.name}"
        )
        return measured

    def _topology(self, devices: int) -> Topology:
        if self.topology is None or len(self.topology.devices) < devices:
            self.topology = self._calibrate(max(devices, MAX_PROCESSES))
        return self.topology

    def _say(self, text: str, *, error: bool = False) -> None:
        color = "#b00020" if error else "#555"
        self.status.value = f"<span style='color:{color}'>{html.escape(text)}</span>"


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def _calibrated_topology(devices: int) -> Topology:
    import ir

    return ir.calibrate(quick=True, progress=False).topology(devices)


__all__ = ["MeasurePanel"]
