"""The dashboard's side panels, as parts of :class:`workbench.Workbench`: the session
file (Save / Load) and the ready transforms (dp x cp x hp x pp knobs, ep and ZeRO where
the model allows them, Apply, compare with the previous state, search every strategy,
measure the step shown).
"""

from __future__ import annotations

import html
import time
from typing import TYPE_CHECKING, Any

import ipywidgets as w

from ir.device import Topology
from ir.errors import DistIRError
from ir.registry import get_op
from ir.search import Row as SearchRow
from ir.search import SearchResult
from ir.search import search as search_strategies
from ir.transforms._rewrite import is_optimizer
from widgets.chart import Chart

from .measuring import MeasuredRun
from .session import SCHEDULES, Derived, Session, SessionError, Strategy
from .tasks import Task

if TYPE_CHECKING:
    from .dashboard import Workbench


class SessionFilePanel:
    """Save and Load: the session (program, topology, state, history) as a JSON file."""

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
        self._allow_knobs()
        self._show_strategy(self.session.strategy)
        self.editor.refresh()
        return True

    def _save_to_box(self) -> None:
        with self.activity.working("saving the session…"):
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
        with self.activity.working("loading the session…"):
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


class ReadyTransformsPanel:
    """The ready transforms' knobs and buttons, and the search and measurement they start."""

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
        self.ep, self.cp = knob("ep", s.ep, 64), knob("cp", s.cp, 64)
        self.zero = w.Dropdown(
            options=[("ZeRO off", 0)] + [(f"ZeRO-{z}", z) for z in (1, 2, 3)],
            value=s.zero,
            description="",
            layout={"width": "110px"},
        )
        for name in ("dp", "hp", "pp", "microbatches", "ep", "cp", "zero"):
            getattr(self, name).add_class(f"distir-knob-{name}")
        self._allow_knobs()
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
        reset.add_class("distir-sequential")
        reset.on_click(lambda _b: self._sequential())
        compare = w.Button(description="Compare with previous", layout={"width": "180px"})
        compare.add_class("distir-compare")
        compare.on_click(lambda _b: self._show_comparison())
        search = w.Button(description="Search all", layout={"width": "120px"})
        search.add_class("distir-search")
        search.tooltip = "simulate every dp x hp x pp of the devices; click a point to apply it"
        search.on_click(lambda _b: self.start_search())
        self.strategy_buttons = [apply, reset, compare, search]
        return w.VBox(
            [
                w.HTML("<b>Ready transforms</b> (dp × cp × hp × pp devices)"),
                row(self.dp, self.hp, self.pp),
                row(self.ep, self.cp, self.zero),
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

    def _allow_knobs(self) -> None:
        """Enable the knobs the session's program allows, each refusal in its tooltip: ep
        for a mixture-of-experts model (at most its experts), cp for a sequence model (one
        with an op that depends on where a token sits: attention), ZeRO for a training step
        (it shards the optimizer's state)."""
        base = self.session.base
        experts = max(
            (op.attributes["experts"] for op in base.ops if op.op_type == "MoEDispatch"),
            default=0,
        )
        sequence = any("context_form" in get_op(op.op_type).extra for op in base.ops)
        trains = any(is_optimizer(op) for op in base.ops)
        self.knob_refusals = {
            name: None if ok else f"not for {why}"
            for name, ok, why in (
                ("ep", experts > 0, "a model without experts (build it with experts=E)"),
                ("cp", sequence, "a model without attention (no sequence to split)"),
                ("zero", trains, "a program without an optimizer (a training step has one)"),
            )
        }
        for name, why in self.knob_refusals.items():
            knob = getattr(self, name)
            knob.disabled, knob.tooltip = why is not None, why or ""
        self.ep.max = max(experts, 1)

    def _show_strategy(self, s: Strategy) -> None:
        """Set the knobs to strategy ``s`` (those that differ: no needless change events)."""
        for name in ("dp", "hp", "pp", "ep", "cp", "zero", "microbatches", "schedule"):
            knob, value = getattr(self, name), getattr(s, name)
            if knob.value != value:
                knob.value = value

    def search(self, **space: Any) -> SearchResult:
        """Search the strategies of the ready transforms on all the devices (the space of
        :func:`ir.search.search`, narrowed by ``space``: every strategy estimated, those
        that can reach the front simulated) and show the step time x memory chart below
        the dashboard (:class:`~workbench.search_panel.SearchPanel`), redrawn as simulated
        rows come in (at most twice a second): clicking a point applies its strategy; with
        "Compare two" on, the last two points clicked are shown side by side. What the
        "Search all" button does, waiting for the end (the button runs it as a task:
        progress shown, Cancel heard)."""
        with self.activity.working("searching strategies…"):
            result = self._search(**space)
            self._show_search(result)
        return result

    def start_search(self, **space: Any) -> Task:
        """What the "Search all" button does: the search as a task of the kernel, its
        progress (strategies decided of all the space's not pruned) on the activity line, the chart
        redrawn as rows come in, and a Cancel button that stops it with the rows it has
        (the rest marked cancelled)."""

        def done(result: SearchResult | None, error: BaseException | None) -> None:
            if isinstance(error, DistIRError):
                self.session.error = str(error)
                self.editor.refresh()
                return
            if error is not None:
                raise error
            self._show_search(result)

        def work() -> SearchResult:
            return self._search(progress=self.activity.step, **space)

        return self.activity.run("searching strategies…", work, done)

    def _search(self, **space: Any) -> SearchResult:
        space.setdefault("progress", False)
        topology = self.session.topology
        capacity = min(d.memory_bytes for d in topology.devices)
        so_far: list[SearchRow] = []
        drawn = [time.monotonic()]

        def on_row(row: SearchRow) -> None:  # the front as it grows
            so_far.append(row)
            if row.ok and time.monotonic() - drawn[0] > 0.5:
                drawn[0] = time.monotonic()
                self.search_panel.show(SearchResult(list(so_far)), capacity_bytes=capacity)
                self.search_box.children = [self.search_panel]

        return search_strategies(
            self.session.base, topology, optimizer=None, on_row=on_row, **space
        )

    def _show_search(self, result: SearchResult) -> None:
        self.search_result = result
        capacity = min(d.memory_bytes for d in self.session.topology.devices)
        self.search_panel.show(result, capacity_bytes=capacity)
        self.search_box.children = [self.search_panel]
        self.editor.refresh()

    def measure(self, topology: Topology | None = None) -> MeasuredRun | None:
        """What the "Measure" button does: run the step shown on one gloo process per
        device of this CPU (at most 4) and show its timeline over the simulator's, on
        ``topology`` (default: this machine, calibrated once), with the error table
        (:class:`~workbench.measure_panel.MeasurePanel`); None when it is not measured
        (the panel says why)."""
        if topology is not None:
            self.measure_panel.topology = topology
        return self.measure_panel.measure()

    def compare_search_rows(self, a: SearchRow, b: SearchRow) -> Chart:
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
        can express: ep, cp and ZeRO, but no sequence parallelism, chunks or
        recomputation)."""
        s = row.strategy
        refused = [
            f"{name}: {why}"
            for name, why in self.knob_refusals.items()
            if why is not None and getattr(s, name) != getattr(Strategy(), name)
        ]
        if s.sequence_parallel or s.chunks > 1 or s.recompute or s.schedule not in SCHEDULES:
            refused.insert(0, "no sequence parallelism, chunks or recomputation")
        if refused:
            self.session.error = (
                f"{s}: the ready-transform knobs cannot express it ({'; '.join(refused)}); "
                "use T.megatron"
            )
            self.editor.refresh()
            return False
        try:
            chosen = Strategy(s.dp, s.tp, s.pp, s.microbatches, s.schedule, s.ep, s.cp, s.zero)
        except SessionError as e:
            self.session.error = f"{s}: {e}"
            self.editor.refresh()
            return False
        self._show_strategy(chosen)
        return self.set_strategy(chosen)

    def _load_search_row(self, row: SearchRow) -> Derived | None:
        """The search panel's click: apply ``row``; the state shown, or None if refused."""
        return self.session.current if self.apply_search_row(row) else None

    def _show_comparison(self) -> None:
        if self.session.previous is None:
            self.session.error = "nothing to compare with: make a change first"
            self.editor.refresh()
            return
        with self.activity.working("comparing with the previous state…"):
            self.compare_box.children = [Chart.of(self.compare())]

    def _apply_strategy(self) -> None:
        with self.activity.working("transforming and simulating…"):
            self.session.set_strategy(
                dp=self.dp.value,
                hp=self.hp.value,
                pp=self.pp.value,
                microbatches=self.microbatches.value,
                schedule=self.schedule.value,
                ep=self.ep.value if not self.ep.disabled else 1,
                cp=self.cp.value if not self.cp.disabled else 1,
                zero=self.zero.value if not self.zero.disabled else 0,
            )

    def _sequential(self) -> None:
        with self.activity.working("simulating the sequential program…"):
            self.session.set_strategy(Strategy())


__all__ = ["ReadyTransformsPanel", "SessionFilePanel"]
