"""The dashboard a notebook shows: graph, sharding editor, ready transforms, Gantt, memory.

``Workbench(function, topology)`` is an ipywidgets box around a
:class:`~workbench.session.Session`. Clicking a value in the graph selects it
in the editor; Apply annotates it, and the session propagates, simulates and
tells the dashboard, which redraws every view from the new state. Clicking a
bar of the Gantt chart selects its op in the graph. All of it can be driven
from code too (:meth:`Workbench.annotate`, :meth:`Workbench.set_strategy`,
:meth:`Workbench.select`), which is what the tutorials and tests do.
"""

from __future__ import annotations

import html
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import ipywidgets as w
import plotly.graph_objects as go

from ir.device import Topology
from ir.function import Function
from ir.search import Row as SearchRow
from ir.search import SearchResult
from ir.search import search as search_strategies
from widgets import (
    GraphOptions,
    GraphView,
    RenderedGraph,
    Selection,
    compare_figure,
    gantt_figure,
    memory_figure,
)
from widgets.breakdown import breakdown_html
from widgets.gantt import connect_clicks, gantt_spec
from widgets.gantt_zoom import GanttZoom
from widgets.graph import PendingGraph, render_graph
from widgets.live import live_figure, show
from widgets.memory import memory_spec
from widgets.units import format_bytes, format_time

from .editor import ShardingEditor
from .measure_panel import MeasurePanel
from .measuring import MeasuredRun
from .search_panel import SearchPanel
from .session import (
    SCHEDULES,
    Annotation,
    Derived,
    Session,
    SessionError,
    Strategy,
    UnknownValueError,
)

DEFAULT_PRESET = "a100-hgx"


def base_name(name: str, candidates: Sequence[str]) -> str | None:
    """The base-program value a displayed value comes from, by its printed name.

    Transforms and propagation name per-device copies after the original
    (``wA_2``, ``wA_s``, ``y_parts``): the longest candidate that is the name
    itself or a prefix followed by ``_`` or ``@`` wins.

    >>> base_name("wA_2", ["w", "wA", "x"]), base_name("x", ["x"]), base_name("q", ["x"])
    ('wA', 'x', None)
    """
    if name in candidates:
        return name
    best = None
    for c in candidates:
        if re.match(re.escape(c) + r"[_@.]", name) and (best is None or len(c) > len(best)):
            best = c
    return best


@dataclass(frozen=True)
class Payloads:
    """Everything the views show for one derived state (built in Python, no browser)."""

    graph: RenderedGraph
    gantt: go.Figure
    memory: go.Figure
    summary_html: str


def placements_of(derived: Derived) -> dict[str, str]:
    """Placement labels per base-program value: from the propagation report, else the
    user's annotations."""
    report = derived.report
    layouts = getattr(report, "layouts", None) or {}
    return {name: " ".join(ps) for name, ps in layouts.items()}


def summary_html(session: Session) -> str:
    """Strategy, step time, peaks (out-of-memory flagged) and inserted collectives."""
    d = session.current
    r = d.result
    peaks = r.peak_memory_bytes
    worst = max(peaks, key=peaks.get) if peaks else None
    over = getattr(r, "over_capacity", ())
    parts = [
        f"<b>{html.escape(d.state.describe())}</b>",
        f'step time <b class="distir-step-time">{format_time(r.step_time_s)}</b>',
        f"{len(r.devices)} device(s)",
    ]
    if worst is not None:
        parts.append(f"peak memory {format_bytes(peaks[worst])} (device {worst})")
    if over:
        parts.append(
            f'<span style="color:#d62728">out of memory on device(s) {", ".join(map(str, over))}'
            "</span>"
        )
    text = " · ".join(parts)
    if d.collectives:
        items = "".join(f"<li><code>{html.escape(str(c))}</code></li>" for c in d.collectives)
        text += (
            f"<details><summary>{len(d.collectives)} redistribution(s) inserted by propagation"
            f"</summary><ul>{items}</ul></details>"
        )
    text += (
        f"<div style='color:#888;font-size:smaller'>derive {d.derive_s * 1e3:.0f} ms, "
        f"simulate {d.simulate_s * 1e3:.0f} ms</div>"
    )
    return f'<div class="distir-summary-body">{text}</div>'


