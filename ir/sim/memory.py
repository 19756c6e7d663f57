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
    slot_bytes: list[int],
    slot_device: list[int],
    use_slots: list[int],
    use_count: list[int],
    slot_producer: list[int],
    pinned: list[int],
    inst_start: np.ndarray,
    inst_end: np.ndarray,
    capacity_bytes: list[float],
    devices: list[int],
    step_time_s: float,
) -> MemoryCurves:
    """Sweep allocation and free events per device (vectorised with numpy)."""
    size = np.asarray(slot_bytes, dtype=np.float64)
    dev = np.asarray(slot_device, dtype=np.int64)
    # a slot's last use: the latest end among the instances that read it (-1: none)
    last = np.full(len(size), -1.0)
    if len(use_slots):
        reader = np.repeat(np.arange(len(use_count)), np.asarray(use_count, dtype=np.int64))
        np.maximum.at(last, np.asarray(use_slots, dtype=np.int64), inst_end[reader])
    producer = np.asarray(slot_producer, dtype=np.int64)
    freed = np.ones(len(size), dtype=bool)
    if len(pinned):
        freed[np.asarray(pinned, dtype=np.int64)] = False
    made = producer >= 0
    safe = np.maximum(producer, 0)
    alloc = np.where(made, inst_start[safe] if len(inst_start) else 0.0, 0.0)
    produced_end = np.where(made, inst_end[safe] if len(inst_end) else 0.0, 0.0)
    free = np.where(last >= 0, last, produced_end)
    # events: frees of the unpinned slots, then allocations of every slot; a stable sort
    # by device and time keeps frees before allocations at equal times
    n_freed = int(freed.sum())
    ev_dev = np.concatenate([dev[freed], dev])
    ev_t = np.concatenate([free[freed], alloc])
    ev_delta = np.concatenate([-size[freed], size])
    ev_inst = np.concatenate([np.full(n_freed, -1, np.int64), producer])
    order = np.lexsort((ev_t, ev_dev))
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
