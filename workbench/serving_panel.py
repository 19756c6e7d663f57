"""The dashboard's serving mode: pick a model, GPUs and a request mix, see the decode step's
Gantt chart, the KV cache's memory growing with context and the latency/throughput front,
and place one weight or cache of the decode step by hand to see TPOT change.

:class:`ServingPanel` is the ipywidgets view of a :class:`workbench.serving.ServingSession`
(which answers everything; this module only draws and wires). ``Workbench`` shows it when
its mode is "serving"; it works on its own too::

    panel = ServingPanel()                           # Llama-3-8B on 8 A100s
    panel.choose(model="llama-2-70b", preset="h100-hgx", gpus=8, tp=8)
    panel.place("h0_mlp_w_gate", "R")               # what a click on a placement does

Every choice the model or the GPUs cannot take (a tensor-parallel degree that does not
divide the key/value heads, a context beyond the positions, more GPUs than the hardware
has, a batch the strategy's GPUs cannot hold) is said in the panel's status line, naming
the limit and by how much, and changes nothing.
"""

from __future__ import annotations

import html
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import ipywidgets as w

from ir.device import Topology
from ir.errors import DistIRError
from ir.function import Function
from ir.inference import (
    RequestMix,
    ServingError,
    ServingFront,
    ServingMetrics,
    ServingStrategy,
    analyse,
)
from ir.models_llama import LLAMA_SHAPES
from ir.sharding import Mesh, R, S
from ir.sharding.mesh import Placement, Shard
from ir.sim import SimResult
from widgets.chart import Chart
from widgets.serving import summary_rows
from widgets.units import format_time

from .serving import (
    DECODE_BLOCKS_ABOVE,
    FRONT_BATCHES,
    ServingSession,
    check_fits,
    decode_title,
    mix_fields,
    serving_model,
    widest,
)
from .tasks import Activity, Task

__all__ = ["DEFAULT_MODEL", "PROGRAM", "ServingPanel", "serving_panel_for"]

DEFAULT_MODEL = "llama-3-8b"
PROGRAM = "program"  # the model choice that serves the session's own program
DEFAULT_PRESET = "a100-hgx"


@contextmanager
def _quietly(_what: str) -> Iterator[None]:
    yield


def _placement_label(placements: list[Placement]) -> str:
    return ", ".join(f"S({p.dim})" if isinstance(p, Shard) else "R" for p in placements)


