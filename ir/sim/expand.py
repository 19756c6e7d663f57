"""A simulation's op runs and slots as numpy columns: :func:`expand`.

The engine keeps *units* (an op run, or one application of a scheduled pmap body, see
``ir.sim.bodies``) on the devices it walked (one per rank class). A result that asks for
events, busy times or memory gets every op run of those devices, in program order, with
each application's ops laid out from its body's schedule: its segments' bases plus the
schedule's offsets, the same numbers the walk would have found. The expansion is done
with numpy, a body's applications together.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from ..op import Op
    from .bodies import BodyTiming
    from .engine import Engine


@dataclass
class Columns:
    """Every op run of the walked devices (index ``i``), and every slot (index ``s``).

    ``where[i]``: the compute device index, or -1 for a transfer (``comm`` lists those
    runs, ``participants`` and ``channels`` theirs in the same order). ``end`` is the end
    the engine found (a body's base plus the durations run since), ``dur`` the op's own
    duration. Slots: bytes, device index, producer run (-1: a function input),
    allocation and free times, and whether it is ever freed (function inputs and outputs
    are not)."""

    where: np.ndarray
    start: np.ndarray
    end: np.ndarray
    dur: np.ndarray
    flops: np.ndarray
    nbytes: np.ndarray
    comm: np.ndarray
    participants: list[tuple[int, ...]]
    channels: list[tuple[int, ...]]
    slot_bytes: np.ndarray
    slot_device: np.ndarray
    slot_producer: np.ndarray
    slot_alloc: np.ndarray
    slot_free: np.ndarray
    slot_freed: np.ndarray
    top: np.ndarray | None = None  # per run, the index of its top-level op
    _engine: Any = field(repr=False, default=None)
    _ops: list | None = field(repr=False, default=None)

    def __len__(self) -> int:
        return len(self.where)

    @property
    def ops(self) -> list[Op]:
        """The op of each run (built on first use)."""
        if self._ops is None:
            e = self._engine
            ops: list = list(e.inst_op)
            if e.app_unit:  # an application's unit becomes its body's ops
                out: list = []
                last = 0
                for unit, schedule in zip(e.app_unit, e.app_schedule):
                    out += ops[last:unit]
                    out += schedule.ops
                    last = unit + 1
                out += ops[last:]
                ops = out
            self._ops = ops
        return self._ops


def expand(e: Engine) -> Columns:
    """The engine's units and applications as :class:`Columns`."""
    units = len(e.inst_op)
    length = np.ones(units, dtype=np.int64)
    app_units = np.asarray(e.app_unit, dtype=np.int64)
    if len(app_units):
        length[app_units] = [schedule.num_ops for schedule in e.app_schedule]
    pos = np.zeros(units, dtype=np.int64)
    if units:
        np.cumsum(length[:-1], out=pos[1:])
    total = int(length.sum())
    plain = np.ones(units, dtype=bool)
    plain[app_units] = False
    plain_units = np.flatnonzero(plain)
    at = pos[plain_units]

    where = np.empty(total, dtype=np.int64)
    start = np.empty(total)
    end = np.empty(total)
    dur = np.empty(total)
    flops = np.empty(total)
    nbytes = np.empty(total)
    unit_where = np.fromiter(
        (w if w.__class__ is int else -1 for w in e.inst_where), dtype=np.int64, count=units
    )
    where[at] = unit_where[plain_units]
    start[at] = np.asarray(e.inst_start, dtype=np.float64)[plain_units]
    end[at] = np.asarray(e.inst_end, dtype=np.float64)[plain_units]
    dur[at] = np.asarray(e.inst_dur, dtype=np.float64)[plain_units]
    costs = e.inst_cost
    flops[at] = np.fromiter(
        (costs[u][0] for u in plain_units.tolist()), dtype=np.float64, count=len(plain_units)
    )
    nbytes[at] = np.fromiter(
        (costs[u][1] for u in plain_units.tolist()), dtype=np.float64, count=len(plain_units)
    )

    # slots: the engine's, then each application's own (values its body does not return)
    n_slots = len(e.slot_ready)
    extra = sum(len(schedule.internal) for schedule in e.app_schedule)
    slot_bytes = np.empty(n_slots + extra)
    slot_bytes[:n_slots] = e.slot_bytes
    slot_device = np.empty(n_slots + extra, dtype=np.int64)
    slot_device[:n_slots] = e.slot_device
    unit_of = np.asarray(e.slot_producer, dtype=np.int64)
    producer = np.full(n_slots + extra, -1, dtype=np.int64)
    made = unit_of >= 0
    producer[:n_slots][made] = pos[unit_of[made]]  # plain units; made slots fixed below
    last = np.full(n_slots + extra, -np.inf)  # the latest end among a slot's readers
    if e.use_slots:
        counts = np.asarray(e.use_count, dtype=np.int64)
        reader = np.repeat(pos, counts)
        np.maximum.at(last, np.asarray(e.use_slots, dtype=np.int64), end[reader])

    # one numpy pass per body shape and device model: a timing is one schedule's on one
    # model, shared by the bodies of its shape (BodySchedule.like), whose tables are alike
    groups: dict[BodyTiming, list[int]] = {}
    for a, timing in enumerate(e.app_timing):
        groups.setdefault(timing, []).append(a)
    in_start = np.zeros(len(app_units) + 1, dtype=np.int64)
    np.cumsum([schedule.num_inputs for schedule in e.app_schedule], out=in_start[1:])
    columns = (where, start, end, dur, flops, nbytes, slot_bytes, slot_device, producer, last)
    app_columns = (
        pos[app_units],
        unit_where[app_units],
        np.asarray(e.app_base, dtype=np.float64),
        in_start,
        np.asarray(e.app_in_slots, dtype=np.int64),
        np.asarray(e.app_first, dtype=np.int64),
    )
    next_slot = n_slots
    schedules = e.app_schedule
    for timing, apps in groups.items():
        schedule = schedules[apps[0]]
        next_slot = _expand_group(e, schedule, timing, apps, app_columns, columns, next_slot)

    comm_units = np.asarray(e.comm_instances, dtype=np.int64)
    alloc = np.zeros(len(producer))
    has = producer >= 0
    alloc[has] = start[producer[has]]
    produced_end = np.zeros(len(producer))
    produced_end[has] = end[producer[has]]
    free = np.where(last > -np.inf, last, produced_end)
    # the top-level op of each run: the last op whose first unit starts at or before it
    first_run = np.append(pos, total)[np.asarray(e.top_start, dtype=np.int64)]
    top = np.searchsorted(first_run, np.arange(total), side="right") - 1
    freed = np.ones(len(producer), dtype=bool)
    if e.pinned:
        freed[np.asarray(e.pinned, dtype=np.int64)] = False
    return Columns(
        where=where,
        start=start,
        end=end,
        dur=dur,
        flops=flops,
        nbytes=nbytes,
        comm=pos[comm_units] if len(comm_units) else comm_units,
        participants=[e.inst_where[u] for u in e.comm_instances],
        channels=list(e.comm_channels),
        slot_bytes=slot_bytes,
        slot_device=slot_device,
        slot_producer=producer,
        slot_alloc=alloc,
        slot_free=free,
        slot_freed=freed,
        top=top,
        _engine=e,
    )


def _expand_group(
    e: Engine,
    schedule: Any,
    timing: Any,
    apps: list[int],
    app_columns: tuple[np.ndarray, ...],
    columns: tuple[np.ndarray, ...],
    next_slot: int,
) -> int:
    """Lay out applications ``apps`` (of one schedule on one device model) in the columns;
    return the next free slot index."""
    where, start, end, dur, flops, nbytes, slot_bytes, slot_device, producer, last = columns
    app_pos, app_device, app_base, in_start, in_slots, app_first = app_columns
    n = schedule.num_ops
    count = len(apps)
    index = np.asarray(apps, dtype=np.int64)
    first = app_pos[index]
    runs = first[:, None] + np.arange(n)[None, :]
    offsets = np.asarray(timing.offsets(0))
    bases = app_base[index]
    starts = bases[:, None] + offsets[None, :-1]
    ends = bases[:, None] + offsets[None, 1:]
    waited = e.app_segments
    for i, a in enumerate(apps):
        segments = waited.get(a)
        if segments is None:
            continue
        for j, (s, base) in enumerate(segments):
            stop = segments[j + 1][0] if j + 1 < len(segments) else n
            offs = np.asarray(timing.offsets(s)[: stop - s + 1])
            starts[i, s:stop] = base + offs[:-1]
            ends[i, s:stop] = base + offs[1:]
    devices = app_device[index]
    start[runs] = starts
    end[runs] = ends
    dur[runs] = np.asarray(timing.durations)[None, :]
    where[runs] = devices[:, None]
    flops[runs] = schedule.flops[None, :]
    nbytes[runs] = schedule.nbytes[None, :]
    # every local value's slot, per application: inputs, made outputs, own values
    slots = np.empty((count, len(schedule.value_bytes)), dtype=np.int64)
    n_in = schedule.num_inputs
    if n_in:
        slots[:, :n_in] = in_slots[in_start[index][:, None] + np.arange(n_in)[None, :]]
    made = np.asarray(schedule.made, dtype=np.int64)
    if len(made):
        firsts = app_first[index]
        made_slots = firsts[:, None] + np.arange(len(made))[None, :]
        slots[:, made] = made_slots
        producer[made_slots] = first[:, None] + schedule.producer[made][None, :]
    internal = schedule.internal
    if len(internal):
        own = next_slot + np.arange(count * len(internal)).reshape(count, len(internal))
        slots[:, internal] = own
        slot_bytes[own] = np.asarray(schedule.value_bytes, dtype=np.float64)[internal][None, :]
        slot_device[own] = devices[:, None]
        producer[own] = first[:, None] + schedule.producer[internal][None, :]
        next_slot += count * len(internal)
    read = np.flatnonzero(schedule.last_reader >= 0)
    if len(read):
        read_slots = slots[:, read]
        read_ends = ends[:, schedule.last_reader[read]]
        np.maximum.at(last, read_slots.ravel(), read_ends.ravel())
    return next_slot
