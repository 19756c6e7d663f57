"""Repeated tasks timed from an earlier run of them: :class:`TaskMemo`.

A ``Task`` op (``ir.ops.control``) is one stage's forward or backward of one microbatch,
the same body applied once per microbatch (``T.megatron(tasks=True)``). What one
application does depends only on the times it starts from: when each of its inputs is
ready, and when each stream it uses is free (the compute streams and host clocks of
its devices, the channels of its transfers). The engine's clock is exact below
``EXACT_BELOW_S`` (whole ticks, ``ir.sim.clock.on_clock``), so the walk is
shift-invariant there: an application whose start times are an earlier one's, all
later by the same delta, ends the same way, every time later by exactly that delta.

In a pipeline's steady state every microbatch's task meets its stage as the one before
met it (for 1F1B, one forward and one backward per slot, the same waits): the start
times of application ``k + 1`` are those of ``k`` shifted. So the memo keys a body's
walked applications by their start times relative to the latest of them, and an
application whose relative start times are a walked one's is not walked: its units,
slots and events are the walked one's, renumbered and shifted (a replay). Warm-up and
cool-down, whose waits differ, are walked; each distinct phase is walked once. The
result is the walk's to the last bit (``tests/sim/test_sim_task_memo.py`` compares
every column of the engine with the memo on and off).

What an application reads of the engine, and so the key: the ready times of its input
slots, and per device the compute stream's and host clock's free times and the host's
batch of point-to-point posts (``p2p_posted``, ``p2p_waited``), per channel its free
time. The devices and channels are those the body's first application used (a task's
ops name concrete devices); the aliasing of its input slots (one value passed twice)
is part of the key too.
"""

from __future__ import annotations

from math import inf
from typing import Any

from ..function import Function

# an application is replayed only where every time it reads and makes is below this
# (the engine's clock is exact there; above it the walk rounds, and is walked)
from .clock import EXACT_BELOW_S

# a body whose applications never repeat stops being recorded after this many misses
_GIVE_UP_AFTER = 12


class _Record:
    """One walked application, relative to its anchor (the latest start time it read)."""

    __slots__ = (
        "app_base",
        "app_first",
        "app_in",
        "app_schedule",
        "app_segments",
        "app_timing",
        "app_unit",
        "comm_channels",
        "comm_groups",
        "comm_units",
        "costs",
        "durs",
        "ends",
        "int_outputs",
        "max_rel",
        "ops",
        "outputs",
        "scratch",
        "slot_bytes",
        "slot_device",
        "slot_producer",
        "slot_ready",
        "starts",
        "state",
        "use_count",
        "use_slots",
        "where",
    )


class _Plan:
    """A body's devices and channels (what its applications read), and its records."""

    __slots__ = (
        "channels",
        "devices",
        "group_of",
        "groups",
        "hits",
        "misses",
        "records",
        "stale_hosts",
    )

    def __init__(self, devices: tuple[int, ...], channels: tuple[int, ...]) -> None:
        self.devices = devices
        self.channels = channels
        # the state entries an input slot's readers wait behind (its group: groups[k]),
        # per input slot the index of its group (-1: a reader waits for no stream, so
        # its time always counts; -2: nothing reads it)
        self.groups: list[tuple[int, ...]] = []
        self.group_of: list[int] = []
        self.stale_hosts: list[bool] = []  # state entries never read
        self.records: dict[tuple, _Record] = {}
        self.hits = 0
        self.misses = 0


def _flat(values: list) -> tuple[list[int], Any]:
    """The slots of an application's operand values, in order, and their form: None
    where every value is one plain slot, else each value's (a class's one slot ``~s``,
    a tuple of them): applications of one body may pass a tuple as a class's one slot
    or as its elements, which put the slots at different positions."""
    try:
        if min(values, default=0) >= 0:  # plain slots, the common case
            return list(values), None
        # and class slots (~s)
        return [v if v >= 0 else ~v for v in values], tuple([v < 0 for v in values])
    except TypeError:  # a tuple among them
        pass
    out: list[int] = []
    form = _flat_slots(values, out)
    return out, form