class ServingPanel(w.VBox):
    """See the module docstring. ``session``: what to show, its program offered as "this
    program" beside the Llama shapes (default: ``model``, a published Llama shape, default
    Llama-3-8B, on 8 A100s by tensor parallelism); ``activity``: the
    dashboard's activity line (says what runs, disables the buttons meanwhile, runs the
    front as a task with progress and Cancel)."""

    def __init__(
        self,
        session: ServingSession | None = None,
        *,
        model: str | None = None,
        activity: Activity | None = None,
    ) -> None:
        self.activity = activity
        self._working = activity.working if activity is not None else _quietly
        self.model_name = model or PROGRAM  # the Llama shape served, or PROGRAM
        self.program: Function | None = None  # the session's own program, when given one
        if session is None:
            self.model_name = model or DEFAULT_MODEL
            topology = Topology.preset(DEFAULT_PRESET, 8)
            forward = serving_model(self.model_name)
            session = ServingSession(forward, topology, RequestMix(), widest(forward, 8))
        elif model is None:
            self.program = session.forward
        self.session = session
        self.status = w.HTML()
        self.status.add_class("distir-serving-status")
        self.summary = w.HTML()
        self.summary.add_class("distir-serving-summary")
        self._controls = self._make_controls()
        self.placement_list = w.Select(options=[], rows=8, layout={"width": "98%"})
        self.placement_list.add_class("distir-serving-values")
        self.placement_choice = w.ToggleButtons(options=[], style={"button_width": "64px"})
        self.placement_choice.add_class("distir-serving-placement")
        self.placement_list.observe(lambda _c: self._show_choices(), names="value")
        self.placement_choice.observe(self._on_choice, names="value")
        self.placement_note = w.HTML()
        self.placement_note.add_class("distir-serving-tpot")
        side = w.VBox(
            [
                w.HTML("<b>Decode step: placements</b> (click a value, then a placement)"),
                self.placement_list,
                self.placement_choice,
                self.placement_note,
            ],
            layout={"width": "40%", "min_width": "300px"},
        )
        self.gantt = Chart()
        self.gantt.add_class("distir-serving-gantt")
        self.memory = Chart()
        self.memory.add_class("distir-serving-memory")
        self.front_box = w.Box(layout={"width": "100%"})
        self.front_box.add_class("distir-serving-front")
        self.front: Chart | None = None
        super().__init__(
            [
                self.status,
                w.HBox([w.VBox([self._controls, self.summary], layout={"width": "60%"}), side]),
                self.gantt,
                self.memory,
                self.front_box,
            ],
            layout={"width": "100%"},
        )
        self.add_class("distir-serving")
        self._changing = False
        self.refresh()

    # -- controls ------------------------------------------------------------------------

    def _make_controls(self) -> w.VBox:
        s, mix = self.session, self.session.mix
        names = list(LLAMA_SHAPES)
        own = [] if self.program is None else [(f"this program ({self.program.name})", PROGRAM)]
        self.model = w.Dropdown(
            options=[*own, *((n, n) for n in names)],
            value=self.model_name,
            description="model",
            layout={"width": "230px"},
        )
        self.model.add_class("distir-serving-model")
        self.preset = w.Dropdown(
            options=list(Topology.presets()),
            value=_preset_of(s.topology),
            description="hardware",
            layout={"width": "230px"},
        )
        self.preset.add_class("distir-serving-preset")
        self.gpus = w.BoundedIntText(value=len(s.topology.devices), min=1, max=4096)
        boxes = {
            "prompt_len": w.BoundedIntText(value=mix.prompt_len, min=1, max=1 << 20),
            "output_len": w.BoundedIntText(value=mix.output_len, min=1, max=1 << 20),
            "batch": w.BoundedIntText(value=mix.batch, min=1, max=1 << 16),
        }
        degrees = {
            k: w.BoundedIntText(value=getattr(s.strategy, k), min=1, max=4096)
            for k in ("tp", "pp", "replicas")
        }
        for key, box in [("gpus", self.gpus), *boxes.items(), *degrees.items()]:
            box.layout.width = "150px"
            labels = {"prompt_len": "prompt", "output_len": "output", "gpus": "GPUs"}
            box.description = labels.get(key, key)
            box.add_class(f"distir-serving-{key}")
        self.mix_boxes, self.degree_boxes = boxes, degrees
        self.apply_button = w.Button(description="Apply", button_style="primary")
        self.apply_button.add_class("distir-serving-apply")
        self.apply_button.on_click(lambda _b: self._apply_controls())
        self.front_button = w.Button(description="Front", tooltip="every strategy and batch")
        self.front_button.add_class("distir-serving-front-button")
        self.front_button.on_click(lambda _b: self.show_front())
        return w.VBox(
            [
                self.model,
                w.HBox([self.preset, self.gpus]),
                w.HBox(list(boxes.values())),
                w.HBox(list(degrees.values())),
                w.HBox([self.apply_button, self.front_button]),
            ]
        )

    def _apply_controls(self) -> None:
        self.choose(
            model=self.model.value,
            preset=self.preset.value,
            gpus=self.gpus.value,
            **{k: b.value for k, b in self.mix_boxes.items()},
            **{k: b.value for k, b in self.degree_boxes.items()},
        )

    def buttons(self) -> list[w.Button]:
        """The panel's action buttons (the dashboard disables them while it works)."""
        return [self.apply_button, self.front_button]

    # -- driving it from code ------------------------------------------------------------

    def choose(
        self,
        *,
        model: str | None = None,
        preset: str | None = None,
        gpus: int | None = None,
        tp: int | None = None,
        pp: int | None = None,
        replicas: int | None = None,
        **mix: int,
    ) -> bool:
        """What Apply does: serve ``model`` on ``gpus`` GPUs of ``preset`` with the request
        mix (``prompt_len``, ``output_len``, ``batch``) by tp x pp x replicas (anything left
        out stays). False, the panel unchanged and the reason in its status, when refused."""
        s = self.session
        with self._working("simulating the serving steps…"):
            try:
                strategy = ServingStrategy(
                    s.strategy.tp if tp is None else tp,
                    s.strategy.pp if pp is None else pp,
                    s.strategy.replicas if replicas is None else replicas,
                )
                forward = s.forward
                if model == PROGRAM and self.program is None:
                    raise ServingError("this panel was not given a program of its own to serve")
                if model == PROGRAM:
                    forward = self.program
                elif model is not None and model != self.model_name:
                    forward = serving_model(model)
                topology = s.topology
                preset = preset or _preset_of(topology)
                gpus = len(topology.devices) if gpus is None else gpus
                if (preset, gpus) != (_preset_of(topology), len(topology.devices)):
                    topology = Topology.preset(preset, gpus)
                new = ServingSession(
                    forward,
                    topology,
                    RequestMix(**{**mix_fields(s.mix), **mix}),
                    strategy,
                    cuda_graphs=s.cuda_graphs,
                )
                check_fits(new.metrics)  # simulates; raises what the choice cannot take
            except DistIRError as e:
                self._say(str(e), error=True)
                self._show_controls()
                return False
            new.keep_front_of(s)
            self.session = new
            if forward is not s.forward:
                self.model_name = str(model)
            self._say("")
            self.refresh()
        return True

    def place(self, value_name: str, placement: str) -> bool:
        """What a click on a placement does: place the decode step's ``value_name`` (a
        weight or a cache) ``"R"`` (whole on every GPU) or ``"S(i)"`` (split on axis i)
        over the tensor-parallel GPUs, propagate and simulate; the TPOT before and after
        in the panel. False, nothing changed, when propagation refuses it (or the strategy
        has a pipeline, whose stages are not placed here)."""
        mesh = Mesh((self.session.strategy.tp,))
        with self._working(f"placing {value_name}…"):
            try:
                before = self.session.annotated().tpot_s
                layout = R if placement == "R" else S(int(placement.strip("S()")))
                after = self.session.annotate(value_name, (mesh, [layout])).tpot_s
            except (DistIRError, ValueError) as e:
                self.placement_note.value = (
                    f"<span class='distir-error'>{html.escape(str(e))}</span>"
                )
                return False
        self.placement_note.value = (
            f"{html.escape(value_name)} {html.escape(placement)}: TPOT "
            f"<b>{format_time(before)}</b> &rarr; <b class='distir-serving-tpot-after'>"
            f"{format_time(after)}</b>"
        )
        shown = self.session.annotated()
        self._show_gantt(shown.result, shown.program, f"{value_name} {placement}")
        self._show_placements(keep=value_name)
        return True

    def show_front(self) -> Task | None:
        """The latency/throughput front over every strategy of the GPUs. It simulates many
        programs (seconds to a minute): in the dashboard a task with a progress bar and
        Cancel (returned, to join), else at once (None)."""
        session = self.session
        if self.activity is None:
            try:
                self._draw_front(session.front(FRONT_BATCHES))
            except DistIRError as e:
                self._say(str(e), error=True)
            return None
        activity = self.activity

        def work() -> ServingFront:
            return session.front(FRONT_BATCHES, on_step=lambda i, n: activity.step(i, n))

        def done(front: ServingFront | None, error: BaseException | None) -> None:
            if isinstance(error, KeyboardInterrupt):
                self._say("the front was cancelled: Front again computes it")
            elif isinstance(error, DistIRError):
                self._say(str(error), error=True)
            elif error is not None:
                raise error
            elif front is not None and session is self.session:
                self._draw_front(front)

        return activity.run("simulating every serving strategy…", work, done)

    def _draw_front(self, front: ServingFront) -> None:
        from widgets.serving import front_spec

        spec = front_spec(front)
        if self.front is None:
            self.front = Chart(*spec)
            self.front.on_click(self._on_front_click)
            self.front_box.children = [self.front]
        else:
            self.front.show(*spec)

    def _on_front_click(self, _trace: int, point: int, trace: dict[str, Any]) -> None:
        """A click on a point of the front serves by its strategy and batch."""
        data = trace.get("customdata") or []
        if not 0 <= point < len(data):
            return
        label, batch = data[point]
        s = ServingStrategy.parse(label)
        self.choose(tp=s.tp, pp=s.pp, replicas=s.replicas, batch=int(batch))

    # -- drawing -------------------------------------------------------------------------

    def refresh(self) -> None:
        """Redraw every view from the session."""
        from widgets.serving import kv_memory_spec

        m = self.session.metrics
        self.summary.value = _summary_html(m)
        self._show_gantt(m.decode, m.decode_program)
        self.memory.show(*kv_memory_spec(m))
        self._show_controls()
        self.placement_note.value = ""
        self._show_placements()
        front = self.session.computed_front
        if front is not None:  # another strategy or batch of the same front
            self._draw_front(front)
        elif self.front is not None:
            self.front_box.children, self.front = [], None

    def _show_gantt(self, result: SimResult, program: Function, how: str = "") -> None:
        from widgets.gantt import gantt_spec

        title = decode_title(result, self.session.mix, how)
        spec = gantt_spec(result, program, title=title, blocks_above=DECODE_BLOCKS_ABOVE)
        self.gantt.show(*spec)

    def _show_controls(self) -> None:
        s = self.session
        self.model.value = self.model_name
        self.preset.value = _preset_of(s.topology)
        self.gpus.value = len(s.topology.devices)
        for k, box in self.mix_boxes.items():
            box.value = getattr(s.mix, k)
        for k, box in self.degree_boxes.items():
            box.value = getattr(s.strategy, k)

    def _show_placements(self, keep: str | None = None) -> None:
        """The decode step's placements (one replica, tensor parallel); none under a
        pipeline, whose stages are not placed here."""
        self._changing = True
        try:
            try:
                annotations = self.session.annotations()
            except DistIRError as e:
                self.placement_list.options = []
                self.placement_choice.layout.display = "none"
                self.placement_note.value = f"<small>{html.escape(str(e))}</small>"
                return
            self.placement_choice.layout.display = None
            self._ranks = {
                v.name: len(v.type.shape)  # type: ignore[union-attr]
                for v in self.session.decode().inputs
                if v.name in annotations
            }
            options = [
                (f"{name}: {_placement_label(spec[1])}", name) for name, spec in annotations.items()
            ]
            self.placement_list.options = options
            self.placement_list.value = keep if keep in annotations else options[0][1]
            self._show_choices()
        finally:
            self._changing = False

    def _show_choices(self) -> None:
        name = self.placement_list.value
        if name is None:
            return
        was = self._changing
        self._changing = True
        try:
            current = _placement_label(self.session.annotations()[name][1])
            self.placement_choice.options = ["R", *(f"S({i})" for i in range(self._ranks[name]))]
            self.placement_choice.value = current
        finally:
            self._changing = was

    def _on_choice(self, change: dict[str, Any]) -> None:
        if self._changing or change["new"] is None or self.placement_list.value is None:
            return
        self.place(self.placement_list.value, change["new"])

    def _say(self, text: str, error: bool = False) -> None:
        cls = "distir-error" if error else ""
        self.status.value = f"<span class='{cls}'>{html.escape(text)}</span>" if text else ""


