"""The memory view: live bytes per device over a simulated step (plotly).

One step curve per device (device colours as in the graph view), its peak
marked, the device capacity as a dashed line, and the part of a curve above
capacity drawn thick and red with the op that ran out of memory named.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import plotly.graph_objects as go

from ir.verify import describe_op

from .live import TEMPLATE
from .palette import OOM_COLOR, device_color
from .units import byte_unit, format_bytes, format_time, time_unit

if TYPE_CHECKING:
    from ir.sim import SimResult

CAPACITY_OFF_SCALE = 4.0  # capacity above this many times the highest peak is not drawn to scale


def memory_traces(
    result: SimResult,
    *,
    time_unit_: tuple[str, float] | None = None,
    bytes_unit: tuple[str, float] | None = None,
    prefix: str = "",
    dash: str = "solid",
    end_s: float | None = None,
    devices: Sequence[int] | None = None,
) -> list[dict[str, Any]]:
    """Curve, peak marker and (if any) out-of-memory segment per device, and capacity lines.

    Only the highest peak is labelled in text (the others on hover); capacity
    lines run to ``end_s`` (default: the step time). Every trace's ``meta`` says
    what it is: ``{"kind": "live"|"peak"|"oom"|"capacity", "device": id}``, with
    y in ``bytes_unit`` and x in ``time_unit_``.

    ``devices`` (default: the ones the result uses) lists the devices to give a
    curve and a peak marker; those the result does not use get empty, hidden
    ones, and nothing else (capacity lines are those of the devices used). A
    live view passes the devices of every program it has shown, so that it can
    redraw in place when the next program uses fewer.
    """
    t_name, t_size = time_unit_ or time_unit(result.step_time_s)
    b_name, b_size = bytes_unit or byte_unit(max(result.peak_memory_bytes.values(), default=1))
    traces: list[dict[str, Any]] = []
    highest = max(result.devices, key=lambda d: result.peak_memory_bytes[d], default=None)
    capacities: dict[float, list[int]] = {}
    used = set(result.devices)
    slots = list(result.devices if devices is None else devices)
    listed = set(slots)
    slots += [d for d in result.devices if d not in listed]  # never leave one out
    for device in slots:
        color = device_color(device)
        if device not in used:
            traces += _hidden_device(device, color, dash, prefix)
            continue
        capacity = result.topology.device(device).memory_bytes
        capacities.setdefault(capacity, []).append(device)
        times, live = result.memory_timeline(device)
        traces.append(
            dict(
                type="scatter",
                x=times / t_size,
                y=live / b_size,
                mode="lines",
                line={"shape": "hv", "color": color, "dash": dash},
                name=f"{prefix}device {device}",
                legendgroup=f"{prefix}device {device}",
                hovertemplate=f"%{{y:.4g}} {b_name} at %{{x:.4g}} {t_name}<extra>{prefix}"
                f"device {device}</extra>",
                visible=True,
                meta={"kind": "live", "device": device},
            )
        )
        peak = result.peak_memory_bytes[device]
        at = float(times[int(np.argmax(live))]) if len(live) else 0.0
        traces.append(
            dict(
                type="scatter",
                x=[at / t_size],
                y=[peak / b_size],
                mode="markers+text",
                marker={"symbol": "triangle-down", "size": 11, "color": color},
                text=[f"peak {format_bytes(peak)}" if device == highest else ""],
                textposition="top center",
                name=f"{prefix}peak, device {device}",
                legendgroup=f"{prefix}device {device}",
                showlegend=False,
                hovertemplate=f"peak {format_bytes(peak)} at {format_time(at)}<extra></extra>",
                visible=True,
                meta={"kind": "peak", "device": device},
            )
        )
        op = result.oom.get(device)
        if op is not None:
            over = np.where(live > capacity, live, np.nan)
            traces.append(
                dict(
                    type="scatter",
                    x=times / t_size,
                    y=over / b_size,
                    mode="lines",
                    line={"shape": "hv", "color": OOM_COLOR, "width": 5},
                    name=f"{prefix}out of memory: device {device}",
                    hovertemplate=f"device {device} out of memory at {describe_op(op)}"
                    "<extra></extra>",
                    meta={"kind": "oom", "device": device, "op": describe_op(op)},
                )
            )
    for capacity, devices in capacities.items():
        who = "" if len(capacities) == 1 else f" (devices {', '.join(map(str, devices))})"
        traces.append(
            dict(
                type="scatter",
                x=[0, (end_s if end_s is not None else result.step_time_s) / t_size],
                y=[capacity / b_size] * 2,
                mode="lines",
                line={"color": "#444444", "dash": "dash", "width": 1},
                name=f"{prefix}capacity {format_bytes(capacity)}{who}",
                hoverinfo="name",
                meta={"kind": "capacity", "devices": devices},
            )
        )
    return traces


def _hidden_device(device: int, color: str, dash: str, prefix: str) -> list[dict[str, Any]]:
    """The curve and peak traces of a device the program does not use: empty, hidden,
    with the keys of the visible ones (a live update sets every one of them)."""
    name = f"{prefix}device {device}"
    return [
        dict(
            type="scatter",
            x=np.zeros(0),
            y=np.zeros(0),
            mode="lines",
            line={"shape": "hv", "color": color, "dash": dash},
            name=name,
            legendgroup=name,
            hovertemplate="",
            visible=False,
            meta={"kind": "live", "device": device},
        ),
        dict(
            type="scatter",
            x=[],
            y=[],
            mode="markers+text",
            marker={"symbol": "triangle-down", "size": 11, "color": color},
            text=[],
            textposition="top center",
            name=f"{prefix}peak, device {device}",
            legendgroup=name,
            showlegend=False,
            hovertemplate="",
            visible=False,
            meta={"kind": "peak", "device": device},
        ),
    ]


def y_top_bytes(peak_bytes: float, capacity_bytes: float) -> float:
    """Top of the memory axis: the capacity if it is near the peak, else the peak
    (a 80 GB line would flatten a 10 MB curve)."""
    if capacity_bytes <= CAPACITY_OFF_SCALE * peak_bytes:
        return max(peak_bytes, capacity_bytes)
    return peak_bytes


def memory_figure(result: SimResult, *, title: str | None = None) -> go.Figure:
    """Live bytes per device over the step, with peaks, capacity and out-of-memory marked."""
    traces, layout = memory_spec(result, title=title)
    return go.Figure(data=traces, layout={**layout, "template": TEMPLATE})


def memory_spec(
    result: SimResult, *, title: str | None = None, devices: Sequence[int] | None = None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The memory view as plain plotly dicts (traces, layout without a template).

    ``devices``: as in :func:`memory_traces` (a live view passes the topology's).
    """
    t_unit = time_unit(result.step_time_s)
    peak = max(result.peak_memory_bytes.values(), default=0.0)
    b_unit = byte_unit(peak or 1)
    traces = memory_traces(result, time_unit_=t_unit, bytes_unit=b_unit, devices=devices)
    capacity = min(result.topology.device(d).memory_bytes for d in result.devices)
    top = y_top_bytes(peak, capacity)
    ooms = list(result.oom)
    default = f"peak {format_bytes(peak)}" + (f"; out of memory on devices {ooms}" if ooms else "")
    if capacity > CAPACITY_OFF_SCALE * peak:
        default += f" (capacity {format_bytes(capacity)} is above the plot)"
    layout = {
        "title": {"text": title or default},
        "xaxis": {"title": {"text": f"time ({t_unit[0]})"}},
        "yaxis": {
            "title": {"text": f"live memory ({b_unit[0]})"},
            "range": [0, 1.15 * top / b_unit[1]],
        },
        "height": 380,
        # as the Gantt: title at the left, tool bar on hover, the legend under the time axis
        "margin": {"l": 10, "r": 10, "t": 40, "b": 80},
        "legend": {
            "orientation": "h",
            "x": 0,
            "xanchor": "left",
            "yref": "container",
            "y": 0,
            "yanchor": "bottom",
        },
    }
    layout["title"] = {**layout["title"], "x": 0, "xanchor": "left"}
    return traces, layout