def _flat_slots(values: Any, out: list[int]) -> tuple:
    """Appends the slots of ``values`` (ints, ``~s`` class slots, nested tuples) to
    ``out``, in order; returns their form (True: a class slot, False: a slot)."""
    form: list[Any] = []
    for v in values:
        if v.__class__ is int:
            out.append(v if v >= 0 else ~v)
            form.append(v < 0)
            continue
        if v and all(x.__class__ is int and x >= 0 for x in v):  # a flat tuple of slots
            out.extend(v)
            form.append(len(v))
            continue
        form.append(_flat_slots(v, out))
    return tuple(form)


class TaskMemo:
    """The engine's memo of task applications (see the module docstring)."""

    def __init__(self) -> None:
        self.plans: dict[tuple[Function, Any], _Plan | None] = {}
        self.hits = 0
        self.walked = 0

    # -- entry from the engine's Task rule ----------------------------------------

    def run(self, engine: Any, body: Function, values: list, walk: Any) -> list:
        """The body's output values for this application: replayed from a record where
        one matches, else ``walk()`` (which runs the body and returns them), recorded."""
        plans = self.plans
        slots, form = _flat(values)
        kind = (body, form)  # the positions of the slots: one plan each
        if kind not in plans:  # the first application: walked, and its reach noted
            mark = _mark(engine)
            outs = walk()
            self.walked += 1
            plans[kind] = _plan_of(engine, mark, slots)
            return outs
        plan = plans[kind]
        if plan is None:
            self.walked += 1
            return walk()
        found = _key(engine, plan, slots)
        if found is None:  # times past the exact range
            self.walked += 1
            return walk()
        key, anchor, state, stale = found
        record = plan.records.get(key)
        if record is not None and anchor + record.max_rel < EXACT_BELOW_S:
            plan.hits += 1
            self.hits += 1
            return _replay(engine, plan, record, anchor, slots)
        mark = _mark(engine)
        registers = _registers(engine, plan) if record is None else None
        outs = walk()
        self.walked += 1
        plan.misses += 1
        if record is None:
            made = _record(engine, plan, mark, anchor, slots, (state, stale, registers), outs)
            if made is not None:
                plan.records[key] = made
        if plan.misses >= _GIVE_UP_AFTER and plan.hits == 0:
            plans[kind] = None  # nothing repeats here: stop paying for records
        return outs


# -- the pieces --------------------------------------------------------------------


def _mark(engine: Any) -> tuple[int, ...]:
    return (
        len(engine.inst_op),
        len(engine.slot_ready),
        len(engine.use_slots),
        len(engine.comm_instances),
        len(engine.app_unit),
        len(engine.app_in_slots),
        len(engine.participant_sets),
        len(engine.comm_free),
    )


def _plan_of(engine: Any, mark: tuple[int, ...], slots: list[int]) -> _Plan:
    """What the first application read: the class representatives of every device its
    units ran on or took part from (every participant too, where a transfer holds its
    participants' compute), every channel of its transfers, and for each input slot the
    streams its readers ran on (its guards: a reader waits for its stream anyway)."""
    u0, _, us0, c0, a0, ai0 = mark[:6]
    rep_of = engine.rep_of
    devices: set[int] = set()
    holds = engine.blocking_comm
    inst_where, inst_op = engine.inst_where, engine.inst_op
    for k in range(u0, len(inst_op)):
        where = inst_where[k]
        if where.__class__ is int:
            devices.add(where)
        else:
            devices.update(rep_of[d] for d in where)
            if holds or inst_op[k].attributes.get("stream") == "compute":
                devices.update(where)
    channels: set[int] = set()
    for chans in engine.comm_channels[c0:]:
        channels.update(chans)
    plan = _Plan(tuple(sorted(devices)), tuple(sorted(channels)))
    n = len(plan.devices)
    row = {d: i for i, d in enumerate(plan.devices)}
    row.update({("channel", c): 4 * n + i for i, c in enumerate(plan.channels)})
    channels_of = dict(zip(engine.comm_instances[c0:], engine.comm_channels[c0:]))
    at: dict[int, list[int]] = {}
    for i, s in enumerate(slots):
        at.setdefault(s, []).append(i)
    guards: list[set[int]] = [set() for _ in slots]
    exact: set[int] = set()  # read by a transfer that waits for no channel: its start

    def guard(s: int, streams: list[int]) -> None:
        for i in at.get(s, ()):
            guards[i].update(streams)
            if not streams:
                exact.add(i)

    use, use_slots, use_count = us0, engine.use_slots, engine.use_count
    for k in range(u0, len(inst_op)):
        count = use_count[k]
        if count:
            where = inst_where[k]
            if where.__class__ is int:
                streams = [row[where]]
            else:
                streams = [row["channel", c] for c in channels_of[k]]
                if holds or inst_op[k].attributes.get("stream") == "compute":
                    streams += [row[d] for d in where if d in row]
            for s in use_slots[use : use + count]:
                guard(s, streams)
            use += count
    pos = ai0
    for a in range(a0, len(engine.app_unit)):
        streams = [row[inst_where[engine.app_unit[a]]]]
        k = engine.app_schedule[a].num_inputs
        for s in engine.app_in_slots[pos : pos + k]:
            guard(s, streams)
        pos += k
    groups: dict[tuple[int, ...], int] = {}
    plan.group_of = [
        -1 if i in exact else -2 if not g else groups.setdefault(tuple(sorted(g)), len(groups))
        for i, g in enumerate(guards)
    ]
    plan.groups = list(groups)
    plan.stale_hosts = [False] * (4 * n + len(plan.channels))
    for i, d in enumerate(plan.devices):  # a host clock nothing costs or syncs: never read
        if not engine.hosted and not engine.host_sync[d]:
            plan.stale_hosts[n + i] = True
    return plan


