"""Zoom from summary to detail in a live Gantt chart.

A step with more than a few thousand events per device is drawn as one summary
bar per device (see :func:`widgets.gantt.gantt_traces`). :class:`GanttZoom`
watches the chart's time axis: when the user zooms into a time window (plotly's
relayout), it redraws the chart with that window's events, in place; zooming
back out (double-click, or a range that covers the step) brings the summary
back. All of it is Python: the browser only reports the axis range.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import plotly.graph_objects as go

from ir.function import Function

from .gantt import gantt_spec
from .live import show
from .timeline import SUMMARY_ABOVE_EVENTS, summarised
from .units import time_unit

if TYPE_CHECKING:
    from ir.sim import SimResult


class GanttZoom:
    """Keeps a Gantt ``FigureWidget`` at the level of detail its time axis asks for.

    ``show(result, function)`` draws a new step (whole, as :func:`gantt_spec` does);
    afterwards each change of the x axis range the user makes is answered by
    :meth:`zoom`. A step drawn bar by bar needs nothing (plotly zooms the bars it
    has); a summarised one is redrawn with the window's events.
    """

    def __init__(
        self,
        widget: go.FigureWidget,
        result: SimResult | None = None,
        function: Function | None = None,
        *,
        summary_above: int | None = SUMMARY_ABOVE_EVENTS,
    ) -> None:
        self.widget = widget
        self.summary_above = summary_above
        self.result, self.function = result, function
        self.window: tuple[float, float] | None = None  # the window drawn; None: the step
        self._drawing = False  # our own updates change the range too: not a user's zoom
        self._seen = self._axis()
        widget.layout.on_change(self._on_range, "xaxis.range", "xaxis.autorange")

    def show(self, result: SimResult, function: Function | None = None) -> bool:
        """Draw ``result``'s whole step; True when the traces were updated in place."""
        self.result, self.function, self.window = result, function, None
        return self._draw(None)

    def zoom(self, window: tuple[float, float] | None) -> bool:
        """Show the events of ``window`` (``(start_s, end_s)``; None or a window that
        covers the step: the whole step). False when nothing needed redrawing."""
        result = self.result
        if result is None or not summarised(result.bars, self.summary_above):
            return False  # every event is drawn already: plotly's own zoom shows them
        if window is not None and window[0] <= 0 and window[1] >= result.step_time_s:
            window = None
        if window == self.window:
            return False
        self.window = window
        self._draw(window)
        return True

    def _draw(self, window: tuple[float, float] | None) -> bool:
        assert self.result is not None
        spec = gantt_spec(
            self.result, self.function, window=window, summary_above=self.summary_above
        )
        self._drawing = True
        try:
            return show(self.widget, *spec)
        finally:
            self._drawing = False
            self._seen = self._axis()

    def _axis(self) -> tuple[tuple[float, ...] | None, Any]:
        axis = self.widget.layout.xaxis
        return (None if axis.range is None else tuple(axis.range), axis.autorange)

    def _on_range(self, _layout: Any, x_range: Any, autorange: Any) -> None:
        # The callback does not say which property changed, and a zoom after a
        # double-click may leave autorange True on this side: act on what changed.
        if self._drawing or self.result is None:
            return
        seen, self._seen = self._seen, self._axis()
        if autorange is True and seen[1] is not True:
            self.zoom(None)  # double-click: the whole step
            return
        if x_range is None or tuple(x_range) == seen[0]:
            return
        size = time_unit(self.result.step_time_s)[1]  # the axis is in the step's unit
        t0, t1 = (float(x) * size for x in x_range)
        if t0 < t1:
            self.zoom((max(t0, 0.0), t1))
