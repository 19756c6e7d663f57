"""The Gantt chart's bars: one row per device and stream of a simulated step (plotly dicts).

Compute bars take their device's colour (as in the graph and the memory view) and
one trace per device, so the legend names each device's colour; communication is
near-black and idle gaps grey and hatched, colours no device has. A training step's
backward work is drawn in a lighter shade of its device's colour than its forward
work, and a pipeline's bars are labelled with their phase and microbatch (``F3``,
``B3``: the 1F1B picture; :mod:`widgets.phases`). Hovering a bar shows the op, its
shapes, start, duration, flops and bytes; each bar carries its op id (``op-3``,
``op-3.1``, as in the graph view) so a click can select the op in the graph.
"""

from __future__ import annotations

import html
from typing import TYPE_CHECKING, Any

import numpy as np

from ir.function import Function
from ir.op import Op
from ir.sim.result import Bars

from .breakdown import step_breakdown
from .chart import from_typed_array, typed_array
from .gantt_blocks import BLOCKS_ABOVE_EVENTS, merge_blocks
from .ids import op_paths, shape_label
from .palette import COMMUNICATION_BAR, IDLE_BAR, device_color
from .phases import BACKWARD, FORWARD, Role, op_roles
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
_STREAM_LABEL = {"compute": "comp", "communication": "comm", "idle": "comp"}
BACKWARD_OPACITY = 0.55  # a backward bar: its device's colour, lighter
BAR_ROWS = 0.8  # a bar's thickness, in rows
SUBPIXEL = 5e-4  # of the time shown: under a pixel of a 2,000 px wide chart
COMMUNICATION_NAME = "communication"
IDLE_NAME = "idle (bubble, waiting)"


def row_label(device: int, stream: str, prefix: str = "") -> str:
    """The y-axis label of one device's stream: ``dev 3 · comp``, ``dev 3 · comm``."""
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
    blocks_above: int | None = BLOCKS_ABOVE_EVENTS,
) -> tuple[list[dict[str, Any]], list[str]]:
    """The bar traces (plotly trace dicts) and the row labels.

    One compute trace per device (named ``device 3``, in its colour), then one
    communication trace and one idle trace, then (bar by bar only) a text trace that
    labels a pipeline's tasks (``F3``, ``B3``, kind ``labels``). Rows run device by
    device, compute above communication; idle gaps sit on the compute row; each bar's
    row is its ``y``.
    Each trace's ``meta`` holds its kind (``compute``, ``communication``, ``idle``),
    its device (compute) and the op id of every bar (``""`` for idle gaps). Times are
    divided by ``unit[1]`` (default: the unit that suits the step time).

    Above ``summary_above`` events on one device, each device gets one summary bar
    on its compute row instead (compute, exposed communication, idle: see
    :mod:`widgets.breakdown`): thousands of slivers show nothing and cost seconds.
    ``window`` (``(start_s, end_s)``) keeps only the events that overlap it, and the
    idle gaps within it: zoomed in far enough, a summarised step shows its events
    (the limit applies to the events in the window). Between the two, above
    ``blocks_above`` compute events on a device, a task's consecutive ops are one bar
    (:mod:`widgets.gantt_blocks`; its ``meta["blocks"]`` says so); ``None`` draws each.
    """
    unit = unit or time_unit(result.step_time_s)
    t0, t1 = check_window(result, window)
    bars = result.bars if window is None else window_bars(result.bars, t0, t1)
    rows = [row_label(d, s, prefix) for d in result.devices for s in STREAMS]
    if summarised(bars, summary_above):
        traces = _summary_traces(result, unit, prefix, None if window is None else (t0, t1))
    else:
        traces = _event_traces(result, bars, function, unit, prefix, (t0, t1), window, blocks_above)
    for trace in traces:
        trace["showlegend"] = showlegend and trace["showlegend"]
    return traces, rows