_COLUMNS = ("compute_free", "host_free", "p2p_posted", "p2p_waited")


def _state(engine: Any, plan: _Plan) -> list[float]:
    """The entries an application may read: per device of the plan its compute stream,
    host clock and point-to-point batch (``_COLUMNS``), then per channel its free time."""
    devices = plan.devices
    state: list[float] = []
    for name in _COLUMNS:
        column = getattr(engine, name)
        state.extend([column[d] for d in devices])
    comm_free = engine.comm_free
    state.extend([comm_free[c] for c in plan.channels])
    return state


_REGISTERS = (("seg_base", True), ("seg_off", False), ("host_base", True), ("host_off", False))


def _registers(engine: Any, plan: _Plan) -> list[float]:
    """A pmap run's registers on the plan's devices (``_REGISTERS``, in order)."""
    out: list[float] = []
    for name, _ in _REGISTERS:
        column = getattr(engine, name)
        out.extend([column[d] for d in plan.devices])
    return out


def _key(
    engine: Any, plan: _Plan, slots: list[int]
) -> tuple[tuple, float, list[float], list[bool]] | None:
    """``(key, anchor, state, stale)`` of an application about to run; None where its
    times are past the exact range.

    Entries that cannot affect the application are *stale* and keyed as such, not by
    their times (which drift: a weight ready at 0, a host that never syncs): an input
    ready no later than every stream its readers wait for was free (the plan's groups:
    each reader waits for its stream anyway), a host's batch of posts that its clock
    has passed (read only while the clock equals its last wait), a host clock where no
    host costs time or syncs."""
    ready = engine.slot_ready
    n = len(plan.devices)
    state = _state(engine, plan)
    inputs = [ready[s] for s in slots]
    anchor = max(state) if state else max(inputs, default=0.0)
    if not (
        min(state, default=0.0) >= -1.0
        and anchor < EXACT_BELOW_S
        and max(inputs, default=0.0) < EXACT_BELOW_S
    ):
        return None
    stale = list(plan.stale_hosts)
    for i in range(n):
        if state[3 * n + i] < state[n + i]:  # the host's clock has passed its last wait
            stale[2 * n + i] = stale[3 * n + i] = True
    # an input no later than every stream its readers wait for cannot hold one
    floors = [min([state[j] for j in g]) for g in plan.groups]
    floors += (inf, -inf)  # unread: never counts; read with no stream: always counts
    floor_of = [floors[k] for k in plan.group_of]
    rel_inputs = [t - anchor if t > f else None for t, f in zip(inputs, floor_of)]
    rel_state = [None if s else t - anchor for t, s in zip(state, stale)]
    aliasing = None
    if len(set(slots)) != len(slots):  # one value passed twice
        first: dict[int, int] = {}
        aliasing = tuple([first.setdefault(s, i) for i, s in enumerate(slots)])
    return (aliasing, *rel_inputs, *rel_state), anchor, state, stale


