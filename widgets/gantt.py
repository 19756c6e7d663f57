"""The Gantt view: one row per device and stream of a simulated step (plotly).

The bars are built by :mod:`widgets.gantt_bars`; this module lays out the chart
(title at the left, the tool bar's corner free, the legend under the time axis),
makes it a static figure or a live :class:`~widgets.chart.Chart`, and maps a click on
a bar to its op id (``op-3``, ``op-3.1``, as in the graph view).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import plotly.graph_objects as go

from ir.function import Function

from .chart import TEMPLATE, Chart
from .gantt_bars import (
    BYTES,
    DEVICE,
    DUR_S,
    FLOPS,
    START_S,
    STREAMS,
    bar_colors,
    bar_numbers,
    gantt_traces,
    row_label,
)
from .gantt_blocks import BLOCKS_ABOVE_EVENTS
from .timeline import SUMMARY_ABOVE_EVENTS, check_window
from .units import format_time, time_unit

if TYPE_CHECKING:
    from ir.sim import SimResult

__all__ = [
    "BYTES",
    "DEVICE",
    "DUR_S",
    "FLOPS",
    "START_S",
    "STREAMS",
    "bar_colors",
    "bar_numbers",
    "connect_clicks",
    "gantt_figure",
    "gantt_spec",
    "gantt_traces",
    "gantt_widget",
    "legend_rows",
    "op_id_at",
    "row_label",
]

ROW_PX = 26  # height of one device stream's row
LEGEND_ROW_PX = 22
SUBTITLE_PX = 18
LEGEND_ENTRIES_PER_ROW = 8  # at 1280 px; wider windows fit more, narrower ones wrap


def legend_rows(entries: int) -> int:
    """Lines a horizontal legend of ``entries`` takes (for the bottom margin)."""
    return max(1, -(-entries // LEGEND_ENTRIES_PER_ROW))


def chart_layout(title: str, rows: int, legend_entries: int, subtitle: str = "") -> dict[str, Any]:
    """The layout every Gantt shares: title at the top left (the tool bar shows at the
    top right, on hover, over nothing), ``subtitle`` (how to read it) a smaller line under
    it rather than a title that runs off a narrow chart, the legend below the time axis."""
    legend_px = LEGEND_ROW_PX * legend_rows(legend_entries)
    sub_px = SUBTITLE_PX if subtitle else 0
    heading: dict[str, Any] = {"text": title, "x": 0, "xanchor": "left", "y": 0.99}
    heading["yanchor"] = "top"
    if subtitle:
        heading["subtitle"] = {"text": subtitle, "font": {"size": 12}}
    return {
        "barmode": "overlay",
        "title": heading,
        "height": max(220, 70 + sub_px + legend_px + ROW_PX * rows),
        "margin": {"l": 10, "r": 10, "t": 34 + sub_px, "b": 44 + legend_px},
        "legend": {
            "orientation": "h",
            "x": 0,
            "xanchor": "left",
            "yref": "container",
            "y": 0,
            "yanchor": "bottom",
        },
        "hoverlabel": {"align": "left"},
    }


def gantt_figure(
    result: SimResult,
    function: Function | None = None,
    *,
    title: str | None = None,
    window: tuple[float, float] | None = None,
    summary_above: int | None = SUMMARY_ABOVE_EVENTS,
    blocks_above: int | None = BLOCKS_ABOVE_EVENTS,
) -> go.Figure:
    """The Gantt chart of a simulated step; pass ``function`` so bars know their op ids
    and phases.

    ``window=(start_s, end_s)`` shows that time window's events (see :func:`gantt_traces`):
    how a step too long to draw bar by bar is seen in detail.
    """
    traces, layout = gantt_spec(
        result,
        function,
        title=title,
        window=window,
        summary_above=summary_above,
        blocks_above=blocks_above,
    )
    return go.Figure(data=traces, layout={**layout, "template": TEMPLATE})


def gantt_spec(
    result: SimResult,
    function: Function | None = None,
    *,
    title: str | None = None,
    window: tuple[float, float] | None = None,
    summary_above: int | None = SUMMARY_ABOVE_EVENTS,
    blocks_above: int | None = BLOCKS_ABOVE_EVENTS,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The Gantt chart as plain plotly dicts (traces, layout without a template).

    What :func:`gantt_figure` wraps, and what a live chart shows (:meth:`Chart.show`)
    without building a Figure first. The time unit is the step's, window or not, so
    that a zoomed view keeps its axis.
    """
    unit = time_unit(result.step_time_s)
    traces, rows = gantt_traces(
        result,
        function,
        unit=unit,
        window=window,
        summary_above=summary_above,
        blocks_above=blocks_above,
    )
    heading = title or f"step {format_time(result.step_time_s)} on {len(result.devices)} devices"
    t0, t1 = check_window(result, window)
    if window is not None:
        heading += f" · {format_time(t0)} to {format_time(t1)}"
    notes = []  # how to read it: a second, smaller line (one line would run off a narrow chart)
    if traces[0]["meta"].get("summary"):
        notes.append("summary per device: zoom in to see events")
    elif traces[0]["meta"].get("blocks"):
        notes.append("a bar per task: zoom in to see each op")
    if any(t["meta"].get("labelled") for t in traces):
        notes.append("F3/B3: microbatch 3's forward/backward (lighter)")
    x_range = [0, t1 / unit[1] * 1.01] if window is None else [t0 / unit[1], t1 / unit[1]]
    layout = chart_layout(
        heading, len(rows), sum(t["showlegend"] for t in traces), " · ".join(notes)
    )
    layout["xaxis"] = {"title": {"text": f"time ({unit[0]})"}, "range": x_range}
    layout["yaxis"] = {
        "tickmode": "array",
        "tickvals": list(range(len(rows))),
        "ticktext": rows,
        "autorange": "reversed",
    }
    return traces, layout


def op_id_at(figure: go.Figure | Chart, trace_index: int, point_index: int) -> str | None:
    """The op id of one bar (what a click reports), or None for idle gaps and unknown ops."""
    if isinstance(figure, Chart):
        meta = figure.traces[trace_index].get("meta")
    else:
        meta = figure.data[trace_index].meta
    return _op_id(meta, point_index)


def _op_id(meta: Any, point_index: int) -> str | None:
    if not isinstance(meta, dict) or not meta.get("op_ids"):
        return None
    ids = meta["op_ids"].split("\n")  # newline-separated, one per bar
    return ids[point_index] or None if point_index < len(ids) else None


def gantt_widget(
    result: SimResult,
    function: Function | None = None,
    on_select: Callable[[str], Any] | None = None,
    *,
    title: str | None = None,
) -> Chart:
    """The Gantt chart as a live chart; clicking a bar calls ``on_select(op_id)``.

    Pass ``graph_view.select`` as ``on_select`` to select the op in a GraphView.
    """
    chart = Chart(*gantt_spec(result, function, title=title))
    if on_select is not None:
        connect_clicks(chart, on_select)
    return chart


def connect_clicks(chart: Chart, on_select: Callable[[str], Any]) -> None:
    """Route bar clicks of a Gantt chart to ``on_select(op_id)`` (whatever it shows later:
    the op ids are read from the traces shown when the click comes)."""

    def handler(_trace: int, point: int, trace: dict[str, Any]) -> None:
        found = _op_id(trace.get("meta"), point)
        if found is not None:
            on_select(found)

    chart.on_click(handler)
