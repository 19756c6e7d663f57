"""The dashboard's search panel: the Pareto chart of a search, and two strategies compared.

Clicking a point loads its strategy into the dashboard (graph, Gantt, memory). With
"Compare two" on, each click also picks the point, and the last two picked are shown
side by side below the chart: their Gantt charts on one time axis and their memory
curves (:func:`widgets.compare_figure`), with the search's figures of each
(:func:`widgets.rows_html`), the two points labelled A and B on the chart.
:meth:`SearchPanel.pick` does what a click does, for code and tests.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

import ipywidgets as w

from ir.search import Row, SearchResult
from widgets import Chart, compare_figure, pareto_figure, picked_annotations, rows_html

from .session import Derived

LABELS = ("A", "B")


class SearchPanel(w.VBox):
    """The chart of a search with its "Compare two" switch and the comparison below it.

    ``load(row)`` applies a row's strategy on the dashboard and returns the state it
    shows, or None when it could not (the dashboard says why).
    """

    def __init__(
        self,
        load: Callable[[Row], Derived | None],
        working: Callable[[str], AbstractContextManager[None]] = lambda _what: nullcontext(),
    ) -> None:
        self._load = load
        self._working = working
        self.result: SearchResult | None = None
        self.figure: Chart | None = None
        self.picked: list[tuple[Row, Derived]] = []  # at most two, the latest last
        self.compare_mode = w.ToggleButton(
            value=False,
            description="Compare two",
            tooltip="on: the last two points clicked are shown side by side",
            layout={"width": "130px"},
        )
        self.compare_mode.add_class("distir-search-compare")
        self.compare_mode.observe(lambda _change: self.clear(), names="value")
        self.status = w.HTML()
        self.status.add_class("distir-search-status")
        self.comparison = w.VBox(layout={"width": "100%"})
        self.comparison.add_class("distir-search-comparison")
        self.chart = w.Box(layout={"width": "100%"})
        super().__init__(
            [w.HBox([self.compare_mode, self.status]), self.chart, self.comparison],
            layout={"width": "100%"},
        )
        self._say()

    def show(self, result: SearchResult, capacity_bytes: float | None = None) -> None:
        """Draw ``result``'s chart (points clickable); picks of an earlier search are
        forgotten."""
        self.result = result
        spec = pareto_figure(result, capacity_bytes=capacity_bytes).to_dict()
        spec["layout"].pop("template", None)
        if self.figure is None:  # one chart, redrawn as a streamed search's rows come in
            self.figure = Chart(spec["data"], spec["layout"])
            self.figure.on_click(self._on_click)
            self.chart.children = [self.figure]
        else:
            self.figure.show(spec["data"], spec["layout"])
        self.clear()

    def pick(self, row: Row) -> bool:
        """What clicking ``row``'s point does: load its strategy, and with "Compare two"
        on, compare it with the point picked before. False if it could not be loaded."""
        what = "comparing" if self.compare_mode.value and self.picked else "loading"
        with self._working(f"{what} {row.strategy}…"):
            return self._pick(row)

    def _pick(self, row: Row) -> bool:
        shown = self._load(row)
        if shown is None:
            return False
        if not self.compare_mode.value:
            return True
        self.picked = [*self.picked, (row, shown)][-2:]
        self._mark()
        if len(self.picked) == 2:
            (a, shown_a), (b, shown_b) = self.picked
            figure = compare_figure(
                shown_a.result,
                shown_b.result,
                function_a=shown_a.function,
                function_b=shown_b.function,
                labels=(f"A: {a.strategy}", f"B: {b.strategy}"),
                title=f"A: {a.strategy} vs B: {b.strategy}",
            )
            self.comparison.children = [
                w.HTML(rows_html([a, b], LABELS)),
                Chart.of(figure),
            ]
        self._say()
        return True

    def row_of(self, label: str) -> Row | None:
        """The row whose strategy is written ``label`` (a point's hover text)."""
        if self.result is None:
            return None
        return next((r for r in self.result.rows if str(r.strategy) == label), None)

    def clear(self) -> None:
        """Forget the picked points: no labels on the chart, no comparison."""
        self.picked = []
        self.comparison.children = []
        self._mark()
        self._say()

    def _on_click(self, _index: int, point: int, trace: dict) -> None:
        texts = trace.get("text") or []
        row = self.row_of(texts[point]) if point < len(texts) else None
        if row is not None:
            self.pick(row)

    def _mark(self) -> None:
        if self.figure is not None:
            chart = self.figure
            marked = picked_annotations([r for r, _ in self.picked])
            chart.show(chart.traces, {**chart.figure_layout, "annotations": marked})

    def _say(self) -> None:
        if not self.compare_mode.value:
            text = "click a point to load its strategy"
        elif not self.picked:
            text = "compare: click a first point (A)"
        elif len(self.picked) == 1:
            text = f"A = {self.picked[0][0].strategy}; click a second point (B)"
        else:
            text = (
                f"A = {self.picked[0][0].strategy}, B = {self.picked[1][0].strategy} "
                "(shown below; a further click replaces A by B and picks a new B)"
            )
        self.status.value = f"<span style='color:#555'>{text}</span>"


__all__ = ["SearchPanel"]
