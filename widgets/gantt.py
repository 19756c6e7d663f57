"""The Gantt view: one row per device and stream of a simulated step (plotly).

Compute bars, communication bars and idle gaps have their own colours and
legend entries. Hovering a bar shows the op, its shapes, start, duration, flops
and bytes; each bar carries its op id (``op-3``, ``op-3.1``, as in the graph
view) so a click can select the op in the graph.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import plotly.graph_objects as go

from ir.function import Function
from ir.op import Op

from .ids import op_id, op_paths, shape_label
from .palette import COMMUNICATION_BAR, COMPUTE_BAR, IDLE_BAR
from .units import format_bytes, format_flops, format_time, time_unit

if TYPE_CHECKING:
    from ir.sim import SimResult

STREAMS = ("compute", "communication")
# customdata columns of every bar
OP_ID, LABEL, SHAPES, START, DURATION, FLOPS, BYTES = range(7)
_HOVER = (
    "<b>%{customdata[1]}</b><br>%{customdata[2]}<br>start %{customdata[3]}, "
    "duration %{customdata[4]}<br>%{customdata[5]}, %{customdata[6]}<extra>%{y}</extra>"
)
_KIND_COLOR = {"compute": COMPUTE_BAR, "communication": COMMUNICATION_BAR, "idle": IDLE_BAR}


def row_label(device: int, stream: str, prefix: str = "") -> str:
    """The y-axis label of one device's stream: ``dev 3 · compute``."""
    return f"{prefix}dev {device} · {'comm' if stream == 'communication' else stream}"


def op_shapes(op: Op) -> str:
    """``8×4, 4×3 → 8×3``: operand and result shapes of an op."""
    ins = ", ".join(shape_label(v.type) for v in op.inputs)
    outs = ", ".join(shape_label(v.type) for v in op.outputs)
    return f"{ins} → {outs}"


def gantt_traces(
    result: SimResult,
    function: Function | None = None,
    *,
    unit: tuple[str, float] | None = None,
    prefix: str = "",
    showlegend: bool = True,
) -> tuple[list[go.Bar], list[str]]:
    """The bar traces (one per device and stream, plus idle per device) and row labels.

    Rows run device by device, compute above communication. Times are divided
    by ``unit[1]`` (default: the unit that suits the step time).
    """
    unit = unit or time_unit(result.step_time_s)
    paths = op_paths(function) if function is not None else {}
    rows: list[str] = []
    traces: list[go.Bar] = []
    shown: set[str] = set()
    for device in result.devices:
        for stream in STREAMS:
            events = result.events_on(device, stream)
            row = row_label(device, stream, prefix)
            rows.append(row)
            if events:
                kind = "compute" if stream == "compute" else "communication"
                data = [_custom(ev, paths) for ev in events]
                traces.append(_bars(row, kind, events, data, unit, prefix, showlegend, shown))
        gaps = idle_intervals(result, device)
        if gaps:
            data = [
                ["", "idle", "", format_time(lo), format_time(hi - lo), "", ""] for lo, hi in gaps
            ]
            row = row_label(device, "compute", prefix)
            traces.append(_bars(row, "idle", gaps, data, unit, prefix, showlegend, shown))
    return traces, rows


def _custom(ev: Any, paths: dict[Op, str]) -> list[str]:
    op = ev.op
    path = paths.get(op)
    return [
        op_id(path) if path is not None else "",
        f"{op.op_type} → {', '.join(v.name for v in op.outputs)}",
        op_shapes(op),
        format_time(ev.start_s),
        format_time(ev.dur_s),
        format_flops(ev.flops),
        format_bytes(ev.bytes),
    ]


def _bars(row, kind, spans, data, unit, prefix, showlegend, shown) -> go.Bar:
    if isinstance(spans[0], tuple):
        starts = [lo for lo, _ in spans]
        durs = [hi - lo for lo, hi in spans]
    else:
        starts = [ev.start_s for ev in spans]
        durs = [ev.dur_s for ev in spans]
    legend = kind
    bar = go.Bar(
        orientation="h",
        y=[row] * len(spans),
        base=[s / unit[1] for s in starts],
        x=[d / unit[1] for d in durs],
        customdata=data,
        hovertemplate=_HOVER if kind != "idle" else "idle %{customdata[4]}<extra>%{y}</extra>",
        marker={
            "color": _KIND_COLOR[kind],
            "line": {"width": 0.5, "color": "#ffffff"},
            "pattern": {"shape": "/" if kind == "idle" else ""},
        },
        name=legend,
        legendgroup=legend,
        showlegend=showlegend and legend not in shown,
        meta={"kind": kind, "row": row},
    )
    shown.add(legend)
    return bar


def idle_intervals(result: SimResult, device: int) -> list[tuple[float, float]]:
    """Gaps in the step when ``device`` has neither compute nor communication running."""
    spans = sorted((ev.start_s, ev.start_s + ev.dur_s) for ev in result.events_on(device))
    gaps: list[tuple[float, float]] = []
    reach = 0.0
    for lo, hi in spans:
        if lo > reach:
            gaps.append((reach, lo))
        reach = max(reach, hi)
    if result.step_time_s > reach:
        gaps.append((reach, result.step_time_s))
    tiny = 1e-9 * max(result.step_time_s, 1e-30)
    return [(lo, hi) for lo, hi in gaps if hi - lo > tiny]


def gantt_figure(
    result: SimResult, function: Function | None = None, *, title: str | None = None
) -> go.Figure:
    """The Gantt chart of a simulated step; pass ``function`` so bars know their op ids."""
    unit = time_unit(result.step_time_s)
    traces, rows = gantt_traces(result, function, unit=unit)
    fig = go.Figure(traces)
    fig.update_layout(
        barmode="overlay",
        title=title or f"step {format_time(result.step_time_s)} on {len(result.devices)} devices",
        xaxis={"title": f"time ({unit[0]})", "range": [0, result.step_time_s / unit[1] * 1.01]},
        yaxis={"categoryorder": "array", "categoryarray": rows[::-1], "title": None},
        height=max(220, 60 + 28 * len(rows)),
        margin={"l": 10, "r": 10, "t": 40, "b": 40},
        legend={"orientation": "h", "y": -0.15},
        hoverlabel={"align": "left"},
        template="plotly_white",
    )
    return fig


def op_id_at(figure: go.Figure, trace_index: int, point_index: int) -> str | None:
    """The op id of one bar (what a click reports), or None for idle gaps and unknown ops."""
    data = figure.data[trace_index].customdata
    if data is None:
        return None
    found = data[point_index][OP_ID]
    return found or None


def gantt_widget(
    result: SimResult,
    function: Function | None = None,
    on_select: Callable[[str], Any] | None = None,
    *,
    title: str | None = None,
) -> go.FigureWidget:
    """The Gantt chart as a live widget; clicking a bar calls ``on_select(op_id)``.

    Pass ``graph_view.select`` as ``on_select`` to select the op in a GraphView.
    """
    widget = go.FigureWidget(gantt_figure(result, function, title=title))
    if on_select is not None:
        connect_clicks(widget, on_select)
    return widget


def connect_clicks(widget: go.FigureWidget, on_select: Callable[[str], Any]) -> None:
    """Route bar clicks of a Gantt FigureWidget to ``on_select(op_id)``."""

    def handler(trace: Any, points: Any, _state: Any) -> None:
        for i in points.point_inds:
            found = op_id_at(widget, points.trace_index, i)
            if found is not None:
                on_select(found)
                return

    for trace in widget.data:
        trace.on_click(handler)
