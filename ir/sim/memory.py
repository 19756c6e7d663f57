"""Memory by liveness: per-device live bytes over time, peaks, and where capacity is exceeded.

No explicit ``free``: a value is allocated when the op that produces it starts
and freed when its last consumer finishes (or when its producer finishes, if
nothing reads it). Function inputs (weights, optimizer state, data) are live
from time 0 and function outputs until the end of the step. A tuple value
counts each element on its own device. At equal times frees come before
allocations, as a caching allocator reuses memory freed by a finished kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class MemoryCurves:
    """Per device index: times and live bytes (a step function), peak, first op over capacity."""

    times: dict[int, np.ndarray]
    live_bytes: dict[int, np.ndarray]
    peak_bytes: dict[int, float]
    oom_instance: dict[int, int | None]  # instance index of the op whose allocation overflowed


def memory_curves(
    slot_bytes: np.ndarray,
    slot_device: np.ndarray,
    slot_alloc: np.ndarray,
    slot_free: np.ndarray,
    slot_freed: np.ndarray,
    slot_producer: np.ndarray,
    capacity_bytes: list[float],
    devices: list[int],
    step_time_s: float,
) -> MemoryCurves:
    """Sweep allocation and free events per device (vectorised with numpy): each slot
    is allocated at ``slot_alloc`` by run ``slot_producer`` and, where ``slot_freed``,
    freed at ``slot_free`` (see ``ir.sim.expand.Columns``)."""
    size = np.asarray(slot_bytes, dtype=np.float64)
    dev = np.asarray(slot_device, dtype=np.int64)
    freed = slot_freed
    # events: frees of the unpinned slots, then allocations of every slot, sorted by
    # device and time, frees before allocations at equal times and allocations in program
    # order (a stable sort: a run's results in slot order)
    n_freed = int(freed.sum())
    ev_dev = np.concatenate([dev[freed], dev])
    ev_t = np.concatenate([slot_free[freed], slot_alloc])
    ev_delta = np.concatenate([-size[freed], size])
    ev_inst = np.concatenate([np.full(n_freed, -1, np.int64), slot_producer])
    ev_alloc = np.concatenate([np.zeros(n_freed, np.int8), np.ones(len(dev), np.int8)])
    order = np.lexsort((ev_inst, ev_alloc, ev_t, ev_dev))
    ev_dev, ev_t, ev_delta, ev_inst = ev_dev[order], ev_t[order], ev_delta[order], ev_inst[order]
    times: dict[int, np.ndarray] = {}
    live: dict[int, np.ndarray] = {}
    peaks: dict[int, float] = {}
    ooms: dict[int, int | None] = {}
    wanted = np.asarray(devices, dtype=np.int64)
    bounds = np.searchsorted(ev_dev, wanted, side="left").tolist()
    ends = np.searchsorted(ev_dev, wanted, side="right").tolist()
    for d, lo, hi in zip(devices, bounds, ends):
        t, level, inst = ev_t[lo:hi], np.cumsum(ev_delta[lo:hi]), ev_inst[lo:hi]
        # one point per distinct time: the level after every event at that time
        last_at_time = np.empty(len(t), dtype=bool)
        np.not_equal(t[1:], t[:-1], out=last_at_time[:-1])
        last_at_time[-1:] = True
        t_points, level_points = t[last_at_time], level[last_at_time]
        if not len(t_points) or t_points[0] > 0:
            t_points = np.concatenate([[0.0], t_points])
            level_points = np.concatenate([[0.0], level_points])
        if t_points[-1] < step_time_s:
            t_points = np.concatenate([t_points, [step_time_s]])
            level_points = np.concatenate([level_points, level_points[-1:]])
        times[d], live[d] = t_points, np.maximum(level_points, 0.0)
        peaks[d] = float(live[d].max())
        over = np.flatnonzero(level > capacity_bytes[d])
        ooms[d] = None
        if len(over):
            # the first op allocation at or after the crossing (inputs alone may overflow)
            ops_after = inst[over[0] :]
            ops_after = ops_after[ops_after >= 0]
            ooms[d] = int(ops_after[0]) if len(ops_after) else -1
    return MemoryCurves(times, live, peaks, ooms)
