"""What part of a simulated step a Gantt chart shows: a time window's events, the
idle gaps, and whether there are too many events to draw one bar each.

Pure numpy over :class:`ir.sim.result.Bars`; :mod:`widgets.gantt` draws the result.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from ir.errors import DistIRError
from ir.sim.result import Bars

if TYPE_CHECKING:
    from ir.sim import SimResult

SUMMARY_ABOVE_EVENTS = 3000  # events on one device above which the chart summarises


class GanttError(DistIRError, ValueError):
    """A Gantt chart was asked for something it cannot show (e.g. an empty time window)."""


def check_window(result: SimResult, window: tuple[float, float] | None) -> tuple[float, float]:
    """``window`` as ``(start_s, end_s)`` within the step; the whole step for None."""
    if window is None:
        return 0.0, result.step_time_s
    try:
        t0, t1 = (float(t) for t in window)
    except (TypeError, ValueError):
        raise GanttError(
            f"window must be (start_s, end_s), two times in seconds; got {window!r}"
        ) from None
    if not (np.isfinite(t0) and np.isfinite(t1) and t0 < t1):
        raise GanttError(
            f"window ({t0!r}, {t1!r}) is empty or not finite: give start_s < end_s, in "
            f"seconds within the step (0 to {result.step_time_s:.6g} s)"
        )
    return t0, t1


def window_bars(bars: Bars, start_s: float, end_s: float) -> Bars:
    """The bars that overlap ``[start_s, end_s)`` (whole, not cut at the edges)."""
    (idx,) = np.nonzero((bars.start_s < end_s) & (bars.start_s + bars.dur_s > start_s))
    return Bars(
        ops=tuple(bars.ops[i] for i in idx.tolist()),
        device=bars.device[idx],
        stream=bars.stream[idx],
        start_s=bars.start_s[idx],
        dur_s=bars.dur_s[idx],
        flops=bars.flops[idx],
        bytes=bars.bytes[idx],
        top=None if bars.top is None else bars.top[idx],
    )


def summarised(bars: Bars, summary_above: int | None = SUMMARY_ABOVE_EVENTS) -> bool:
    """Whether a Gantt of ``bars`` draws summary bars: a device has more than
    ``summary_above`` events (never for None)."""
    return summary_above is not None and busiest(bars) > summary_above


def busiest(bars: Bars, stream: int | None = None) -> int:
    """The most events one device has in ``bars`` (of ``stream``: 0 compute, 1
    communication; None: both)."""
    device = bars.device if stream is None else bars.device[bars.stream == stream]
    if not len(device):
        return 0
    return int(np.bincount(device - device.min()).max())


def idle_intervals(
    result: SimResult, device: int, window: tuple[float, float] | None = None
) -> list[tuple[float, float]]:
    """Gaps in the step (or in ``window``) when ``device`` has neither compute nor
    communication running."""
    bars = result.bars
    mine = bars.device == device
    t0, t1 = check_window(result, window)
    lo = np.clip(bars.start_s[mine], t0, t1)
    return _gaps(lo, np.clip(bars.start_s[mine] + bars.dur_s[mine], t0, t1), t0, t1)


def _gaps(lo: np.ndarray, hi: np.ndarray, t0: float, t1: float) -> list[tuple[float, float]]:
    """The gaps in [t0, t1] that no ``[lo, hi)`` span covers."""
    order = np.argsort(lo, kind="stable")
    lo, hi = lo[order], hi[order]
    # reach[k]: covered up to, before span k (the last: after every span)
    starts = np.maximum.accumulate(np.concatenate([[t0], hi]))
    ends = np.concatenate([lo, [t1]])
    tiny = 1e-9 * max(t1, 1e-30)
    keep = ends - starts > tiny
    return list(zip(starts[keep].tolist(), ends[keep].tolist()))
