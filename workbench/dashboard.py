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
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import ipywidgets as w
import plotly.graph_objects as go

from ir.device import Topology
from ir.function import Function
from ir.search import SearchResult
from widgets import (
    GraphOptions,
    GraphView,
    Selection,
    compare_figure,
)
from widgets.breakdown import breakdown_html
from widgets.cells import held_widgets, own_by_cell
from widgets.chart import Chart
from widgets.gantt import connect_clicks, gantt_spec
from widgets.gantt_zoom import GanttZoom
from widgets.graph import Drawn, PendingGraph
from widgets.memory import memory_spec
from widgets.units import format_time

from .dashboard_panels import ReadyTransformsPanel, SessionFilePanel
from .editor import ShardingEditor
from .export_panel import ExportPanel
from .measure_panel import MeasurePanel
from .payloads import (
    Payloads,
    base_name,
    build_payloads,
    placements_of,
    short_annotation,
    summary_html,
)
from .search_panel import SearchPanel
from .serving_panel import ServingPanel, serving_panel_for
from .session import (
    Annotation,
    Derived,
    NothingToCompareError,
    Session,
    SessionError,
    Strategy,
    UnknownValueError,
    _cache_key,
)
from .tasks import Activity
from .views import Charts, Drawings

DEFAULT_PRESET = "a100-hgx"


