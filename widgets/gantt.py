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

from .breakdown import step_breakdown
from .ids import op_paths, shape_label
from .live import TEMPLATE, from_typed_array, live_figure, typed_array
from .palette import COMMUNICATION_BAR, COMPUTE_BAR, DEVICE_PALETTE, IDLE_BAR
from .timeline import (
    SUMMARY_ABOVE_EVENTS,
    check_window,
    idle_intervals,
    summarised,
    window_bars,
)
from .units import format_time, time_unit

if TYPE_CHECKING:
    from ir.sim import SimResult

STREAMS = ("compute", "communication")
# customdata columns of every bar: numbers, formatted by the browser (d3 SI prefixes)
START_S, DUR_S, FLOPS, BYTES, DEVICE = range(5)
_HOVER = (
    "%{hovertext}<br>start %{customdata[0]:.4s}s, duration %{customdata[1]:.4s}s"
    "<br>%{customdata[2]:.3s}FLOP, %{customdata[3]:.3s}B"
)
_IDLE_HOVER = "idle from %{customdata[0]:.4s}s for %{customdata[1]:.4s}s"
_STREAM_LABEL = {"compute": "compute", "communication": "comm", "idle": "compute"}
_KIND_COLOR = {"compute": COMPUTE_BAR, "communication": COMMUNICATION_BAR, "idle": IDLE_BAR}
_KIND_NAME = {
    "compute": "compute (its device's colour)",
    "communication": "communication",
    "idle": "idle",
}
# compute bars take their device's colour, as in the graph and the memory view: a
# numeric colour per bar (sent as a binary array) on a stepwise palette colour scale
_N = len(DEVICE_PALETTE)
DEVICE_COLORSCALE = [
    [round((k + edge) / _N, 6), color] for k, color in enumerate(DEVICE_PALETTE) for edge in (0, 1)
]


def device_color_values(device: np.ndarray) -> np.ndarray:
    """Each bar's position on :data:`DEVICE_COLORSCALE` (cmin 0, cmax len(palette)):
    the middle of its device's band, so plotly picks exactly the palette colour."""
    return np.mod(np.asarray(device, dtype=np.int64), _N).astype(np.float64) + 0.5


def _summary_traces(
    result: SimResult,
    unit: tuple[str, float],
    prefix: str,
    window: tuple[float, float] | None = None,
) -> list[dict]:
    """The three traces (compute, communication, idle), one bar per device each, laid
    end to end on the device's compute row from the window's start: its step time (or
    the window's time), broken down."""
    parts = step_breakdown(result, window)
    start_s = 0.0 if window is None else window[0]
    kinds = ("compute", "communication", "idle")
    traces = []
    for k, kind in enumerate(kinds):
        rows, numbers, texts = [], [], []
        for i, p in enumerate(parts):
            spans = (p.compute_s, p.exposed_communication_s, p.idle_s)
            base = start_s + sum(spans[:k])
            rows.append(2 * i)
            numbers.append((base, spans[k], 0.0, 0.0, p.device))
            share = spans[k] / p.step_s if p.step_s else 0.0
            what = "exposed communication" if kind == "communication" else kind
            texts.append(
                f"{what}: {format_time(spans[k])} ({share:.0%}) of {p.events} events"
                "<br>(zoom in on a time window to see its events)"
            )
        array = np.array(numbers, dtype=np.float64).reshape(-1, 5)
        ids = np.full(len(array), "", dtype=object)
        trace = _bars(rows, kind, array, ids, np.array(texts, dtype=object), unit, prefix)
        trace["name"] = f"{_KIND_NAME[kind]} (summary)"
        trace["meta"]["summary"] = True
        traces.append(trace)
    return traces


def row_label(device: int, stream: str, prefix: str = "") -> str:
    """The y-axis label of one device's stream: ``dev 3 · compute``."""
    return f"{prefix}dev {device} · {_STREAM_LABEL[stream]}"