def _record(
    engine: Any,
    plan: _Plan,
    mark: tuple[int, ...],
    anchor: float,
    slots: list[int],
    before: tuple[list[float], list[bool], list[float]],
    outs: list,
) -> _Record | None:
    u0, s0, us0, c0, a0, ai0, p0, ch0 = mark
    if len(engine.participant_sets) != p0 or len(engine.comm_free) != ch0:
        return None  # a new transfer or channel in a later application: not a repeat
    position: dict[int, int] = {}
    for i, s in enumerate(slots):
        position.setdefault(s, i)

    def slot(s: int) -> int:  # made here: s - s0 (>= 0); an input: ~its position
        if s >= s0:
            return s - s0
        p = position.get(s)
        if p is None:
            raise _NotLocalError
        return ~p

    try:
        r = _Record()
        r.ops = engine.inst_op[u0:]
        r.where = engine.inst_where[u0:]
        r.starts = [t - anchor for t in engine.inst_start[u0:]]
        r.ends = [t - anchor for t in engine.inst_end[u0:]]
        r.durs = engine.inst_dur[u0:]
        r.costs = engine.inst_cost[u0:]
        r.use_count = engine.use_count[u0:]
        r.use_slots = _codes([slot(s) for s in engine.use_slots[us0:]])
        r.slot_ready = [t - anchor for t in engine.slot_ready[s0:]]
        r.slot_bytes = engine.slot_bytes[s0:]
        r.slot_device = engine.slot_device[s0:]
        producers = engine.slot_producer[s0:]
        if any(p < u0 for p in producers):
            return None
        r.slot_producer = [p - u0 for p in producers]
        r.comm_units = [k - u0 for k in engine.comm_instances[c0:]]
        r.comm_channels = engine.comm_channels[c0:]
        r.comm_groups = engine.comm_groups[c0:]
        r.app_unit = [k - u0 for k in engine.app_unit[a0:]]
        r.app_schedule = engine.app_schedule[a0:]
        r.app_timing = engine.app_timing[a0:]
        r.app_base = [t - anchor for t in engine.app_base[a0:]]
        r.app_in = _codes([slot(s) for s in engine.app_in_slots[ai0:]])
        r.app_first = [s - s0 for s in engine.app_first[a0:]]
        r.app_segments = [
            (a - a0, tuple((k, t - anchor) for k, t in segs))
            for a, segs in engine.app_segments.items()
            if a >= a0
        ]
        r.outputs = r.int_outputs = None
        if all(v.__class__ is int for v in outs):  # (code, plain or class slot) each
            r.int_outputs = [(slot(v), True) if v >= 0 else (slot(~v), False) for v in outs]
        else:
            r.outputs = [_relocated(v, slot) for v in outs]
    except _NotLocalError:
        return None
    state, stale, registers = before
    after = _state(engine, plan)
    # a stale entry the walk left alone stays as the next application has it (None)
    r.state = [None if s and t == t0 else t - anchor for t, t0, s in zip(after, state, stale)]
    # a pmap run's registers the walk changed: (column, device, value, a time?)
    r.scratch = []
    k = 0
    for name, is_time in _REGISTERS:
        column = getattr(engine, name)
        for d in plan.devices:
            t = column[d]
            if t != registers[k]:
                r.scratch.append((column, d, t - anchor if is_time else t, is_time))
            k += 1
    made = [*r.starts, *r.ends, *r.slot_ready, *r.app_base, *[t for t in r.state if t is not None]]
    r.max_rel = max(made, default=0.0)
    if anchor + r.max_rel >= EXACT_BELOW_S:
        return None
    return r


class _NotLocalError(Exception):
    """A unit read a slot that is neither made by the application nor one of its inputs."""


def _relocated(value: Any, slot: Any) -> Any:
    if value.__class__ is int:
        return slot(value) if value >= 0 else _Class(slot(~value))
    if value and all(v.__class__ is int and v >= 0 for v in value):
        return _Flat(tuple(slot(v) for v in value))
    return tuple(_relocated(v, slot) for v in value)


