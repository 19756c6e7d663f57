"""Where each device's step time goes: compute, exposed communication, idle.

Communication that runs while the device computes costs nothing; what the step
waits for is the *exposed* part. *Idle* is the time the device neither computes nor
communicates: in a pipeline, its bubble (a stage waiting for activations or
gradients from its neighbours, at the ends of a 1F1B step and between GPipe's
forward and backward passes on the first stages), elsewhere load imbalance. The
simulator does not record what each wait waited for, so the two are not told apart.
Used by the Gantt chart's summary bars when a device has too many events to draw one
bar each, and drawn beside the Gantt as one stacked bar per device
(:func:`breakdown_html`).
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from .palette import COMMUNICATION_COLOR, device_color, device_label
from .units import format_time

if TYPE_CHECKING:
    from ir.sim import SimResult


@dataclass(frozen=True)
class StepBreakdown:
    """One device's step: ``compute_s + exposed_communication_s + idle_s == step_s``."""

    device: int
    compute_s: float
    exposed_communication_s: float
    idle_s: float
    events: int

    @property
    def step_s(self) -> float:
        return self.compute_s + self.exposed_communication_s + self.idle_s


def union_s(start_s: np.ndarray, end_s: np.ndarray) -> float:
    """Total length of the union of intervals ``[start_s[i], end_s[i])``.

    >>> union_s(np.array([0.0, 1.0, 5.0]), np.array([2.0, 3.0, 6.0]))
    4.0
    """
    if len(start_s) == 0:
        return 0.0
    order = np.argsort(start_s, kind="stable")
    lo, hi = start_s[order], end_s[order]
    reach = np.maximum.accumulate(hi)
    new = np.r_[True, lo[1:] > reach[:-1]]  # a gap before this interval: a new segment
    first = np.flatnonzero(new)
    last = np.r_[first[1:] - 1, len(lo) - 1]
    return float((reach[last] - lo[first]).sum())


def step_breakdown(
    result: SimResult, window: tuple[float, float] | None = None
) -> list[StepBreakdown]:
    """Per device of ``result``: compute time, exposed communication, idle, event count.

    ``window`` (``(start_s, end_s)``): the same within that time window only, events
    cut at its edges; ``events`` counts those that overlap it.
    """
    bars = result.bars
    start, end = bars.start_s, bars.start_s + bars.dur_s
    t0, t1 = (0.0, result.step_time_s) if window is None else window
    inside = (start < t1) & (end > t0) if window is not None else np.ones(len(bars), bool)
    start, end = np.clip(start, t0, t1), np.clip(end, t0, t1)
    out = []
    for d in result.devices:
        mine = inside & (bars.device == d)
        compute = mine & (bars.stream == 0)
        busy = union_s(start[mine], end[mine])
        compute_s = union_s(start[compute], end[compute])
        idle_s = max(t1 - t0 - busy, 0.0)
        out.append(StepBreakdown(int(d), compute_s, busy - compute_s, idle_s, int(mine.sum())))
    return out


_PARTS = (  # (what, attribute, colour: None for the device's)
    ("compute", "compute_s", None),
    ("exposed communication", "exposed_communication_s", COMMUNICATION_COLOR),
    ("idle", "idle_s", "#e0e0e0"),
)


def breakdown_html(result: SimResult, width_px: int = 360) -> str:
    """One stacked bar per device (compute in the device's colour, exposed communication,
    idle) with the shares written out: an offline HTML fragment, no plotly.

    >>> import ir
    >>> b = ir.FunctionBuilder("f")
    >>> x = b.input("x", ir.TensorType((64, 64), device=0))
    >>> ideal = ir.Topology.preset("a100-hgx", 1, ideal=True)  # no host before the first op
    >>> r = ir.simulate(b.finish([b.call("MatMul", x, x)]), ideal)
    >>> "compute 100%" in breakdown_html(r)
    True
    """
    rows = []
    for p in step_breakdown(result):
        total = p.step_s or 1.0
        segments, words = [], []
        for what, attr, color in _PARTS:
            seconds = getattr(p, attr)
            share = seconds / total
            if share <= 0:
                continue
            fill = device_color(p.device) if color is None else color
            style = f"background:{fill};width:{share * width_px:.1f}px"
            segments.append(
                f"<span title='{what}: {format_time(seconds)} ({share:.0%})' "
                f"style='display:inline-block;height:12px;{style}'></span>"
            )
            words.append(f"{what} {share:.0%}")
        rows.append(
            f"<div style='white-space:nowrap;font:11px sans-serif'>"
            f"<span style='display:inline-block;width:4.5em'>{html.escape(device_label(p.device))}"
            f"</span><span style='display:inline-block;width:{width_px}px;"
            f"border:1px solid #999'>{''.join(segments)}</span> {', '.join(words)}</div>"
        )
    legend = (
        "<div style='font:11px sans-serif;color:#555'>Where each device's step goes: compute "
        "(device colour), exposed communication (black), idle (grey: in a pipeline, its "
        "bubble).</div>"
    )
    return f"<div class='distir-breakdown'>{legend}{''.join(rows)}</div>"