def gantt_traces(
    result: SimResult,
    function: Function | None = None,
    *,
    unit: tuple[str, float] | None = None,
    prefix: str = "",
    showlegend: bool = True,
    summary_above: int | None = SUMMARY_ABOVE_EVENTS,
    window: tuple[float, float] | None = None,
) -> tuple[list[dict[str, Any]], list[str]]:
    """The bar traces (plotly trace dicts) and the row labels.

    Above ``summary_above`` events on one device, each device gets one summary bar
    on its compute row instead (compute, exposed communication, idle: see
    :mod:`widgets.breakdown`): thousands of slivers show nothing and cost seconds.
    ``window`` (``(start_s, end_s)``) keeps only the events that overlap it, and the
    idle gaps within it: zoomed in far enough, a summarised step shows its events
    (the limit applies to the events in the window).

    Three traces, always in this order and always present (possibly empty), so a
    live figure can update them in place: compute bars, communication bars and
    idle gaps; each bar's row is its ``y``. Rows run device by device, compute
    above communication; idle gaps sit on the compute row. Times are divided by
    ``unit[1]`` (default: the unit that suits the step time). Each trace's
    ``meta`` holds its kind and the op id of every bar (``""`` for idle gaps).
    """
    unit = unit or time_unit(result.step_time_s)
    t0, t1 = check_window(result, window)
    bars = result.bars if window is None else window_bars(result.bars, t0, t1)
    rows = [row_label(d, s, prefix) for d in result.devices for s in STREAMS]
    if summarised(bars, summary_above):
        traces = _summary_traces(result, unit, prefix, None if window is None else (t0, t1))
        for trace in traces:
            trace["showlegend"] = showlegend
        return traces, rows
    position = {d: 2 * i for i, d in enumerate(result.devices)}
    # each bar's device among the result's (any ids: negative, sparse, huge)
    devices = np.asarray(result.devices, dtype=np.int64)
    order = np.argsort(devices, kind="stable")
    row_of_bar = 2 * order[np.searchsorted(devices, bars.device, sorter=order)] + bars.stream
    ids, texts = _bar_texts(bars.ops, function)
    numbers = np.column_stack([bars.start_s, bars.dur_s, bars.flops, bars.bytes, bars.device])
    traces = []
    for stream, kind in enumerate(STREAMS):
        (idx,) = np.nonzero(bars.stream == stream)
        traces.append(
            _bars(row_of_bar[idx], kind, numbers[idx], ids[idx], texts[idx], unit, prefix)
        )
    idle_rows, idle_numbers = [], []
    for d in result.devices:
        for lo, hi in idle_intervals(result, d, None if window is None else (t0, t1)):
            idle_rows.append(position[d])
            idle_numbers.append((lo, hi - lo, 0.0, 0.0, d))
    numbers = np.array(idle_numbers, dtype=np.float64).reshape(-1, 5)
    idle_ids = np.full(len(numbers), "", dtype=object)
    idle = np.full(len(numbers), "idle", dtype=object)
    traces.append(
        _bars(np.array(idle_rows, dtype=np.int64), "idle", numbers, idle_ids, idle, unit, prefix)
    )
    for trace in traces:
        trace["showlegend"] = showlegend
    return traces, rows


def _bar_texts(ops: tuple[Op, ...], function: Function | None) -> tuple[np.ndarray, np.ndarray]:
    """Per bar, its op id (``""`` when unknown) and hover text, as object arrays.

    Each distinct op is described once; per-device copies of an op share their
    type objects' shape labels. Both are built per op, then spread over the
    bars by index: thousands of bars, a few microseconds each counts.
    """
    unique = list(dict.fromkeys(ops))
    index = dict(zip(unique, range(len(unique))))
    of_bar = np.fromiter(map(index.__getitem__, ops), dtype=np.int64, count=len(ops))
    paths = op_paths(function) if function is not None else {}
    ids = np.array(
        ["" if (p := paths.get(op)) is None else "op-" + p for op in unique], dtype=object
    )
    return ids[of_bar], np.array(_op_texts(unique), dtype=object)[of_bar]


def _op_texts(ops: list[Op]) -> list[str]:
    """The hover text of each op: its type, result names, operand and result shapes.

    Shape labels are made once per type object (a repeated layer's and a device's
    copies share theirs). The loop is inlined, a call per value costs a third of it.
    """
    labels: dict[int, str] = {}  # id(type) -> label
    get = labels.get
    texts = []
    for op in ops:
        ins, outs = op.inputs, op.outputs
        parts = []
        for v in ins:
            t = v.type
            found = get(id(t))
            if found is None:
                found = labels[id(t)] = shape_label(t)
            parts.append(found)
        if len(outs) == 1:
            v = outs[0]
            names, t = v.name, v.type
            result = get(id(t))
            if result is None:
                result = labels[id(t)] = shape_label(t)
        else:
            names = ", ".join([v.name for v in outs])
            result = ", ".join([_label(v.type, labels) for v in outs])
        if "<" in names or "&" in names or ">" in names:  # names are hints: any text is allowed
            names = html.escape(names, quote=False)
        # op types are registry identifiers: no escaping
        texts.append(f"<b>{op.op_type} → {names}</b><br>{', '.join(parts)} → {result}")
    return texts


def _label(t: Any, labels: dict[int, str]) -> str:
    found = labels.get(id(t))
    if found is None:
        found = labels[id(t)] = shape_label(t)
    return found