class _Flat:
    """A flat tuple of slots in a recorded output."""

    __slots__ = ("codes",)

    def __init__(self, codes: tuple[int, ...]) -> None:
        self.codes = codes


class _Class:
    """A rank class's one slot in a recorded output (``~s`` once relocated)."""

    __slots__ = ("slot",)

    def __init__(self, slot: int) -> None:
        self.slot = slot


def _replay(engine: Any, plan: _Plan, r: _Record, anchor: float, slots: list[int]) -> list:
    u0 = len(engine.inst_op)
    s0 = len(engine.slot_ready)
    a0 = len(engine.app_unit)

    engine.inst_op.extend(r.ops)
    engine.inst_where.extend(r.where)
    shift, renumber = anchor.__add__, u0.__add__  # C-level maps, no per-item bytecode
    engine.inst_start.extend(map(shift, r.starts))
    engine.inst_end.extend(map(shift, r.ends))
    engine.inst_dur.extend(r.durs)
    engine.inst_cost.extend(r.costs)
    engine.use_count.extend(r.use_count)
    engine.use_slots.extend(_slots_of(r.use_slots, s0, slots))
    engine.slot_ready.extend(map(shift, r.slot_ready))
    engine.slot_bytes.extend(r.slot_bytes)
    engine.slot_device.extend(r.slot_device)
    engine.slot_producer.extend(map(renumber, r.slot_producer))
    engine.comm_instances.extend(map(renumber, r.comm_units))
    engine.comm_channels.extend(r.comm_channels)
    engine.comm_groups.extend(r.comm_groups)
    if r.app_unit:
        engine.app_unit.extend(map(renumber, r.app_unit))
        engine.app_schedule.extend(r.app_schedule)
        engine.app_timing.extend(r.app_timing)
        engine.app_base.extend(map(shift, r.app_base))
        engine.app_in_slots.extend(_slots_of(r.app_in, s0, slots))
        engine.app_first.extend(map(s0.__add__, r.app_first))
        for a, segs in r.app_segments:
            engine.app_segments[a + a0] = tuple((k, t + anchor) for k, t in segs)
    devices, n = plan.devices, len(plan.devices)
    state = r.state
    for i, name in enumerate(_COLUMNS):
        column = getattr(engine, name)
        for d, t in zip(devices, state[i * n : (i + 1) * n]):
            if t is not None:
                column[d] = t + anchor
    comm_free = engine.comm_free
    for c, t in zip(plan.channels, state[4 * n :]):
        comm_free[c] = t + anchor
    # a pmap run's registers, as the walk leaves them (read only within a run)
    for column, d, t, is_time in r.scratch:
        column[d] = t + anchor if is_time else t
    if r.int_outputs is not None:  # slots and class slots: one pass, no calls
        return [
            (x + s0 if x >= 0 else slots[~x]) if plain else ~(x + s0 if x >= 0 else slots[~x])
            for x, plain in r.int_outputs
        ]
    return [_placed(v, s0, slots) for v in r.outputs]


def _slots_of(codes: tuple[list[int], list[tuple[int, int]]], s0: int, slots: list[int]) -> list:
    """Recorded slot references in this application: ``made[i] + s0`` for the slots it
    makes, then each ``(i, p)`` of ``inputs`` its input slot ``p``."""
    made, inputs = codes
    out = list(map(s0.__add__, made))
    for i, p in inputs:
        out[i] = slots[p]
    return out


def _codes(refs: list[int]) -> tuple[list[int], list[tuple[int, int]]]:
    """``refs`` (made: >= 0, an input: ~its position) as :func:`_slots_of` reads them."""
    return [x if x >= 0 else 0 for x in refs], [(i, ~x) for i, x in enumerate(refs) if x < 0]


def _placed(value: Any, s0: int, slots: list[int]) -> Any:
    """A recorded output's value in this application (slots renumbered)."""
    if value.__class__ is int:
        return value + s0 if value >= 0 else slots[~value]
    if value.__class__ is _Class:
        x = value.slot
        return ~(x + s0 if x >= 0 else slots[~x])
    if value.__class__ is _Flat:  # a flat tuple of slots
        return tuple([x + s0 if x >= 0 else slots[~x] for x in value.codes])
    return tuple([_placed(v, s0, slots) for v in value])
