"""Zoom from summary to detail in a live Gantt chart.

A step with more than a few thousand events per device is drawn as one summary
bar per device, one with a few hundred as a bar per task (see
:func:`widgets.gantt_bars.gantt_traces`). :class:`GanttZoom`
watches the chart's time axis: when the user zooms into a time window (the browser
reports the range), it redraws the chart with that window's events; zooming back out
(double-click, or a range that covers the step) brings the summary back. All of it is
Python: the browser only reports the axis range.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ir.function import Function

from .chart import Chart
from .gantt import gantt_spec
from .gantt_blocks import BLOCKS_ABOVE_EVENTS
from .timeline import SUMMARY_ABOVE_EVENTS, summarised
from .units import time_unit

if TYPE_CHECKING:
    from ir.sim import SimResult


class GanttZoom:
    """Keeps a Gantt :class:`~widgets.chart.Chart` at the level of detail its time axis
    asks for.

    ``show(result, function)`` draws a new step (whole, as :func:`gantt_spec` does);
    afterwards each x-axis range the user zooms to is answered by :meth:`zoom`. A step
    drawn bar by bar needs nothing (plotly zooms the bars it has); a summarised one is
    redrawn with the window's events.
    """

    def __init__(
        self,
        chart: Chart,
        result: SimResult | None = None,
        function: Function | None = None,
        *,
        summary_above: int | None = SUMMARY_ABOVE_EVENTS,
        blocks_above: int | None = BLOCKS_ABOVE_EVENTS,
    ) -> None:
        self.widget = chart
        self.summary_above = summary_above
        self.blocks_above = blocks_above
        self.result, self.function = result, function
        self.window: tuple[float, float] | None = None  # the window drawn; None: the step
        chart.on_zoom(self._on_zoom)

    def show(
        self,
        result: SimResult,
        function: Function | None = None,
        spec: tuple[list[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> None:
        """Draw ``result``'s whole step (``spec``: its :func:`gantt_spec`, if made
        already)."""
        self.result, self.function, self.window = result, function, None
        if spec is not None:
            self.widget.show(*spec)
        else:
            self._draw(None)

    def zoom(self, window: tuple[float, float] | None) -> bool:
        """Show the events of ``window`` (``(start_s, end_s)``; None or a window that
        covers the step: the whole step). False when nothing needed redrawing."""
        result = self.result
        if result is None or not self.coarse(result):
            return False  # every event is drawn already: plotly's own zoom shows them
        if window is not None and window[0] <= 0 and window[1] >= result.step_time_s:
            window = None
        if window == self.window:
            return False
        self.window = window
        self._draw(window)
        return True

    def coarse(self, result: SimResult) -> bool:
        """Whether ``result``'s whole step is drawn coarser than op by op (summary bars,
        or a bar per task)."""
        compute = int((result.bars.stream == 0).sum())
        blocks = self.blocks_above is not None and compute > self.blocks_above
        return summarised(result.bars, self.summary_above) or blocks

    def _draw(self, window: tuple[float, float] | None) -> None:
        assert self.result is not None
        spec = gantt_spec(
            self.result,
            self.function,
            window=window,
            summary_above=self.summary_above,
            blocks_above=self.blocks_above,
        )
        self.widget.show(*spec)

    def _on_zoom(self, x_range: tuple[float, float] | None) -> None:
        if self.result is None:
            return
        if x_range is None:
            self.zoom(None)  # double-click: the whole step
            return
        size = time_unit(self.result.step_time_s)[1]  # the axis is in the step's unit
        t0, t1 = (x * size for x in x_range)
        if t0 < t1:
            self.zoom((max(t0, 0.0), t1))