def serving_panel_for(
    program: Function, topology: Topology, activity: Activity | None = None
) -> ServingPanel:
    """The dashboard's serving panel: ``program`` on ``topology`` when it is a causal
    forward a step can be built from (the most tensor parallelism its heads allow, a
    request mix within its positions), else the default Llama (the reason in the status)."""
    why = ""
    try:
        positions = analyse(program).positions
        mix = RequestMix(max(1, positions * 3 // 4), max(1, positions // 4), 8)
        session = ServingSession(program, topology, mix, widest(program, len(topology.devices)))
        check_fits(session.metrics)
    except DistIRError as e:
        why = f"{program.name} is not served ({e}): serving {DEFAULT_MODEL} instead"
    else:
        return ServingPanel(session, activity=activity)
    panel = ServingPanel(activity=activity)
    panel._say(why)
    return panel


def _summary_html(metrics: ServingMetrics) -> str:
    rows = "".join(
        f"<tr><th style='text-align:left'>{html.escape(k)}</th>"
        f"<td class='distir-serving-{_slug(k)}'>{html.escape(v)}</td></tr>"
        for k, v in summary_rows(metrics)
    )
    return f"<table class='distir-serving-table'>{rows}</table>"


def _slug(text: str) -> str:
    """``"time per output token"`` as ``"time-per-output-token"`` (a CSS class)."""
    return "-".join(text.replace(",", "").split())


def _preset_of(topology: Topology) -> str:
    """The preset a topology was made from (its name starts with it)."""
    names = sorted(Topology.presets(), key=len, reverse=True)
    return next((n for n in names if topology.name.startswith(n)), names[-1])