def build_payloads(
    session: Session, options: GraphOptions | None = None, *, view: str = "distributed"
) -> Payloads:
    """The graph drawing, Gantt and memory figures and summary of the session's state."""
    d = session.current
    if view == "original":
        graph = render_graph(session.base, placements_of(d), options)
    else:
        graph = render_graph(d.function, None, options)
    return Payloads(
        graph,
        gantt_figure(d.result, d.function),
        memory_figure(d.result),
        summary_html(session),
    )


class Workbench(w.VBox):
    """The workbench dashboard over ``function`` on ``topology`` (default: 8 A100s).

    In a notebook::

        wb = Workbench(ir.models.mlp(8, 16, 32, 4), ir.Topology.preset("a100-hgx", 4))
        wb                                   # shows the dashboard
        wb.annotate("wA", (Mesh((4,)), [S(1)]))  # what a click and Apply do
    """

    def __init__(
        self,
        function: Function,
        topology: Topology | None = None,
        *,
        strategy: Strategy | None = None,
        graph_options: GraphOptions | None = None,
        graph_height_px: int = 460,
        max_graph_ops: int = 400,
        session: Session | None = None,
    ) -> None:
        if session is None:  # else ``function`` and ``topology`` are the session's
            topology = topology or Topology.preset(DEFAULT_PRESET, 8)
            session = Session(function, topology, strategy=strategy)
        self.session = session
        self.max_graph_ops = max_graph_ops
        self.graph_note = ""
        self.graph_options = graph_options or GraphOptions()
        self.view = w.ToggleButtons(
            options=[
                ("distributed program", "distributed"),
                ("per device", "unrolled"),
                ("original + placements", "original"),
            ],
            value="distributed",
            tooltips=[
                "one node per logical op: pmaps, collectives, sends",
                "pmap bodies unrolled per device (small programs)",
                "the program you wrote, with the placements chosen",
            ],
            style={"button_width": "150px"},
        )
        self.graph = GraphView(
            self.session.base, options=self.graph_options, height_px=graph_height_px
        )
        self._drawn: tuple[Any, ...] = (self.session.base, (), self.graph.options.view, None)
        self.graph.add_class("distir-graph")
        self.editor = ShardingEditor(self.session)
        self.summary = w.HTML()
        self.summary.add_class("distir-summary")
        self.selection = w.HTML("<i>nothing selected</i>")
        self.selection.add_class("distir-selection")
        self.controls = self._strategy_controls()
        self.gantt_box = w.Box(layout={"width": "100%"})
        self.gantt_box.add_class("distir-gantt")
        self.breakdown = w.HTML()  # beside the Gantt: each device's step, broken down
        self.breakdown.add_class("distir-breakdown")
        self.memory_box = w.Box(layout={"width": "100%"})
        self.memory_box.add_class("distir-memory")
        self.compare_box = w.Box(layout={"width": "100%"})
        self.search_box = w.Box(layout={"width": "100%"})
        self.search_box.add_class("distir-search-result")
        self.search_result: SearchResult | None = None
        self.search_panel = SearchPanel(self._load_search_row)
        self.measure_panel = MeasurePanel(
            lambda: (self.session.base, self.session.current.function, self.session.current.result)
        )
        self.gantt: go.FigureWidget | None = None
        self.gantt_zoom: GanttZoom | None = None
        self.memory: go.FigureWidget | None = None
        self._memory_devices: tuple[int, ...] = ()  # curve slots of the memory view
        self.last_redraw_s = 0.0
        self.redraw_s: dict[str, float] = {}  # time per view of the last redraw
        self._shown: Derived | None = None
        self._shown_view = "distributed"
        self.graph.on_select(self._on_graph_select)
        self.graph.observe(lambda _c: self._fit_charts(), names="dashboard_width_px")
        self.view.observe(lambda _: self.refresh(), names="value")
        self.session.on_change(lambda _s: self.refresh())
        self.file_controls = self._file_controls()
        side = w.VBox(
            [self.selection, self.editor, self.controls, self.file_controls],
            layout={"width": "36%", "min_width": "330px"},
        )
        main = w.VBox([self.view, self.graph], layout={"width": "63%"})
        super().__init__(
            [
                self.summary,
                w.HBox([main, side]),
                self.gantt_box,
                self.breakdown,
                self.memory_box,
                self.compare_box,
                self.measure_panel,
                self.search_box,
            ],
            layout={"width": "100%"},
        )
        self.add_class("distir-workbench")
        self.arguments: dict[str, Any] = {}  # arrays by input name, for imported models
        self.weight_names: tuple[str, ...] = ()  # the arguments that are weights
        self.refresh()

    # -- bring your own model ---------------------------------------------------------

    @classmethod
    def from_torch(
        cls, module: Any, example_inputs: Sequence[Any], topology: Topology | None = None, **kw
    ) -> Workbench:
        """The dashboard over a PyTorch module (``ir.from_torch``); ``wb.arguments`` holds
        the weights and example inputs by input name, ready for ``ir.execute``."""
        from .imported import load_torch

        function, arguments, weights = load_torch(module, example_inputs)
        wb = cls(function, topology, **kw)
        wb.arguments = arguments
        wb.weight_names = weights
        return wb

    @classmethod
    def from_onnx(cls, path: Any, topology: Topology | None = None, **kw) -> Workbench:
        """The dashboard over an ONNX file: its sharding annotations become the session's
        (one change: undo shows the program without them); ``wb.arguments`` holds its
        initializers by input name."""
        from .imported import load_onnx

        function, weights, layouts = load_onnx(path)
        wb = cls(function, topology, **kw)
        wb.arguments = weights
        wb.weight_names = tuple(weights)
        if layouts:
            specs = {name: (lay.mesh, list(lay.placements)) for name, lay in layouts.items()}
            if not wb.session.annotate_many(specs, f"annotations of {path}"):
                raise SessionError(wb.session.error or "the file's annotations do not apply")
        return wb

    def save_onnx(self, path: Any, *, with_weights: bool = True) -> Any:
        """Save the program and its annotations as ONNX (seed 001's fields); with
        ``with_weights``, the arrays of ``wb.arguments`` that are weights go in as
        initializers (the example inputs stay graph inputs)."""
        from .imported import save_onnx

        weights = {n: self.arguments[n] for n in self.weight_names} if with_weights else None
        return save_onnx(self.session, path, weights)

    # -- session files ------------------------------------------------------------------

    def save(self, path: Any) -> Any:
        """Save the session (program, topology, state, undo/redo history) to ``path`` as
        JSON; see docs/workbench.md. The arrays of ``wb.arguments`` are not saved."""
        return self.session.save(path)

    @classmethod
    def load(cls, path: Any, **kw: Any) -> Workbench:
        """The dashboard over the session saved at ``path`` (``kw``: display options)."""
        session = Session.load(path)
        return cls(session.base, session.topology, session=session, **kw)

    def restore(self, path: Any) -> bool:
        """What the Load button does: replace this dashboard's session by the one saved at
        ``path``. False, with the error shown and nothing changed, when it cannot."""
        if not self.session.restore(path):
            return False
        self.arguments, self.weight_names = {}, ()  # they belonged to the program replaced
        if self.editor.value_name not in self.session.annotatable():
            self.editor.select(None)
        s = self.session.strategy
        self.dp.value, self.hp.value, self.pp.value = s.dp, s.hp, s.pp
        self.microbatches.value, self.schedule.value = s.microbatches, s.schedule
        self.editor.refresh()
        return True

    def _save_to_box(self) -> None:
        try:
            path = self.save(self.file_path.value.strip())
        except SessionError as e:
            self.session.error = str(e)
        else:
            self.session.error = None
            self.file_status.value = f"<small>saved {html.escape(str(path))}</small>"
        self.editor.refresh()

    def _load_from_box(self) -> None:
        self.file_status.value = ""
        self.editor.busy("loading the session…")
        if self.restore(self.file_path.value.strip()):
            self.file_status.value = (
                f"<small>loaded {html.escape(self.file_path.value.strip())}</small>"
            )
        self.editor.refresh()

    def _file_controls(self) -> w.VBox:
        self.file_path = w.Text(value="session.json", description="file", layout={"width": "98%"})
        self.file_path.add_class("distir-session-path")
        self.save_button = w.Button(description="Save", layout={"width": "80px"})
        self.save_button.add_class("distir-session-save")
        self.save_button.on_click(lambda _b: self._save_to_box())
        self.load_button = w.Button(description="Load", layout={"width": "80px"})
        self.load_button.add_class("distir-session-load")
        self.load_button.on_click(lambda _b: self._load_from_box())
        self.file_status = w.HTML("")
        return w.VBox(
            [
                w.HTML("<b>Session file</b> (errors show in the editor above)"),
                self.file_path,
                w.HBox([self.save_button, self.load_button, self.file_status]),
            ],
            layout={"padding": "4px", "border": "1px solid #ddd", "margin": "6px 0 0 0"},
        )

    # -- driving it from code ---------------------------------------------------------

    def annotate(self, value_name: str, spec: Annotation) -> bool:
        """What Apply does: place ``value_name`` as ``spec`` (see ``Session.annotate``).

        An unknown name fails like any other change: False, with ``session.error`` set."""
        if value_name in self.session.annotatable():
            self.select(value_name)
        return self.session.annotate(value_name, spec)

    def set_strategy(self, strategy: Strategy | None = None, **knobs: Any) -> bool:
        """Switch to a ready strategy: ``wb.set_strategy(dp=2, pp=2, microbatches=4)``."""
        return self.session.set_strategy(strategy, **knobs)

    def compare(self) -> go.Figure:
        """The previous state and this one side by side (Gantt charts on one time axis)."""
        before, now = self.session.previous, self.session.current
        if before is None:
            raise KeyError("nothing to compare with: make a change first")
        labels = (f"before: {before.state.describe()}", f"now: {now.state.describe()}")
        return compare_figure(
            before.result,
            now.result,
            function_a=before.function,
            function_b=now.function,
            labels=labels,
        )

    def undo(self) -> bool:
        return self.session.undo()

    def redo(self) -> bool:
        return self.session.redo()

    def select(self, value_name: str) -> None:
        """Select base-program value ``value_name`` in the editor (and the graph, if drawn)."""
        if value_name not in self.session.annotatable():
            raise UnknownValueError(
                f"select: {value_name!r} is not a value of {self.session.base.name!r}"
            )
        self.editor.select(value_name)
        self._show_selection(value_name, None)

    # -- updates ----------------------------------------------------------------------

    def refresh(self) -> None:
        """Redraw whatever the session's state changed (nothing if it did not)."""
        self.editor.refresh()
        d = self.session.current
        if d is self._shown and self.view.value == self._shown_view:
            return
        start = time.perf_counter()
        self.graph_note = ""
        pending = None
        try:  # graphviz lays the graph out in its own process while the charts are built
            pending = self._start_graph(d)
        except Exception as e:  # the other views must still show the new state
            self.graph_note = f"the graph could not be drawn: {type(e).__name__}: {e}"
        started = time.perf_counter()
        if self.gantt is None:
            self.gantt = live_figure(*gantt_spec(d.result, d.function))
            # zooming into a summarised step's time window shows that window's events
            self.gantt_zoom = GanttZoom(self.gantt, d.result, d.function)
            connect_clicks(self.gantt, self._on_gantt_select)
            self.gantt_box.children = [self.gantt]
        elif not self.gantt_zoom.show(d.result, d.function):
            connect_clicks(self.gantt, self._on_gantt_select)  # new traces, new handlers
        self.breakdown.value = breakdown_html(d.result)
        gantt_done = time.perf_counter()
        # a curve slot for every device shown so far: the next program redraws in place
        seen = set(self._memory_devices) | set(d.result.devices)
        self._memory_devices = tuple(x for x in self.session.topology.device_ids if x in seen)
        memory = memory_spec(d.result, devices=self._memory_devices)
        if self.memory is None:
            self.memory = live_figure(*memory)
            self.memory_box.children = [self.memory]
            self._fit_charts()
        else:
            show(self.memory, *memory)
        figures_done = time.perf_counter()
        if pending is not None:
            try:
                self.graph.show(pending[0])
                self._drawn = pending[1]
            except Exception as e:
                self.graph_note = f"the graph could not be drawn: {type(e).__name__}: {e}"
        self.redraw_s = {  # the graph's share: what Python spent on it or waited for
            "graph": (started - start) + (time.perf_counter() - figures_done),
            "gantt": gantt_done - started,
            "memory": figures_done - gantt_done,
        }
        note = f"<div class='distir-graph-note'>{html.escape(self.graph_note)}</div>"
        self.summary.value = summary_html(self.session) + (note if self.graph_note else "")
        self._shown, self._shown_view = d, self.view.value
        self.last_redraw_s = time.perf_counter() - start
        if self.editor.value_name is not None:
            self._show_selection(self.editor.value_name, None)

    def _fit_charts(self) -> None:
        """Give the Gantt and memory charts the dashboard's width, as the browser reports
        it (plotly's widget draws before it is on the page, at 700 px, and never refits)."""
        width = self.graph.dashboard_width_px
        if width <= 0:
            return
        for chart in (self.gantt, self.memory):
            if chart is not None and chart.layout.width != width:
                chart.layout.width = width

    def _start_graph(self, d: Derived) -> tuple[PendingGraph, Any] | None:
        """Start drawing the graph for ``d``, or None when the drawing on display fits.

        A transform's output is drawn as its logical program (one node per pmap,
        collective or send, whatever the number of devices); "per device" unrolls
        pmap bodies while the program has at most ``max_graph_ops`` ops.
        """
        function, placements, result = self.session.base, placements_of(d), None
        view = "unrolled"
        if self.view.value != "original" and d.function is not self.session.base:
            function, placements, result = d.function, {}, d.result
            view = "logical"
            ops = d.function.num_ops()
            if self.view.value == "unrolled" and ops <= self.max_graph_ops:
                view = "unrolled"
            elif self.view.value == "unrolled":
                # graphviz needs minutes for thousands of unrolled per-device ops
                self.graph_note = (
                    f"the distributed program has {ops} ops (more than max_graph_ops="
                    f"{self.max_graph_ops}): the graph shows its logical view, one node "
                    "per pmap, collective or send"
                )
        options = replace(self.graph.options, view=view)
        key = (function, tuple(sorted(placements.items())), view, result)
        if key == self._drawn:  # graphviz layout is the slow part: skip it when unchanged
            return None
        pending = self.graph.prepare(
            function, placements=placements, options=options, result=result
        )
        return pending, key

    def _on_graph_select(self, selection: Selection | None) -> None:
        if selection is None:
            return
        name = selection.name
        if selection.kind == "op" and selection.op is not None and selection.op.outputs:
            name = selection.op.outputs[0].name
        target = base_name(name, self.session.annotatable())
        if target is None:
            self.editor.select(None, f"{name} was made by the transform: choose an original value")
        else:
            self.editor.select(target, "" if target == name else f"clicked {name}")
        self._show_selection(target, selection)

    def _on_gantt_select(self, op_id: str) -> None:
        if self.view.value != "distributed":
            self.view.value = "distributed"
        self.graph.select(op_id)

    def _show_selection(self, target: str | None, selection: Selection | None) -> None:
        r = self.session.result
        clicked = ""
        if selection is not None:
            clicked = f"{selection.kind} <code>{html.escape(selection.name)}</code>"
            if selection.op is not None:
                clicked += f" ({html.escape(selection.op.op_type)})"
            clicked += " · "
        annotation = self.session.state.annotation(target) if target else None
        placed = f" = {html.escape(_short(annotation))}" if annotation is not None else ""
        self.selection.value = (
            f"selected: {clicked}value <b class='distir-selected-name'>"
            f"{html.escape(target or '-')}</b>{placed} · step time "
            f"{format_time(r.step_time_s)}"
        )

    # -- the ready transforms ---------------------------------------------------------

    def _strategy_controls(self) -> w.VBox:
        s = self.session.strategy

        def knob(label: str, value: int, top: int, width: str = "118px") -> w.BoundedIntText:
            return w.BoundedIntText(
                value=value,
                min=1,
                max=top,
                description=label,
                style={"description_width": "initial"},  # the label in full
                layout={"width": width},
            )

        def row(*children: w.Widget) -> w.HBox:
            # wraps rather than run past a narrow panel's right edge
            return w.HBox(list(children), layout={"flex_flow": "row wrap"})

        self.dp, self.hp, self.pp = knob("dp", s.dp, 64), knob("hp", s.hp, 64), knob("pp", s.pp, 64)
        self.microbatches = knob("microbatches", s.microbatches, 1024, "180px")
        self.schedule = w.Dropdown(
            options=list(SCHEDULES),
            value=s.schedule,
            description="schedule",
            layout={"width": "180px"},
        )
        apply = w.Button(description="Apply strategy", button_style="info")
        apply.add_class("distir-apply-strategy")
        apply.on_click(lambda _b: self._apply_strategy())
        reset = w.Button(description="Sequential")
        reset.on_click(lambda _b: self.session.set_strategy(Strategy()))
        compare = w.Button(description="Compare with previous", layout={"width": "180px"})
        compare.add_class("distir-compare")
        compare.on_click(lambda _b: self._show_comparison())
        search = w.Button(description="Search all", layout={"width": "120px"})
        search.add_class("distir-search")
        search.tooltip = "simulate every dp x hp x pp of the devices; click a point to apply it"
        search.on_click(lambda _b: self.search())
        return w.VBox(
            [
                w.HTML("<b>Ready transforms</b> (dp × hp × pp devices)"),
                row(self.dp, self.hp, self.pp),
                row(self.microbatches, self.schedule),
                row(apply, reset),
                row(compare, search),
            ],
            layout={
                "padding": "4px",
                "border": "1px solid #ddd",
                "margin": "6px 0 0 0",
            },
        )

    def search(self, **space: Any) -> SearchResult:
        """Simulate every strategy of the ready transforms on all the devices (the space of
        :func:`ir.search.search`, narrowed by ``space``) and show the step time x memory
        chart below the dashboard (:class:`~workbench.search_panel.SearchPanel`): clicking
        a point applies its strategy; with "Compare two" on, the last two points clicked
        are shown side by side."""
        self.editor.busy("simulating every strategy…")
        space.setdefault("progress", False)
        topology = self.session.topology
        result = search_strategies(self.session.base, topology, optimizer=None, **space)
        self.search_result = result
        capacity = min(d.memory_bytes for d in topology.devices)
        self.search_panel.show(result, capacity_bytes=capacity)
        self.search_box.children = [self.search_panel]
        self.editor.refresh()
        return result

    def measure(self, topology: Topology | None = None) -> MeasuredRun | None:
        """What the "Measure" button does: run the step shown on one gloo process per
        device of this CPU (at most 4) and show its timeline over the simulator's, on
        ``topology`` (default: this machine, calibrated once), with the error table
        (:class:`~workbench.measure_panel.MeasurePanel`); None when it is not measured
        (the panel says why)."""
        if topology is not None:
            self.measure_panel.topology = topology
        return self.measure_panel.measure()

    def compare_search_rows(self, a: SearchRow, b: SearchRow) -> go.Figure:
        """Load searched strategies ``a`` then ``b`` and show them side by side below the
        chart, as two clicks with "Compare two" on do; return the comparison's figure.
        A row the ready transforms cannot express raises SessionError with the reason."""
        if self.search_result is None:
            raise SessionError("compare_search_rows: run search() first")
        panel = self.search_panel
        panel.compare_mode.value = True
        panel.clear()  # these two, whatever was picked before
        for row in (a, b):
            if not panel.pick(row):
                raise SessionError(f"cannot load {row.strategy}: {self.session.error}")
        return panel.comparison.children[-1]

    def apply_search_row(self, row: SearchRow) -> bool:
        """Apply a searched strategy through the ready transforms (one the dashboard's knobs
        can express: no ZeRO, sequence parallelism, chunks or recomputation)."""
        s = row.strategy
        if s.zero or s.sequence_parallel or s.chunks > 1 or s.recompute:
            self.session.error = f"{s}: the ready-transform knobs cannot express it; use T.megatron"
            self.editor.refresh()
            return False
        self.dp.value, self.hp.value, self.pp.value = s.dp, s.tp, s.pp
        self.microbatches.value, self.schedule.value = s.microbatches, s.schedule
        return self.set_strategy(
            dp=s.dp, hp=s.tp, pp=s.pp, microbatches=s.microbatches, schedule=s.schedule
        )

    def _load_search_row(self, row: SearchRow) -> Derived | None:
        """The search panel's click: apply ``row``; the state shown, or None if refused."""
        return self.session.current if self.apply_search_row(row) else None

    def _show_comparison(self) -> None:
        if self.session.previous is None:
            self.session.error = "nothing to compare with: make a change first"
            self.editor.refresh()
            return
        self.compare_box.children = [go.FigureWidget(self.compare())]

    def _apply_strategy(self) -> None:
        self.editor.busy("transforming and simulating…")
        self.session.set_strategy(
            dp=self.dp.value,
            hp=self.hp.value,
            pp=self.pp.value,
            microbatches=self.microbatches.value,
            schedule=self.schedule.value,
        )


def _short(annotation: Annotation) -> str:
    if isinstance(annotation, tuple):
        mesh, placements = annotation
        return f"mesh {list(mesh.shape)} [{', '.join(map(str, placements))}]"
    return str(annotation)