def _event_traces(
    result, bars, function, unit, prefix, span, window, blocks_above
) -> list[dict[str, Any]]:
    """One bar per event (per device compute traces, communication) and the idle gaps;
    above ``blocks_above`` compute events in all, one bar per block of a task's
    consecutive ops (:mod:`widgets.gantt_blocks`)."""
    position = {d: 2 * i for i, d in enumerate(result.devices)}
    devices = np.asarray(result.devices, dtype=np.int64)
    order = np.argsort(devices, kind="stable")
    # each bar's device among the result's (any ids: negative, sparse, huge)
    row_of_bar = 2 * order[np.searchsorted(devices, bars.device, sorter=order)] + bars.stream
    ids, texts, labels, phases = _bar_texts(bars, function)
    numbers = np.column_stack([bars.start_s, bars.dur_s, bars.flops, bars.bytes, bars.device])
    compute = bars.stream == 0
    merge = blocks_above is not None and int(compute.sum()) > blocks_above
    # gaps under a pixel at 2,000 px across the time shown merge: blocks look as the ops do
    gap_s = SUBPIXEL * (span[1] - span[0])
    traces = []
    runs: list[tuple[float, int, str]] = []  # (middle, row, label) of each labelled task
    for d in result.devices:
        (idx,) = np.nonzero(compute & (bars.device == d))
        parts = numbers[idx], ids[idx], texts[idx], labels[idx], phases[idx]
        if merge:
            op_types = np.array([bars.ops[i].op_type for i in idx.tolist()], dtype=object)
            merged = merge_blocks(parts[0], parts[1], parts[3], parts[4], op_types, gap_s)
            parts = merged[0], merged[1], merged[2], merged[3], merged[4]
        row = np.full(len(parts[0]), position[d], dtype=np.int64)
        trace = _bars(row, "compute", parts[0], parts[1], parts[2], unit, prefix)
        _device_look(trace, d, prefix)
        trace["marker"]["opacity"] = np.where(parts[4] == BACKWARD, BACKWARD_OPACITY, 1.0)
        trace["meta"]["blocks"] = merge
        traces.append(trace)
        runs += _task_runs(parts[0][:, 0], parts[0][:, 1], parts[3], position[d])
    comm_parts: list[tuple[np.ndarray, ...]] = []  # rows, numbers, ids, texts
    for d in result.devices if merge else ():  # back-to-back transfers: one block
        (idx,) = np.nonzero(~compute & (bars.device == d))
        op_types = np.array([bars.ops[i].op_type for i in idx.tolist()], dtype=object)
        blank = np.full(len(idx), "", dtype=object)
        merged = merge_blocks(numbers[idx], ids[idx], blank, blank, op_types, gap_s, "transfers")
        rows = np.full(len(merged[0]), position[d] + 1, dtype=np.int64)
        comm_parts.append((rows, merged[0], merged[1], merged[2]))
    if not merge:
        (idx,) = np.nonzero(~compute)
        comm_parts.append((row_of_bar[idx], numbers[idx], ids[idx], texts[idx]))
    rows, comm_numbers, comm_ids, comm_texts = (
        np.concatenate([p[k] for p in comm_parts]) if comm_parts else np.zeros((0, 5))
        for k in range(4)
    )
    traces.append(
        _bars(
            rows, "communication", comm_numbers.reshape(-1, 5), comm_ids, comm_texts, unit, prefix
        )
    )
    idle_rows, idle_numbers = [], []
    for d in result.devices:
        for lo, hi in idle_intervals(result, d, None if window is None else span):
            idle_rows.append(position[d])
            idle_numbers.append((lo, hi - lo, 0.0, 0.0, d))
    numbers = np.array(idle_numbers, dtype=np.float64).reshape(-1, 5)
    blank = np.full(len(numbers), "", dtype=object)
    idle = np.full(len(numbers), "idle", dtype=object)
    traces.append(
        _bars(np.array(idle_rows, dtype=np.int64), "idle", numbers, blank, idle, unit, prefix)
    )
    traces.append(_labels_trace(runs, unit))
    return traces


