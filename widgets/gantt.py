"""The Gantt view: one row per device and stream of a simulated step (plotly).

Compute bars, communication bars and idle gaps have their own colours and
legend entries. Hovering a bar shows the op, its shapes, start, duration, flops
and bytes; each bar carries its op id (``op-3``, ``op-3.1``, as in the graph
view) so a click can select the op in the graph.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import plotly.graph_objects as go

from ir.function import Function
from ir.op import Op

from .ids import op_id, op_paths, shape_label
from .palette import COMMUNICATION_BAR, COMPUTE_BAR, IDLE_BAR
from .units import format_time, time_unit

if TYPE_CHECKING:
    from ir.sim import SimResult

STREAMS = ("compute", "communication")
# customdata columns of every bar: numbers, formatted by the browser (d3 SI prefixes)
START_S, DUR_S, FLOPS, BYTES = range(4)
_HOVER = (
    "%{hovertext}<br>start %{customdata[0]:.4s}s, duration %{customdata[1]:.4s}s"
    "<br>%{customdata[2]:.3s}FLOP, %{customdata[3]:.3s}B<extra>%{y}</extra>"
)
_IDLE_HOVER = "idle from %{customdata[0]:.4s}s for %{customdata[1]:.4s}s<extra>%{y}</extra>"
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
) -> tuple[list[dict[str, Any]], list[str]]:
    """The bar traces (plotly trace dicts: one per device and stream, plus idle per
    device) and the row labels.

    Rows run device by device, compute above communication. Times are divided
    by ``unit[1]`` (default: the unit that suits the step time).
    """
    unit = unit or time_unit(result.step_time_s)
    paths = op_paths(function) if function is not None else {}
    by_row: dict[tuple[int, str], list[Any]] = {}
    for ev in result.events:
        by_row.setdefault((ev.device, ev.stream), []).append(ev)
    described: dict[Op, tuple[str, str]] = {}  # an op runs on many devices: describe once
    shapes: dict[tuple, str] = {}  # per-device copies of an op share their shapes
    rows: list[str] = []
    traces: list[dict[str, Any]] = []
    shown: set[str] = set()
    for device in result.devices:
        busy: list[tuple[float, float]] = []
        for stream in STREAMS:
            events = sorted(by_row.get((device, stream), []), key=lambda ev: ev.start_s)
            row = row_label(device, stream, prefix)
            rows.append(row)
            if events:
                kind = "compute" if stream == "compute" else "communication"
                numbers = np.array([(ev.start_s, ev.dur_s, ev.flops, ev.bytes) for ev in events])
                busy += zip(numbers[:, 0].tolist(), numbers[:, :2].sum(axis=1).tolist())
                texts = [
                    described[ev.op]
                    if ev.op in described
                    else _describe(ev.op, paths, described, shapes)
                    for ev in events
                ]
                traces.append(_bars(row, kind, numbers, texts, unit, showlegend, shown))
        gaps = _gaps(busy, result.step_time_s)
        if gaps:
            numbers = np.array([(lo, hi - lo, 0.0, 0.0) for lo, hi in gaps])
            row = row_label(device, "compute", prefix)
            texts = [("", "idle")] * len(gaps)
            traces.append(_bars(row, "idle", numbers, texts, unit, showlegend, shown))
    return traces, rows


def _describe(
    op: Op,
    paths: dict[Op, str],
    described: dict[Op, tuple[str, str]],
    shapes: dict[tuple, str],
) -> tuple[str, str]:
    """(op id, hover text) of an op."""
    if op not in described:
        path = paths.get(op)
        outs = ", ".join(v.name for v in op.outputs)
        key = (tuple(v.type for v in op.inputs), tuple(v.type for v in op.outputs))
        if key not in shapes:
            shapes[key] = op_shapes(op)
        described[op] = (
            op_id(path) if path is not None else "",
            f"<b>{html.escape(op.op_type)} → {html.escape(outs)}</b><br>{shapes[key]}",
        )
    return described[op]


def _bars(row, kind, numbers, texts, unit, showlegend, shown) -> dict[str, Any]:
    # a plain dict of numeric numpy arrays: plotly validates and copies it in bulk
    bar = dict(
        type="bar",
        orientation="h",
        # fixed-width string arrays, not lists or object arrays: plotly and the widget
        # deep-copy the traces several times, and copying these is one memcpy
        y=np.full(len(numbers), row),
        base=numbers[:, 0] / unit[1],
        x=numbers[:, 1] / unit[1],
        customdata=numbers,
        hovertext=np.array([text for _, text in texts]),
        hovertemplate=_HOVER if kind != "idle" else _IDLE_HOVER,
        marker={
            "color": _KIND_COLOR[kind],
            "line": {"width": 0.5, "color": "#ffffff"},
            "pattern": {"shape": "/" if kind == "idle" else ""},
        },
        name=kind,
        legendgroup=kind,
        showlegend=showlegend and kind not in shown,
        meta={"kind": kind, "row": row, "op_ids": [op for op, _ in texts]},
    )
    shown.add(kind)
    return bar


def idle_intervals(result: SimResult, device: int) -> list[tuple[float, float]]:
    """Gaps in the step when ``device`` has neither compute nor communication running."""
    spans = [(ev.start_s, ev.start_s + ev.dur_s) for ev in result.events_on(device)]
    return _gaps(spans, result.step_time_s)


def _gaps(spans: list[tuple[float, float]], step_time_s: float) -> list[tuple[float, float]]:
    spans = sorted(spans)
    gaps: list[tuple[float, float]] = []
    reach = 0.0
    for lo, hi in spans:
        if lo > reach:
            gaps.append((reach, lo))
        reach = max(reach, hi)
    if step_time_s > reach:
        gaps.append((reach, step_time_s))
    tiny = 1e-9 * max(step_time_s, 1e-30)
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
        legend={"orientation": "h", "x": 1, "xanchor": "right", "y": 1.0, "yanchor": "bottom"},
        hoverlabel={"align": "left"},
        template="plotly_white",
    )
    return fig


def op_id_at(figure: go.Figure, trace_index: int, point_index: int) -> str | None:
    """The op id of one bar (what a click reports), or None for idle gaps and unknown ops."""
    meta = figure.data[trace_index].meta
    if not meta or "op_ids" not in meta:
        return None
    return meta["op_ids"][point_index] or None


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