def _bars(y, kind, numbers, ids, texts, unit, prefix) -> dict[str, Any]:
    # Only numeric arrays and one string array per trace: numeric arrays travel to
    # the browser as binary buffers; every string list is walked item by item. Rows
    # go as int32: plotly sends int64 arrays (no such typed array in plotly.js) as lists.
    where = f"<extra>{html.escape(prefix)}dev %{{customdata[{DEVICE}]}} · {_STREAM_LABEL[kind]}"
    return dict(
        type="bar",
        orientation="h",
        y=np.asarray(y, dtype=np.int32),
        base=numbers[:, 0] / unit[1],
        x=numbers[:, 1] / unit[1],
        customdata=typed_array(numbers),
        hovertext=texts,
        hovertemplate=(_HOVER if kind != "idle" else _IDLE_HOVER) + where + "</extra>",
        marker=_marker(kind, numbers[:, DEVICE]),
        name=_KIND_NAME[kind],
        legendgroup=kind,
        # one string, not a list of thousands: see op_id_at
        meta={"kind": kind, "op_ids": "\n".join(ids)},
    )


def _marker(kind: str, device: np.ndarray) -> dict[str, Any]:
    marker: dict[str, Any] = {
        "color": _KIND_COLOR[kind],
        "line": {"width": 0.5, "color": "#ffffff"},
        "pattern": {"shape": "/" if kind == "idle" else ""},
    }
    if kind == "compute":
        marker.update(
            color=device_color_values(device),
            colorscale=DEVICE_COLORSCALE,
            cmin=0,
            cmax=_N,
            showscale=False,
        )
    return marker


def bar_colors(trace: Any) -> list[str]:
    """The colour each bar of a Gantt trace (a dict or a plotly trace) is drawn in."""
    marker = trace["marker"]
    color, count = marker["color"], len(trace["x"])
    if isinstance(color, str):
        return [color] * count
    return [DEVICE_PALETTE[int(v)] for v in np.asarray(color, dtype=np.float64)]


def bar_numbers(trace: Any) -> np.ndarray:
    """The ``customdata`` of a Gantt trace as an ``(n, 5)`` array (see :data:`START_S`)."""
    data = trace["customdata"] if isinstance(trace, dict) else trace.customdata
    if isinstance(data, dict):
        data = from_typed_array(data)
    return np.asarray(data, dtype=np.float64).reshape(-1, DEVICE + 1)


def gantt_figure(
    result: SimResult,
    function: Function | None = None,
    *,
    title: str | None = None,
    window: tuple[float, float] | None = None,
    summary_above: int | None = SUMMARY_ABOVE_EVENTS,
) -> go.Figure:
    """The Gantt chart of a simulated step; pass ``function`` so bars know their op ids.

    ``window=(start_s, end_s)`` shows that time window's events (see :func:`gantt_traces`):
    how a step too long to draw bar by bar is seen in detail.
    """
    traces, layout = gantt_spec(
        result, function, title=title, window=window, summary_above=summary_above
    )
    return go.Figure(data=traces, layout={**layout, "template": TEMPLATE})


def gantt_spec(
    result: SimResult,
    function: Function | None = None,
    *,
    title: str | None = None,
    window: tuple[float, float] | None = None,
    summary_above: int | None = SUMMARY_ABOVE_EVENTS,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The Gantt chart as plain plotly dicts (traces, layout without a template).

    What :func:`gantt_figure` wraps, and what a live widget updates itself from
    (:func:`widgets.live.show`) without building a Figure first. The time unit is the
    step's, window or not, so that a zoomed view keeps its axis.
    """
    unit = time_unit(result.step_time_s)
    traces, rows = gantt_traces(
        result, function, unit=unit, window=window, summary_above=summary_above
    )
    heading = title or f"step {format_time(result.step_time_s)} on {len(result.devices)} devices"
    t0, t1 = check_window(result, window)
    if window is not None:
        heading += f" · {format_time(t0)} to {format_time(t1)}"
    if traces[0]["meta"].get("summary"):
        heading += " · summary per device: zoom in to see events"
    x_range = [0, t1 / unit[1] * 1.01] if window is None else [t0 / unit[1], t1 / unit[1]]
    layout = {
        "barmode": "overlay",
        "title": {"text": heading},
        "xaxis": {"title": {"text": f"time ({unit[0]})"}, "range": x_range},
        "yaxis": {
            "tickmode": "array",
            "tickvals": list(range(len(rows))),
            "ticktext": rows,
            "autorange": "reversed",
        },
        "height": max(220, 60 + 28 * len(rows)),
        "margin": {"l": 10, "r": 10, "t": 40, "b": 40},
        "legend": {"orientation": "h", "x": 1, "xanchor": "right", "y": 1.0, "yanchor": "bottom"},
        "hoverlabel": {"align": "left"},
    }
    return traces, layout


def op_id_at(figure: go.Figure, trace_index: int, point_index: int) -> str | None:
    """The op id of one bar (what a click reports), or None for idle gaps and unknown ops."""
    meta = figure.data[trace_index].meta
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
) -> go.FigureWidget:
    """The Gantt chart as a live widget; clicking a bar calls ``on_select(op_id)``.

    Pass ``graph_view.select`` as ``on_select`` to select the op in a GraphView.
    """
    widget = live_figure(*gantt_spec(result, function, title=title))
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
