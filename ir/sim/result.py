"""What a simulation returns: step time, per-device times, events, memory curves, trace export."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from operator import itemgetter
from typing import Any

import numpy as np

from ..device import Topology
from ..op import Op
from ..verify import describe_op
from .engine import COMMUNICATION, COMPUTE, Engine, SimulationError
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
    """

    def __init__(self, engine: Engine) -> None:
        self.topology: Topology = engine.topology
        self.step_time_s: float = engine.step_time_s
        self._e = engine

    @cached_property
    def _c(self) -> dict[str, Any]:
        return self._e.columns()

    @cached_property
    def _start(self) -> np.ndarray:
        return np.asarray(self._c["start"], dtype=np.float64)

    @cached_property
    def _dur(self) -> np.ndarray:
        return np.asarray(self._c["dur"], dtype=np.float64)

    @cached_property
    def _where(self) -> tuple[np.ndarray, list[tuple[int, ...]]]:
        """Each instance's compute device index (-1 for a collective), and the participants
        of each collective (in ``comm_instances`` order)."""
        e = self._e
        where = list(e.inst_where)
        participants = [where[i] for i in e.comm_instances]
        for i in e.comm_instances:
            where[i] = -1
        return np.asarray(where, dtype=np.int64).reshape(-1), participants

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
        where, participants = self._where
        used = set(self._c["slot_device"])
        used.update(np.unique(where[where >= 0]).tolist())
        for devices in participants:
            used.update(devices)
        for rep in list(used):
            used.update(self._mirrors.get(rep, ()))
        return sorted(used)

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

    @property
    def num_ops(self) -> int:
        """Number of op runs in the step (pmap body ops count once per device, a rank
        class's once per member though the walk ran them once; see ``walked_ops``)."""
        if not self._mirrors:
            return len(self._e.inst_op)
        return sum(len(self._as(w)) if w.__class__ is int else 1 for w in self._e.inst_where)

    @property
    def walked_ops(self) -> int:
        """Number of op runs the simulator walked (a rank class's pmap bodies once)."""
        return len(self._e.inst_op)

    # -- events -----------------------------------------------------------------

    @cached_property
    def events(self) -> list[Event]:
        """Every event, in program order (a collective's events one per participant)."""
        ids = self.topology.device_ids
        out: list[Event] = []
        e = self._e
        names = self.channel_names
        channels = iter(e.comm_channels)
        for op, where, start, dur, cost in zip(
            e.inst_op, e.inst_where, e.inst_start, e.inst_dur, e.inst_cost
        ):
            if where.__class__ is int:
                for d in self._as(where):
                    out.append(
                        Event(op, ids[d], "compute", start, dur, cost[0], cost[1], "compute")
                    )
            else:
                used = next(channels)
                channel = names[used[0]] if used else "local"
                for d in where:
                    out.append(
                        Event(
                            op,
                            ids[d],
                            "communication",
                            start,
                            dur,
                            0.0,
                            cost[1],
                            "communication",
                            channel,
                        )
                    )
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
        e = self._e
        where, participants = self._where
        n = len(where)
        comm = np.asarray(e.comm_instances, dtype=np.int64)
        counts = np.ones(n, dtype=np.int64)
        mirrored = self._mirrors
        if mirrored:  # a representative's compute instance stands for its whole class
            size = np.ones(len(e.rep_of), dtype=np.int64)
            for rep, members in mirrored.items():
                size[rep] = len(members)
            counts[where >= 0] = size[where[where >= 0]]
        counts[comm] = [len(devices) for devices in participants]
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
        for op, count in zip(e.inst_op, counts.tolist()):
            if count == 1:
                ops.append(op)
            else:
                ops += [op] * count
        flops = np.fromiter(map(itemgetter(0), e.inst_cost), dtype=np.float64, count=n)
        nbytes = np.fromiter(map(itemgetter(1), e.inst_cost), dtype=np.float64, count=n)
        ids = np.asarray(self.topology.device_ids, dtype=np.int64)
        top_start = np.asarray(e.top_start, dtype=np.int64)
        return Bars(
            ops=tuple(ops),
            device=ids[device],
            stream=(~compute).astype(np.int8),
            start_s=self._start[rows],
            dur_s=self._dur[rows],
            flops=np.where(compute, flops[rows], 0.0),
            bytes=nbytes[rows],
            top=np.searchsorted(top_start, rows, side="right") - 1,
        )

    def events_on(self, device: int, stream: str | None = None) -> list[Event]:
        """The events of one device (optionally one stream), by start time."""
        found = [
            ev
            for ev in self.events
            if ev.device == device and (stream is None or ev.stream == stream)
        ]
        return sorted(found, key=lambda ev: (ev.start_s, ev.stream))

    # -- per-device times -------------------------------------------------------

    @cached_property
    def _stream_busy(self) -> dict[tuple[int, int], float]:
        busy: dict[tuple[int, int], float] = {}
        spans: dict[int, list[tuple[float, float]]] = {}
        for where, start, dur in zip(self._c["where"], self._c["start"], self._c["dur"]):
            if where.__class__ is int:
                for d in self._as(where):
                    busy[(d, COMPUTE)] = busy.get((d, COMPUTE), 0.0) + dur
            else:
                for d in where:
                    spans.setdefault(d, []).append((start, start + dur))
        for d, found in spans.items():  # channels of one device may overlap: their union
            busy[(d, COMMUNICATION)] = _covered_s(found)
        return busy

    @cached_property
    def busy_s(self) -> dict[int, float]:
        """Time each device's compute stream is busy."""
        ids = self.topology.device_ids
        return {ids[d]: self._stream_busy.get((d, COMPUTE), 0.0) for d in self._used}

    @cached_property
    def communication_s(self) -> dict[int, float]:
        """Time each device has communication running (on any of its channels)."""
        ids = self.topology.device_ids
        return {ids[d]: self._stream_busy.get((d, COMMUNICATION), 0.0) for d in self._used}

    @cached_property
    def idle_s(self) -> dict[int, float]:
        """Time in the step when a device has neither compute nor communication running."""
        ids = self.topology.device_ids
        intervals: dict[int, list[tuple[float, float]]] = {d: [] for d in self._used}
        for where, start, dur in zip(self._c["where"], self._c["start"], self._c["dur"]):
            for d in self._as(where) if where.__class__ is int else where:
                intervals[d].append((start, start + dur))
        return {ids[d]: self.step_time_s - _covered_s(spans) for d, spans in intervals.items()}

    def idle_fraction(self, device: int) -> float:
        """``idle_s[device] / step_time_s`` (0 for an empty program)."""
        return self.idle_s[device] / self.step_time_s if self.step_time_s > 0 else 0.0

    # -- memory -----------------------------------------------------------------

    @cached_property
    def _memory(self) -> MemoryCurves:
        c = self._c
        rep_of = self._e.rep_of
        curves = memory_curves(
            c["slot_bytes"],
            c["slot_device"],
            c["use_slots"],
            c["use_count"],
            c["slot_producer"],
            self._e.pinned,
            self._start,
            self._start + self._dur,
            [d.memory_bytes for d in self.topology.devices],
            sorted({rep_of[d] for d in self._used}),
            self.step_time_s,
        )
        for d in self._used:  # a class member's memory is its representative's
            r = rep_of[d]
            if r != d:
                curves.times[d], curves.live_bytes[d] = curves.times[r], curves.live_bytes[r]
                curves.peak_bytes[d] = curves.peak_bytes[r]
                curves.oom_instance[d] = curves.oom_instance[r]
        return curves

    def memory_timeline(self, device: int) -> tuple[np.ndarray, np.ndarray]:
        """(times_s, live_bytes): live bytes on ``device`` from each time to the next."""
        i = self._device_index(device)
        return self._memory.times[i].copy(), self._memory.live_bytes[i].copy()

    @cached_property
    def peak_memory_bytes(self) -> dict[int, float]:
        """Device -> highest live bytes during the step."""
        ids = self.topology.device_ids
        return {ids[d]: self._memory.peak_bytes[d] for d in self._used}

    @cached_property
    def oom(self) -> dict[int, Op | None]:
        """The devices that run out of memory, each with the op whose allocation first
        exceeds its capacity; empty (so ``if result.oom:`` is false) when every device fits.

        If the function inputs alone exceed a device's capacity, its first op is named
        (None if it runs no op). ``over_capacity`` lists the same devices.
        """
        ids, ops = self.topology.device_ids, self._c["op"]
        out: dict[int, Op | None] = {}
        for d in self._used:
            inst = self._memory.oom_instance[d]
            if inst is None:
                continue
            if inst >= 0:
                out[ids[d]] = ops[inst]
            else:
                r = self._e.rep_of[d]
                first = [i for i, where in enumerate(self._c["where"]) if where == r]
                out[ids[d]] = ops[first[0]] if first else None
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
        if i not in self._memory.times:
            raise SimulationError(
                f"the program does not use device {device} (it uses {list(self.devices)})"
            )
        return i

    # -- export -----------------------------------------------------------------

    def to_chrome_trace(self) -> dict[str, Any]:
        """The trace as Chrome-trace JSON: ``json.dump`` it, open it in ui.perfetto.dev."""
        from .trace import chrome_trace

        return chrome_trace(self)


def _covered_s(spans: list[tuple[float, float]]) -> float:
    """The length of the union of ``[lo, hi)`` spans."""
    covered, reach = 0.0, 0.0
    for lo, hi in sorted(spans):
        lo = max(lo, reach)
        if hi > lo:
            covered += hi - lo
            reach = hi
    return covered