class Workbench(SessionFilePanel, ReadyTransformsPanel, w.VBox):
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
                ("distributed", "distributed"),
                ("per device", "unrolled"),
                ("as written", "original"),
            ],
            value="distributed",
            tooltips=[
                "the distributed program: one node per logical op (pmaps, collectives, sends)",
                "pmap bodies unrolled per device (small programs)",
                "the program you wrote, each value in the colours of the devices it is placed on",
            ],
            style={"button_width": "96px"},
        )
        self.view.add_class("distir-view")
        self.graph = GraphView(
            self.session.base, options=self.graph_options, height_px=graph_height_px
        )
        self._drawn: tuple[Any, ...] = (self.session.base, (), self.graph.options, None)
        self.drawings = Drawings()  # the charts and graphs of the last states shown
        self.graph.add_class("distir-graph")
        self.activity = Activity(self._action_buttons, self._restore_buttons)
        self.editor = ShardingEditor(
            self.session, working=self.activity.working, busy=lambda: self.activity.busy
        )
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
        self.compare_box.add_class("distir-comparison")
        self.search_box = w.Box(layout={"width": "100%"})
        self.search_box.add_class("distir-search-result")
        self.search_result: SearchResult | None = None
        self.search_panel = SearchPanel(self._load_search_row, working=self.activity.working)
        self.measure_panel = MeasurePanel(
            lambda: (self.session.base, self.session.current.function, self.session.current.result),
            activity=self.activity,
        )
        self.gantt: Chart | None = None
        self.gantt_zoom: GanttZoom | None = None
        self.memory: Chart | None = None
        self.last_redraw_s = 0.0
        self.redraw_s: dict[str, float] = {}  # time per view of the last redraw
        self._shown: Derived | None = None
        self._shown_view = "distributed"
        self.graph.on_select(self._on_graph_select)
        self.view.observe(lambda _: self.refresh(), names="value")
        self._on_session_change = lambda _s: self.refresh()
        self.session.on_change(self._on_session_change)
        self.file_controls = self._file_controls()
        self.export_panel = ExportPanel(lambda: self.session, working=self.activity.working)
        side = w.VBox(
            [self.selection, self.editor, self.controls, self.export_panel, self.file_controls],
            layout={"width": "36%", "min_width": "330px"},
        )
        main = w.VBox([self.view, self.graph], layout={"width": "63%"})
        self.mode = w.ToggleButtons(
            options=[("training step", "training"), ("serving", "serving")],
            value="training",
            tooltips=[
                "the program's step: graph, sharding, ready transforms, Gantt, memory",
                "serve a model: prefill and decode, TTFT/TPOT, KV cache, the front",
            ],
            style={"button_width": "110px"},
        )
        self.mode.add_class("distir-mode")
        self.serving: ServingPanel | None = None  # made when serving is first chosen
        self._training_views = [
            self.summary,
            self.activity,
            w.HBox([main, side]),
            self.gantt_box,
            self.breakdown,
            self.memory_box,
            self.compare_box,
            self.measure_panel,
            self.search_box,
        ]
        super().__init__([self.mode, *self._training_views], layout={"width": "100%"})
        self.mode.observe(lambda _c: self._show_mode(), names="value")
        self.add_class("distir-workbench")
        self.arguments: dict[str, Any] = {}  # arrays by input name, for imported models
        self.weight_names: tuple[str, ...] = ()  # the arguments that are weights
        self.refresh()
        # running this cell again closes this workbench: its view leaves with the output
        own_by_cell(self.close)

    def close(self) -> None:
        """Close the dashboard and every widget it holds (panels shown or not, charts
        kept for a later state); the session stays usable from code and no longer
        redraws it. Running again the cell that made a workbench closes it (see
        :mod:`widgets.cells`)."""
        if self.comm is None:
            return
        self.session.off_change(self._on_session_change)
        for widget in held_widgets(self):
            if widget is self:
                super().close()
            else:
                widget.close()

    # -- bring your own model ---------------------------------------------------------

    @classmethod
    def from_torch(
        cls,
        module: Any,
        example_inputs: Sequence[Any],
        topology: Topology | None = None,
        *,
        moe_capacity_factor: float | None = None,
        **kw,
    ) -> Workbench:
        """The dashboard over a PyTorch module (``ir.from_torch``; ``moe_capacity_factor``
        as there: ``None`` keeps a mixture-of-experts model dropless, a number costs it at
        that factor of the uniform load); ``wb.arguments`` holds the weights and example
        inputs by input name, ready for ``ir.execute``."""
        from .imported import load_torch

        function, arguments, weights = load_torch(module, example_inputs, moe_capacity_factor)
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

    # -- serving mode -----------------------------------------------------------------

    def serve(self, **choices: Any) -> ServingPanel:
        """Switch to the serving mode (see :class:`workbench.serving_panel.ServingPanel`)
        and make ``choices`` as Apply does (``model``, ``preset``, ``gpus``, ``prompt_len``,
        ``output_len``, ``batch``, ``tp``, ``pp``, ``replicas``); the panel, whose
        ``status`` says why a choice was refused."""
        self.mode.value = "serving"
        panel = self._serving_panel()
        if choices:
            panel.choose(**choices)
        return panel

    def _serving_panel(self) -> ServingPanel:
        if self.serving is None:
            with self.activity.working("simulating the serving steps…"):
                self.serving = serving_panel_for(
                    self.session.base, self.session.topology, self.activity
                )
        return self.serving

    def _show_mode(self) -> None:
        if self.mode.value == "serving":
            self.children = [self.mode, self.activity, self._serving_panel()]
        else:
            self.children = [self.mode, *self._training_views]

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
            raise NothingToCompareError(
                "compare: nothing to compare with yet: make a change first (Apply, a "
                "strategy, or wb.set_strategy / wb.annotate); it is shown beside the one before"
            )
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
            return  # a failed change: the knobs keep what the user typed
        if d is not self._shown:
            self._show_knobs()
        start = time.perf_counter()
        self.graph_note = ""
        pending = None
        try:  # graphviz lays the graph out in its own process while the charts are built
            pending = self._start_graph(d)
        except Exception as e:  # the other views must still show the new state
            self.graph_note = f"the graph could not be drawn: {type(e).__name__}: {e}"
        started = time.perf_counter()
        try:  # a chart that fails says so where the user looks, and the graph still shows
            gantt_done = self._show_charts(d)
        except Exception as e:
            note = f"the charts could not be drawn: {type(e).__name__}: {e}"
            self.graph_note = f"{self.graph_note} · {note}" if self.graph_note else note
            gantt_done = time.perf_counter()
        figures_done = time.perf_counter()
        if pending is not None:
            try:
                self.graph.show(pending[0])
                self._drawn = pending[1]
                self.drawings.graphs.put(self._drawn, self.graph.rendered)
            except Exception as e:
                note = f"the graph could not be drawn: {type(e).__name__}: {e}"
                self.graph_note = f"{note} · {self.graph_note}" if self.graph_note else note
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

    def _show_charts(self, d: Derived) -> float:
        """Show ``d``'s Gantt, breakdown and memory view; returns when the Gantt was done
        (time.perf_counter)."""
        charts = self.drawings.charts.get(_cache_key(d.state), lambda: _charts(d))
        if self.gantt is None:
            self.gantt = Chart(*charts.gantt)
            # zooming into a summarised step's time window shows that window's events
            self.gantt_zoom = GanttZoom(self.gantt, d.result, d.function)
            connect_clicks(self.gantt, self._on_gantt_select)
            self.gantt_box.children = [self.gantt]
        else:
            self.gantt_zoom.show(d.result, d.function, charts.gantt)
        self.breakdown.value = charts.breakdown
        gantt_done = time.perf_counter()
        if self.memory is None:
            self.memory = Chart(*charts.memory)
            self.memory_box.children = [self.memory]
        else:
            self.memory.show(*charts.memory)
        return gantt_done

    def _action_buttons(self) -> list[w.Button]:
        """Every button that starts an action (disabled while one runs)."""
        e = self.editor
        return [
            e.apply_button,
            e.remove_button,
            e.undo_button,
            e.redo_button,
            *self.strategy_buttons,
            self.save_button,
            self.load_button,
            self.measure_panel.button,
            self.measure_panel.trace_button,
            self.export_panel.button,
            *(self.serving.buttons() if self.serving is not None else ()),
        ]

    def _restore_buttons(self) -> None:
        self.editor.refresh()  # its buttons as the state allows (Undo, Redo, Remove)

    def _show_knobs(self) -> None:
        """The ready transforms' knobs show the strategy in force (set by code, a search
        point, undo or a loaded session as well as by the knobs)."""
        s = self.session.strategy
        if self.session.state.annotations:
            return  # annotations are another mode: the knobs keep what the user typed
        self._show_strategy(s)

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
        key = (function, tuple(sorted(placements.items())), options, result)
        if key == self._drawn:  # graphviz layout is the slow part: skip it when unchanged
            return None
        drawn = self.drawings.graphs.find(key)  # drawn before (Undo, Redo): shown at once
        if drawn is not None:
            self.graph.set_drawing(function, placements, options, result)
            return Drawn(drawn), key
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
        placed = f" = {html.escape(short_annotation(annotation))}" if annotation is not None else ""
        self.selection.value = (
            f"selected: {clicked}value <b class='distir-selected-name'>"
            f"{html.escape(target or '-')}</b>{placed} · step time "
            f"{format_time(r.step_time_s)}"
        )


def _charts(d: Derived) -> Charts:
    """The Gantt's and memory view's specs and the breakdown of ``d`` (drawn once per
    state: see :class:`~workbench.views.Drawings`)."""
    return Charts(gantt_spec(d.result, d.function), memory_spec(d.result), breakdown_html(d.result))


__all__ = [
    "DEFAULT_PRESET",
    "Payloads",
    "Workbench",
    "base_name",
    "build_payloads",
    "placements_of",
    "summary_html",
]
