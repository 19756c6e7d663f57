"""What a simulation returns: step time, per-device times, events, memory curves, trace export."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from ..device import Topology
from ..op import Op
from ..verify import describe_op
from .engine import Engine, SimulationError
from .expand import Columns, expand
from .memory import MemoryCurves, memory_curves

STREAMS = ("compute", "communication")


@dataclass(frozen=True, slots=True)
class Event:
    """One op occupying one device's stream.

    ``op`` is the Op (for a pmap body op, the same Op on every device); ``label``
    its text. A collective gives one event per participating device, a send
    one on its source and one on its destination. ``channel`` names the
    communication channel of a communication event (``"send 0->1"``, ``"group
    0,1,2,3"`` in device ids; ``"communication"`` with ``comm="serial"``), and
    is ``""`` for a compute event. Events of different channels of one device
    may overlap in time.
    """

    op: Op
    device: int
    stream: str  # "compute" or "communication"
    start_s: float
    dur_s: float
    flops: float
    bytes: float
    kind: str  # the op's kind: "compute" or "communication"
    channel: str = ""

    @property
    def end_s(self) -> float:
        return self.start_s + self.dur_s

    @property
    def label(self) -> str:
        """The op as one line of the text format."""
        return describe_op(self.op)


@dataclass(frozen=True)
class Totals:
    """A step's figures over all its devices: mean compute-busy, idle and communication
    seconds, the largest peak of live bytes, and whether every device holds its peak."""

    mean_busy_s: float
    mean_idle_s: float
    mean_communication_s: float
    max_peak_memory_bytes: float
    fits: bool
    idle_devices: int = 0  # devices of the topology that compute nothing in the step


@dataclass(frozen=True)
class Bars:
    """Every event as columns (what plots read): bar ``i`` is ``ops[i]`` on ``device[i]``.

    The same rows as :attr:`SimResult.events`, in the same order, without an
    object per event. ``stream`` is 0 for compute and 1 for communication.
    """

    ops: tuple[Op, ...]
    device: np.ndarray  # int64 device ids
    stream: np.ndarray  # int8: 0 compute, 1 communication
    start_s: np.ndarray
    dur_s: np.ndarray
    flops: np.ndarray
    bytes: np.ndarray
    # the index (in the function's ops) of the top-level op each bar runs under: the op
    # itself, or the pmap whose body it is (a body shared by several pmaps, e.g. one per
    # microbatch, is told apart by it); None when unknown
    top: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.ops)


class SimResult:
    """The simulated step of one program on one topology.

    ``devices`` are the ids of the devices the program uses, in topology order;
    the per-device dictionaries are keyed by them. Times are in seconds.

    The engine walks one device per rank class and schedules repeated pmap bodies once
    (``ir.sim.bodies``); what a result shows is expanded from that on first use
    (``ir.sim.expand``), and the figures of a class's other members are its
    representative's.
    """

    def __init__(self, engine: Engine) -> None:
        self.topology: Topology = engine.topology
        self.step_time_s: float = engine.step_time_s
        self._e = engine

    @cached_property
    def _c(self) -> Columns:
        return expand(self._e)

    @cached_property
    def _mirrors(self) -> dict[int, list[int]]:
        """Representative device index -> the indices it stands for (itself first), for the
        rank classes the walk simulated once (see Engine._set_classes)."""
        out: dict[int, list[int]] = {}
        for i, rep in enumerate(self._e.rep_of):
            if rep != i:
                out.setdefault(rep, [rep]).append(i)
        return out

    @cached_property
    def _stands_for(self) -> list[tuple[int, ...]]:
        """Per device index, the device indices a compute instance on it stands for."""
        mirrors = self._mirrors
        return [tuple(mirrors.get(i, (i,))) for i in range(len(self._e.rep_of))]

    def _as(self, index: int) -> tuple[int, ...]:
        """The device indices a compute instance on ``index`` stands for."""
        return self._stands_for[index]

    @cached_property
    def _used(self) -> list[int]:
        e = self._e
        used = set(e.slot_device)
        used.update(e.inst_where[i] for i in range(len(e.inst_where)) if i not in self._comm_set)
        for devices in e.participant_sets:
            used.update(devices)
        for rep in list(used):
            used.update(self._mirrors.get(rep, ()))
        return sorted(used)

    @cached_property
    def _used_set(self) -> set[int]:
        return set(self._used)

    @cached_property
    def _comm_set(self) -> set[int]:
        return set(self._e.comm_instances)

    @cached_property
    def devices(self) -> tuple[int, ...]:
        """Ids of the devices the program uses, in topology order."""
        ids = self.topology.device_ids
        return tuple(ids[i] for i in self._used)

    def __repr__(self) -> str:
        return (
            f"<SimResult step_time_s={self.step_time_s:.6g} on {self.topology.name!r}: "
            f"{self.num_ops} op runs on devices {list(self.devices)}>"
        )

    @cached_property
    def _class_size(self) -> np.ndarray:
        size = np.ones(len(self._e.rep_of), dtype=np.int64)
        for rep, members in self._mirrors.items():
            size[rep] = len(members)
        return size

    @property
    def num_ops(self) -> int:
        """Number of op runs in the step (pmap body ops count once per device, a rank
        class's once per member though the walk ran them once; see ``walked_ops``)."""
        where = self._c.where
        compute = where[where >= 0]
        return int(self._class_size[compute].sum()) + int(len(where) - len(compute))

    @property
    def walked_ops(self) -> int:
        """Number of op runs the simulation stands for on the devices it walked (one per
        rank class); a scheduled body's runs are found without walking them."""
        return len(self._c)

    @property
    def scheduled_units(self) -> int:
        """Number of units the engine scheduled one by one: op runs it walked, and
        applications of pmap bodies it scheduled whole (``ir.sim.bodies``)."""
        return len(self._e.inst_op)

    # -- events -----------------------------------------------------------------

    def _event(self, i: int, device: int, channel: str | None) -> Event:
        c = self._c
        op, start, dur = c.ops[i], float(c.start[i]), float(c.dur[i])
        if channel is None:
            return Event(op, device, "compute", start, dur, float(c.flops[i]),
                         float(c.nbytes[i]), "compute")  # fmt: skip
        return Event(op, device, "communication", start, dur, 0.0, float(c.nbytes[i]),
                     "communication", channel)  # fmt: skip

    @cached_property
    def events(self) -> list[Event]:
        """Every event, in program order (a collective's events one per participant)."""
        ids = self.topology.device_ids
        c = self._c
        names = self.channel_names
        comm_at = {int(i): k for k, i in enumerate(c.comm)}
        out: list[Event] = []
        for i, w in enumerate(c.where.tolist()):
            if w >= 0:
                for d in self._as(w):
                    out.append(self._event(i, ids[d], None))
            else:
                k = comm_at[i]
                used = c.channels[k]
                channel = names[used[0]] if used else "local"
                for d in c.participants[k]:
                    out.append(self._event(i, ids[d], channel))
        return out

    @cached_property
    def channel_names(self) -> list[str]:
        """The name of each communication channel (see :attr:`Event.channel`), by index."""
        e = self._e
        if e.serial_comm:
            return ["communication"] * len(e.comm_free)
        ids = self.topology.device_ids
        names = []
        for kind, *devices in e.channel_keys:
            if kind == "send":
                names.append(f"send {ids[devices[0]]}->{ids[devices[1]]}")
            elif kind == "groups":  # a grouped op: (is a send, groups of device ids)
                is_send, groups = devices
                sep = "->" if is_send else ","
                shown = " ".join(sep.join(str(d) for d in g) for g in groups)
                names.append(f"{'sends' if is_send else 'groups'} {shown}")
            else:
                names.append(f"group {','.join(str(ids[d]) for d in devices)}")
        return names

    @cached_property
    def bars(self) -> Bars:
        """The events as numpy columns (see :class:`Bars`); cheaper than :attr:`events`."""
        c = self._c
        where, participants = c.where, c.participants
        n = len(where)
        counts = np.ones(n, dtype=np.int64)
        mirrored = self._mirrors
        compute_at = where >= 0
        if mirrored:  # a representative's compute instance stands for its whole class
            counts[compute_at] = self._class_size[where[compute_at]]
        if len(c.comm):
            counts[c.comm] = [len(devices) for devices in participants]
        rows = np.repeat(np.arange(n), counts)  # the instance of each bar
        device = where[rows]
        compute = device >= 0
        if participants:
            device[~compute] = np.concatenate([np.asarray(p, np.int64) for p in participants])
        if mirrored:  # the class members of each repeated compute bar, in order
            first = np.r_[0, np.cumsum(counts)[:-1]]
            rank = np.arange(len(rows)) - first[rows]
            for rep, members in mirrored.items():
                at = compute & (device == rep)
                device[at] = np.asarray(members, np.int64)[rank[at]]
        ops: list[Op] = []  # an instance once per device it stands for
        for op, count in zip(c.ops, counts.tolist()):
            if count == 1:
                ops.append(op)
            else:
                ops += [op] * count
        ids = np.asarray(self.topology.device_ids, dtype=np.int64)
        return Bars(
            ops=tuple(ops),
            device=ids[device],
            stream=(~compute).astype(np.int8),
            start_s=c.start[rows],
            dur_s=c.dur[rows],
            flops=np.where(compute, c.flops[rows], 0.0),
            bytes=c.nbytes[rows],
            top=c.top[rows],
        )

    def events_on(self, device: int, stream: str | None = None) -> list[Event]:
        """The events of one device (optionally one stream), by start time; only that
        device's runs are built."""
        i = self._device_index(device)
        c = self._c
        found: list[Event] = []
        if stream in (None, "compute"):
            for k in np.flatnonzero(c.where == self._e.rep_of[i]).tolist():
                found.append(self._event(k, device, None))
        if stream in (None, "communication"):
            names = self.channel_names
            for k, (at, devices) in enumerate(zip(c.comm.tolist(), c.participants)):
                if i in devices:
                    used = c.channels[k]
                    found.append(self._event(at, device, names[used[0]] if used else "local"))
        return sorted(found, key=lambda ev: (ev.start_s, ev.stream))

    # -- per-device times -------------------------------------------------------

    @cached_property
    def _spans(self) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        """Per walked device index: its compute runs' (start, end) and its transfers'
        (start, end). A class member has its representative's (checked: every transfer
        that takes a member takes its whole class), else each device its own."""
        c, e = self._c, self._e
        rep_of = e.rep_of
        size = self._class_size
        by_class = True
        set_reps: list[list[int]] = []
        for devices in e.participant_sets:
            members = set(devices)
            reps = sorted({rep_of[d] for d in members})
            by_class &= sum(int(size[r]) for r in reps) == len(members)
            set_reps.append(reps)
        comm_dev: list[int] = []
        comm_run: list[int] = []
        groups = e.comm_groups
        if by_class:
            for k, at in enumerate(c.comm.tolist()):
                reps = set_reps[groups[k]]
                comm_dev += reps
                comm_run += [at] * len(reps)
        else:
            for k, at in enumerate(c.comm.tolist()):
                devices = list(dict.fromkeys(c.participants[k]))
                comm_dev += devices
                comm_run += [at] * len(devices)
        cd = np.asarray(comm_dev, dtype=np.int64)
        cr = np.asarray(comm_run, dtype=np.int64)
        out = {}
        compute_at = np.flatnonzero(c.where >= 0)
        walked = sorted({rep_of[d] for d in self._used}) if by_class else self._used
        cw = c.where[compute_at]
        for d in walked:
            mine = compute_at[cw == d]
            theirs = cr[cd == d]
            out[d] = (c.start[mine], c.end[mine], c.start[theirs], c.end[theirs])
        self._spans_by_class = by_class
        return out

    def _per_device(self, figure: Any) -> dict[int, float]:
        ids = self.topology.device_ids
        spans = self._spans
        rep_of = self._e.rep_of if self._spans_by_class else range(len(self._e.rep_of))
        values = {d: figure(*found) for d, found in spans.items()}
        return {ids[d]: values[rep_of[d]] for d in self._used}

    @cached_property
    def busy_s(self) -> dict[int, float]:
        """Time each device's compute stream is busy."""
        c = self._c
        compute = c.where >= 0
        busy = np.bincount(c.where[compute], weights=c.dur[compute], minlength=len(self._e.rep_of))
        rep_of, ids = self._e.rep_of, self.topology.device_ids
        return {ids[d]: float(busy[rep_of[d]]) for d in self._used}

    @cached_property
    def communication_s(self) -> dict[int, float]:
        """Time each device has communication running (on any of its channels)."""
        return self._per_device(lambda s, e, cs, ce: _covered_s(cs, ce))

    @cached_property
    def idle_s(self) -> dict[int, float]:
        """Time in the step when a device has neither compute nor communication running."""
        step = self.step_time_s
        return self._per_device(
            lambda s, e, cs, ce: step - _covered_s(np.concatenate([s, cs]), np.concatenate([e, ce]))
        )

    def idle_fraction(self, device: int) -> float:
        """``idle_s[device] / step_time_s`` (0 for an empty program)."""
        return self.idle_s[device] / self.step_time_s if self.step_time_s > 0 else 0.0

    # -- memory -----------------------------------------------------------------

    @cached_property
    def _memory(self) -> MemoryCurves:
        c = self._c
        rep_of = self._e.rep_of
        curves = memory_curves(
            c.slot_bytes,
            c.slot_device,
            c.slot_alloc,
            c.slot_free,
            c.slot_freed,
            c.slot_producer,
            [d.memory_bytes for d in self.topology.devices],
            sorted({rep_of[d] for d in self._used}),
            self.step_time_s,
        )
        return curves  # per walked device: a class member's is its representative's

    def memory_timeline(self, device: int) -> tuple[np.ndarray, np.ndarray]:
        """(times_s, live_bytes): live bytes on ``device`` from each time to the next."""
        r = self._e.rep_of[self._device_index(device)]
        return self._memory.times[r].copy(), self._memory.live_bytes[r].copy()

    @cached_property
    def peak_memory_bytes(self) -> dict[int, float]:
        """Device -> highest live bytes during the step."""
        ids, rep_of, peaks = self.topology.device_ids, self._e.rep_of, self._memory.peak_bytes
        return {ids[d]: peaks[rep_of[d]] for d in self._used}

    @cached_property
    def totals(self) -> Totals:
        """Figures over all the devices the program uses, from the walked ones (each
        standing for its rank class): no work per device (a search's rows read these)."""
        rep_of = np.asarray(self._e.rep_of, dtype=np.int64)
        weight = np.bincount(rep_of[np.asarray(self._used, dtype=np.int64)])
        walked = np.flatnonzero(weight)
        n = float(weight.sum())
        if not n:
            return Totals(0.0, 0.0, 0.0, 0.0, True, len(self.topology.devices))
        c = self._c
        compute = c.where >= 0
        busy = np.bincount(c.where[compute], weights=c.dur[compute], minlength=len(weight))
        if self._spans_by_class_known():
            step = self.step_time_s
            idle = {d: step - _covered_s(np.concatenate([s, cs]), np.concatenate([e, ce]))
                    for d, (s, e, cs, ce) in self._spans.items()}  # fmt: skip
            comm = {d: _covered_s(cs, ce) for d, (s, e, cs, ce) in self._spans.items()}
            mean_idle = sum(idle[d] * weight[d] for d in walked.tolist()) / n
            mean_comm = sum(comm[d] * weight[d] for d in walked.tolist()) / n
        else:
            mean_idle = sum(self.idle_s.values()) / n
            mean_comm = sum(self.communication_s.values()) / n
        peaks = self._memory.peak_bytes
        peak = max(peaks[d] for d in walked.tolist())
        capacity = [self.topology.devices[d].memory_bytes for d in walked.tolist()]
        fits = all(peaks[d] <= cap for d, cap in zip(walked.tolist(), capacity))
        mean_busy = float((busy[walked] * weight[walked]).sum() / n)
        working = int(weight[walked][busy[walked] > 0].sum())
        idle = len(self.topology.devices) - working
        return Totals(mean_busy, float(mean_idle), float(mean_comm), float(peak), fits, idle)

    def _spans_by_class_known(self) -> bool:
        self._spans  # noqa: B018 -- computes whether classes stand for their members
        return self._spans_by_class

    @cached_property
    def oom(self) -> dict[int, Op | None]:
        """The devices that run out of memory, each with the op whose allocation first
        exceeds its capacity; empty (so ``if result.oom:`` is false) when every device fits.

        If the function inputs alone exceed a device's capacity, its first op is named
        (None if it runs no op). ``over_capacity`` lists the same devices.
        """
        ids = self.topology.device_ids
        out: dict[int, Op | None] = {}
        for d in self._used:
            inst = self._memory.oom_instance[self._e.rep_of[d]]
            if inst is None:
                continue
            if inst >= 0:
                out[ids[d]] = self._c.ops[inst]
            else:
                r = self._e.rep_of[d]
                first = np.flatnonzero(self._c.where == r)
                out[ids[d]] = self._c.ops[int(first[0])] if len(first) else None
        return out

    @property
    def over_capacity(self) -> tuple[int, ...]:
        """Devices whose peak live bytes exceed their memory."""
        return tuple(
            d
            for d in self.devices
            if self.peak_memory_bytes[d] > self.topology.device(d).memory_bytes
        )

    def _device_index(self, device: int) -> int:
        try:
            i = self.topology.index(device)
        except Exception:
            raise SimulationError(
                f"device {device} is not in topology {self.topology.name!r}"
            ) from None
        if i not in self._used_set:
            raise SimulationError(
                f"the program does not use device {device} (it uses {list(self.devices)})"
            )
        return i

    # -- export -----------------------------------------------------------------

    def to_chrome_trace(self) -> dict[str, Any]:
        """The trace as Chrome-trace JSON: ``json.dump`` it, open it in ui.perfetto.dev."""
        from .trace import chrome_trace

        return chrome_trace(self)


def _covered_s(lo: np.ndarray, hi: np.ndarray) -> float:
    """The length of the union of ``[lo, hi)`` spans (summed in the spans' sorted order)."""
    if not len(lo):
        return 0.0
    order = np.lexsort((hi, lo))
    lo, hi = lo[order], hi[order]
    reach = np.maximum.accumulate(np.concatenate([[0.0], hi[:-1]]))
    lo = np.maximum(lo, reach)
    return float(np.cumsum(np.where(hi > lo, hi - lo, 0.0))[-1])