def _task_runs(
    start_s: np.ndarray, dur_s: np.ndarray, labels: np.ndarray, row: int
) -> list[tuple[float, int, str]]:
    """One ``(middle_s, row, label)`` per run of one device's bars with the same label
    (``F3``: microbatch 3's forward on this stage), unlabelled bars inside a run ignored:
    the 1F1B picture labels tasks, not each of their ops."""
    order = np.argsort(start_s, kind="stable")
    runs: list[tuple[float, int, str]] = []
    current, first, last = "", 0.0, 0.0
    for i in order.tolist():
        label = labels[i]
        if not label:
            continue
        if label != current:
            if current:
                runs.append(((first + last) / 2, row, current))
            current, first = label, float(start_s[i])
        last = float(start_s[i] + dur_s[i])
    if current:
        runs.append(((first + last) / 2, row, current))
    return runs


def _labels_trace(runs: list[tuple[float, int, str]], unit: tuple[str, float]) -> dict[str, Any]:
    """The pipeline's task labels (``F3``, ``B3``) as text over the bars (no hover, no
    legend entry); empty when the step has no microbatches."""
    return dict(
        type="scatter",
        mode="text",
        x=np.array([m for m, _, _ in runs], dtype=np.float64) / unit[1],
        y=np.array([r for _, r, _ in runs], dtype=np.int32),
        text=np.array([t for _, _, t in runs], dtype=object),
        textfont={"size": 10, "color": "#111111"},
        hoverinfo="skip",
        name="microbatch tasks",
        showlegend=False,
        meta={"kind": "labels", "op_ids": "", "labelled": bool(runs)},
    )


def _summary_traces(
    result: SimResult,
    unit: tuple[str, float],
    prefix: str,
    window: tuple[float, float] | None = None,
) -> list[dict[str, Any]]:
    """One compute trace per device, then communication and idle, one bar per device
    each, laid end to end on the device's compute row from the window's start: its step
    time (or the window's time), broken down."""
    parts = step_breakdown(result, window)
    start_s = 0.0 if window is None else window[0]
    per_kind: dict[str, list[tuple[int, tuple[float, ...], str]]] = {}
    for i, p in enumerate(parts):
        spans = (p.compute_s, p.exposed_communication_s, p.idle_s)
        for k, kind in enumerate(("compute", "communication", "idle")):
            share = spans[k] / p.step_s if p.step_s else 0.0
            what = "exposed communication" if kind == "communication" else kind
            text = (
                f"{what}: {format_time(spans[k])} ({share:.0%}) of {p.events} events"
                "<br>(zoom in on a time window to see its events)"
            )
            number = (start_s + sum(spans[:k]), spans[k], 0.0, 0.0, p.device)
            per_kind.setdefault(kind, []).append((2 * i, number, text))
    traces = []
    for key in [("compute", p.device) for p in parts] + [("communication",), ("idle",)]:
        kind = key[0]
        chosen = [
            e for i, e in enumerate(per_kind[kind]) if len(key) == 1 or parts[i].device == key[1]
        ]
        rows = [r for r, _, _ in chosen]
        array = np.array([n for _, n, _ in chosen], dtype=np.float64).reshape(-1, 5)
        texts = np.array([t for _, _, t in chosen], dtype=object)
        ids = np.full(len(array), "", dtype=object)
        trace = _bars(rows, kind, array, ids, texts, unit, prefix)
        if kind == "compute":
            _device_look(trace, key[1], prefix)
        trace["name"] += " (summary)"
        trace["meta"]["summary"] = True
        traces.append(trace)
    return traces


