"""The clickable graph view: an anywidget around :func:`widgets.graph.render_graph`.

The ES module (``static/graph.js``) only shows the SVG, zooms, pans and reports
which SVG id was clicked (the ``clicked`` traitlet). This class decides what the
id means: an op or a value becomes ``selected``; a folded group opens.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import anywidget
import traitlets

from ir.function import Function
from ir.op import Op
from ir.sim.result import SimResult
from ir.value import Value

from .graph import Drawn, GraphOptions, PendingGraph, RenderedGraph, legend_html, start_render
from .ids import op_id, op_paths, value_names

STATIC = Path(__file__).parent / "static"


@dataclass(frozen=True)
class Selection:
    """What the user selected: an op (``kind='op'``) or a value (``kind='value'``)."""

    svg_id: str
    kind: str
    name: str
    op: Op | None = None
    value: Value | None = None


class GraphView(anywidget.AnyWidget):
    """The Function as a zoomable, clickable graph coloured by device.

    >>> from ir import models
    >>> view = GraphView(models.mlp(8, 4, 8, 4))
    >>> view.select("op-0")
    >>> view.selection.op.op_type, view.selected["kind"]
    ('MatMul', 'op')
    """

    _esm = STATIC / "graph.js"

    svg = traitlets.Unicode("").tag(sync=True)
    legend_html = traitlets.Unicode("").tag(sync=True)
    error = traitlets.Unicode("").tag(sync=True)
    height_px = traitlets.Int(520).tag(sync=True)
    clicked = traitlets.Dict().tag(sync=True)  # set by the browser: {"id": str, "n": int}
    selected = traitlets.Dict().tag(sync=True)  # set by Python: {"id", "kind", "name", "ids"}

    def __init__(
        self,
        function: Function,
        placements: Mapping[Value | str, str] | None = None,
        options: GraphOptions | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self._function = function
        self._placements = dict(placements or {})
        self._options = options or GraphOptions()
        self._rendered: RenderedGraph | None = None
        self._result: SimResult | None = None
        self._redraw()

    # -- state -----------------------------------------------------------------

    @property
    def function(self) -> Function:
        return self._function

    @property
    def options(self) -> GraphOptions:
        """How the graph is drawn now (the groups the user opened included)."""
        return self._options

    @property
    def rendered(self) -> RenderedGraph:
        """The current drawing (dot, SVG, id map)."""
        assert self._rendered is not None
        return self._rendered

    @property
    def selection(self) -> Selection | None:
        """The selected op or value, with the IR object, or None."""
        sel = self.selected
        if not sel:
            return None
        r = self.rendered
        op = r.ops.get(sel["name"]) if sel["kind"] == "op" else None
        value = r.values.get(sel["name"]) if sel["kind"] == "value" else None
        return Selection(sel["id"], sel["kind"], sel["name"], op, value)

    def update(
        self,
        function: Function | None = None,
        placements: Mapping[Value | str, str] | None = None,
        options: GraphOptions | None = None,
    ) -> None:
        """Redraw with a new function, placements or options; keeps the selection if it
        still exists (by op path or value name)."""
        self.show(self.prepare(function, placements, options))

    def prepare(
        self,
        function: Function | None = None,
        placements: Mapping[Value | str, str] | None = None,
        options: GraphOptions | None = None,
        result: SimResult | None = None,
    ) -> PendingGraph:
        """Start drawing (graphviz lays it out in its own process); :meth:`show` it later.

        Nothing on display changes until then, so the caller can build other views
        while ``dot`` runs. ``result`` puts simulated times on the logical view's
        collectives (kept for later redraws until another one is given).
        """
        if function is not None:
            self._function = function
        if placements is not None:
            self._placements = dict(placements)
        if options is not None:
            self._options = options
        if result is not None or function is not None:
            self._result = result
        try:
            return start_render(
                self._function, self._placements, self._options, result=self._result
            )
        except Exception as e:  # show it in the panel, keep the last good drawing
            self.error = f"{type(e).__name__}: {e}"
            raise

    def set_drawing(
        self,
        function: Function,
        placements: Mapping[Value | str, str],
        options: GraphOptions,
        result: SimResult | None,
    ) -> None:
        """Say what the next :meth:`show` draws, without drawing it (a drawing made
        before, for this function, placements, options and result, will be shown)."""
        self._function, self._placements, self._options = function, dict(placements), options
        self._result = result

    def show(self, pending: PendingGraph | Drawn) -> None:
        """Display a drawing :meth:`prepare` started."""
        try:
            rendered = pending.result()
        except Exception as e:  # show it in the panel, keep the last good drawing
            self.error = f"{type(e).__name__}: {e}"
            raise
        self._rendered = rendered
        self.error = ""
        self.legend_html = legend_html(rendered.legend)
        self.svg = rendered.svg
        sel = self.selected
        if sel and not self._set_selection(sel["kind"], sel["name"]):
            self.selected = {}

    def _redraw(self) -> None:
        self.show(self.prepare())

    # -- selection ---------------------------------------------------------------

    def select(self, svg_id: str | None) -> None:
        """Select the op or value with this SVG id (``op-3``, ``v-2-0``); ``None`` clears.

        An op hidden in a folded group (or a folded pmap body) opens that group first.
        A group id opens the group.
        """
        if svg_id is None:
            self.selected = {}
            return
        r = self.rendered
        if svg_id not in r.id_map:
            group = r.hidden_in(svg_id)
            parent = svg_id.rpartition(".")[0]
            if group is None and parent.startswith("op-"):
                return self.select(parent)  # a pmap body op, drawn as its pmap (logical view)
            if group is None:
                raise KeyError(
                    f"{svg_id!r} is not an op or value id of this graph "
                    f"(ids look like 'op-3', 'op-3.1' or 'v-2-0')"
                )
            self.update(options=replace(self._options, expanded=self._options.expanded | {group}))
            return self.select(svg_id)
        kind, name = r.id_map[svg_id]
        if kind == "group":
            self.update(options=replace(self._options, expanded=self._options.expanded | {name}))
            return None
        self._set_selection(kind, name, svg_id)
        return None

    def select_op(self, op: Op) -> None:
        """Select ``op`` (an op of this function or of one of its pmap bodies)."""
        path = op_paths(self._function).get(op)
        if path is None:
            raise KeyError(f"{op!r} is not an op of function {self._function.name!r}")
        self.select(op_id(path))

    def select_value(self, value: Value) -> None:
        """Select ``value`` (all its edges light up)."""
        name = value_names(self._function).get(value)
        if name is None:
            raise KeyError(f"{value!r} is not a value of function {self._function.name!r}")
        if self._set_selection("value", name):
            return
        producer = next((op for op in op_paths(self._function) if value in op.outputs), None)
        if producer is not None:  # folded away: open the fold that hides its producer
            group = self.rendered.hidden_in(op_id(op_paths(self._function)[producer]))
            if group is not None:
                expanded = self._options.expanded | {group}
                self.update(options=replace(self._options, expanded=expanded))
                if self._set_selection("value", name):
                    return
        raise KeyError(f"{value!r} is not drawn: nothing reads it and it is not an output")

    def on_select(self, callback: Callable[[Selection | None], None]) -> None:
        """Call ``callback(selection)`` whenever the selection changes."""
        self.observe(lambda _change: callback(self.selection), names="selected")

    def _set_selection(self, kind: str, name: str, svg_id: str | None = None) -> bool:
        ids = [i for i, target in self.rendered.id_map.items() if target == (kind, name)]
        if not ids:
            return False
        self.selected = {"id": svg_id or ids[0], "kind": kind, "name": name, "ids": ids}
        return True

    @traitlets.observe("clicked")
    def _on_click(self, change: dict[str, Any]) -> None:
        svg_id = (change["new"] or {}).get("id")
        if svg_id in self.rendered.id_map:
            self.select(svg_id)
