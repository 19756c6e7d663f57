"""Where each device's step time goes: compute, exposed communication, idle.

Communication that runs while the device computes costs nothing; what the step
waits for is the *exposed* part. Used by the Gantt chart's summary bars when a
device has too many events to draw one bar each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

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