def _device_look(trace: dict[str, Any], device: int, prefix: str) -> None:
    trace["marker"]["color"] = device_color(device)
    trace["name"] = f"{prefix}device {device}"
    trace["legendgroup"] = f"device {device}"
    trace["meta"]["device"] = device


def _bar_texts(
    bars: Bars, function: Function | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per bar, its op id (``""`` when unknown), hover text, label (``F3``, ``B3`` or
    ``""``) and phase (``F``, ``B``, ``U``, ``""`` when unknown), as object arrays.

    Each distinct op is described once; per-device copies of an op share their
    type objects' shape labels. All are built per op, then spread over the
    bars by index: thousands of bars, a few microseconds each counts. A bar's
    microbatch is its top-level op's (a pmap body may be shared by every microbatch's
    pmap), else its op's own.
    """
    ops = bars.ops
    unique = list(dict.fromkeys(ops))
    index = dict(zip(unique, range(len(unique))))
    of_bar = np.fromiter(map(index.__getitem__, ops), dtype=np.int64, count=len(ops))
    paths = op_paths(function) if function is not None else {}
    ids = np.array(
        ["" if (p := paths.get(op)) is None else "op-" + p for op in unique], dtype=object
    )
    roles = op_roles(function) if function is not None else {}
    found = [roles.get(op) for op in unique]
    phase = np.array(["" if r is None else r.phase for r in found], dtype=object)[of_bar]
    microbatch = np.array([_mb(r) for r in found], dtype=np.int64)[of_bar]
    if function is not None and bars.top is not None and len(function.ops):
        of_top = np.array([_mb(roles.get(op)) for op in function.ops], dtype=np.int64)
        top = of_top[np.clip(bars.top, 0, len(function.ops) - 1)]
        microbatch = np.where(top >= 0, top, microbatch)
    labels = np.full(len(ops), "", dtype=object)
    if len(set(microbatch.tolist()) - {-1}) > 1:  # a pipeline's picture: several microbatches
        task = (microbatch >= 0) & ((phase == FORWARD) | (phase == BACKWARD))
        labels[task] = phase[task] + microbatch[task].astype(str).astype(object)
    texts = np.array(_op_texts(unique), dtype=object)
    return ids[of_bar], texts[of_bar], labels, phase


def _mb(role: Role | None) -> int:
    return -1 if role is None or role.microbatch is None else role.microbatch


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
    # Numeric arrays travel to the browser as typed arrays, repeated strings as a table
    # (widgets.chart). Rows go as int32: plotly.js has no int64 arrays.
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
        width=BAR_ROWS,  # every trace's bars one row high, whatever rows it has
        marker=_marker(kind),
        name=COMMUNICATION_NAME if kind == "communication" else IDLE_NAME,
        legendgroup=kind,
        showlegend=True,
        # one string, not a list of thousands: see op_id_at
        meta={"kind": kind, "op_ids": "\n".join(ids)},
    )


def _marker(kind: str) -> dict[str, Any]:
    marker: dict[str, Any] = {"line": {"width": 0.5, "color": "#ffffff"}}
    if kind == "communication":  # often a sliver: no white edge to wash it out
        marker.update(color=COMMUNICATION_BAR, line={"width": 0})
    elif kind == "idle":
        marker.update(color=IDLE_BAR, pattern={"shape": "/", "fgcolor": "#bdbdbd"})
    return marker


def bar_colors(trace: Any) -> list[str]:
    """The colour each bar of a Gantt trace (a dict or a plotly trace) is drawn in."""
    return [trace["marker"]["color"]] * len(trace["x"])


def bar_numbers(trace: Any) -> np.ndarray:
    """The ``customdata`` of a Gantt trace as an ``(n, 5)`` array (see :data:`START_S`)."""
    data = trace["customdata"] if isinstance(trace, dict) else trace.customdata
    if isinstance(data, dict):
        data = from_typed_array(data)
    return np.asarray(data, dtype=np.float64).reshape(-1, DEVICE + 1)
