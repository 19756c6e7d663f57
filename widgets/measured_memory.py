"""Measured against simulated memory: each rank's live bytes over the step, both ways.

A ranked program's :class:`ir.backends.measurement.Measurement` has a memory curve
per rank (``memory_timeline``, the bytes of the tensors its values hold; see
``docs/accuracy.md``), shaped like :meth:`ir.sim.SimResult.memory_timeline`. This
figure draws both on one time axis and one byte axis: measured solid, simulated
dashed, one colour per device, and the peaks both ways in the title.

>>> import ir
>>> from ir.backends.measurement import Measurement
>>> f = ir.models.mlp(4, 3, 5, 2)
>>> sim = ir.simulate(f, ir.Topology.preset("a100-hgx", 1))
>>> timed = [(0, 0.0, 1e-3)]
>>> m = Measurement.from_rank_records({0: f}, {0: [(0.0, timed, [(0.0, 96), (1e-3, 136)])]})
>>> traces, layout = measured_memory_spec(m, sim)
>>> [t["name"] for t in traces]
['measured: device 0', 'simulated: device 0']
>>> traces[0]["y"].tolist()  # bytes here
[96.0, 136.0, 136.0]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import plotly.graph_objects as go

from ir.errors import ExecutionError

from .live import TEMPLATE
from .measured import relative_error
from .palette import device_color
from .units import byte_unit, format_bytes, time_unit

if TYPE_CHECKING:
    from ir.backends.measurement import Measurement
    from ir.sim import SimResult

__all__ = ["measured_memory_figure", "measured_memory_spec"]


def _curve(times: np.ndarray, live: np.ndarray, end_s: float) -> tuple[np.ndarray, np.ndarray]:
    """A step curve held to ``end_s`` (its last value drawn to the step's end)."""
    last = float(times[-1]) if len(times) else 0.0
    value = float(live[-1]) if len(live) else 0.0
    return np.append(times, max(end_s, last)), np.append(live, value)


def measured_memory_spec(
    measured: Measurement, simulated: SimResult
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Per device both live-bytes curves as plain plotly dicts; ``layout["meta"]`` holds
    each device's peaks and their error ``(simulated - measured) / measured``."""
    if not measured.has_memory:
        raise ExecutionError(
            "measured_memory_spec needs a ranked program's measurement (it tracks live "
            "bytes): torch_dist.measure(ir.sharding.lower_to_ranks(program), ...)"
        )
    devices = [d for d in measured.devices if d in simulated.peak_memory_bytes]
    end_s = max(measured.step_time_s, simulated.step_time_s)
    t_name, t_size = time_unit(end_s)
    peak = max([*measured.peak_memory_bytes.values(), *simulated.peak_memory_bytes.values()])
    b_name, b_size = byte_unit(max(peak, 1.0))
    traces, rows = [], []
    for d in devices:
        for prefix, result, dash in (
            ("measured", measured, "solid"),
            ("simulated", simulated, "dash"),
        ):
            times, live = _curve(*result.memory_timeline(d), result.step_time_s)
            traces.append(
                {
                    "type": "scatter",
                    "x": times / t_size,
                    "y": live / b_size,
                    "mode": "lines",
                    "line": {"shape": "hv", "color": device_color(d), "dash": dash},
                    "name": f"{prefix}: device {d}",
                    "hovertemplate": f"%{{y:.4g}} {b_name} at %{{x:.4g}} {t_name}"
                    f"<extra>{prefix}: device {d}</extra>",
                    "meta": {"kind": prefix, "device": d},
                }
            )
        m, s = measured.peak_memory_bytes[d], simulated.peak_memory_bytes[d]
        rows.append({"device": d, "measured_peak_bytes": m, "simulated_peak_bytes": s})
        rows[-1]["peak_error"] = relative_error(s, m)
    highest = max(rows, key=lambda r: r["measured_peak_bytes"], default=None)
    title = "live bytes per device, measured (solid) and simulated (dashed)"
    if highest is not None:
        title += (
            f": highest peak {format_bytes(highest['measured_peak_bytes'])} measured, "
            f"{format_bytes(highest['simulated_peak_bytes'])} simulated "
            f"({highest['peak_error']:+.0%}, device {highest['device']})"
        )
    layout = {
        "title": {"text": title},
        "xaxis": {"title": {"text": f"time ({t_name})"}, "range": [0, end_s / t_size * 1.01]},
        "yaxis": {"title": {"text": f"live ({b_name})"}, "rangemode": "tozero"},
        "height": 320,
        "margin": {"l": 10, "r": 10, "t": 60, "b": 40},
        "meta": {"devices": rows},
    }
    return traces, layout


def measured_memory_figure(measured: Measurement, simulated: SimResult) -> go.Figure:
    """The figure of :func:`measured_memory_spec`."""
    traces, layout = measured_memory_spec(measured, simulated)
    return go.Figure(data=traces, layout={**layout, "template": TEMPLATE})
