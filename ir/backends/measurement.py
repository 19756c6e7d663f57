"""What :func:`ir.backends.torch_dist.measure` returns: timed steps shaped like a SimResult.

A :class:`Measurement` holds every timed step's events (one per op per device that
computes it or takes part in it, as the simulator's events are) and answers the
questions a :class:`ir.sim.SimResult` answers, field by field: ``events``,
``bars``, ``step_time_s``, ``devices``, ``busy_s``, ``communication_s``,
``events_on``, and, for a ranked program (``from_rank_records``), ``memory_timeline``
and ``peak_memory_bytes``. It needs no torch; a test builds one from records.

>>> import ir
>>> f = ir.models.mlp(4, 3, 5, 2)
>>> relu = next(i for i, op in enumerate(f.ops) if op.op_type == "Relu")
>>> m = Measurement.from_records(f, {0: [(10.0, [(0, 10.0, 10.002), (relu, 10.002, 10.003)])]})
>>> round(m.step_time_s, 6), [e.op.op_type for e in m.events]
(0.003, ['MatMul', 'Relu'])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from ..errors import ExecutionError
from ..function import Function
from ..op import Op
from ..registry import OpKind, get_op
from ..sim.result import Bars, Event

__all__ = ["Measurement", "RankStepRecord", "StepRecord"]

# one rank's step: the clock when it left the step's barrier, then (op index, start, end)
StepRecord = tuple[float, Sequence[tuple[int, float, float]]]
# a rank of a ranked program: the same, then its live bytes as (clock, bytes) points
# (on CUDA, a fourth element: the step's torch.cuda.max_memory_allocated)
RankStepRecord = tuple[float, Sequence[tuple[int, float, float]], Sequence[tuple[float, float]]]
# one step's memory: device -> (times_s, live_bytes)
StepMemory = Mapping[int, tuple[tuple[float, ...], tuple[float, ...]]]


@dataclass(frozen=True, eq=False)
class Measurement:
    """Timed steps of one program on real processes (warm-up excluded).

    ``step_events[k]`` are step ``k``'s events, times in seconds from the first
    rank's barrier exit; ``steps_s[k]`` its time: until the last op ends on any rank.
    :attr:`events` and the per-device times are those of the *median step* (the
    step whose time is nearest the median), so the timeline shown is one real
    step, not a mixture; :attr:`median_dur_s` has the per-op medians over all steps.

    ``function`` is the global program that ran (``None`` for a ranked program);
    ``programs`` each rank's own program as it ran (ranked programs only: the
    events' ops are theirs). ``step_memory[k]`` is step ``k``'s live bytes per
    device (ranked programs only; see :meth:`memory_timeline`), ``step_allocated_peak[k]``
    its allocator peak per device (on CUDA only; :attr:`allocated_peak_bytes`). ``outputs`` are the
    global outputs of the last step (ranked programs: with ``carry``, the state after
    every step, warm-up included, has moved on).
    """

    function: Function | None
    step_events: tuple[tuple[Event, ...], ...]
    steps_s: tuple[float, ...]
    programs: Mapping[int, Function] = field(default_factory=dict)
    step_memory: tuple[StepMemory, ...] = ()
    step_allocated_peak: tuple[Mapping[int, float], ...] = ()
    outputs: tuple = ()

    @classmethod
    def from_records(
        cls, function: Function, records: Mapping[int, Sequence[StepRecord]]
    ) -> Measurement:
        """From each device's timed steps (all devices ran the same number of steps)."""
        count = _step_count(records)
        step_events, steps_s = [], []
        for k in range(count):
            origin = min(steps[k][0] for steps in records.values())
            events = [
                e
                for device in sorted(records)
                for e in _events(function.ops, device, records[device][k][1], origin)
            ]
            step_events.append(tuple(sorted(events, key=lambda e: (e.start_s, e.device))))
            steps_s.append(max((e.end_s for e in events), default=0.0))
        return cls(function, tuple(step_events), tuple(steps_s))

    @classmethod
    def from_rank_records(
        cls, programs: Mapping[int, Function], records: Mapping[int, Sequence[RankStepRecord]]
    ) -> Measurement:
        """From each rank's timed steps of its own program ``programs[rank]``: op indices
        are into that program, and each step carries the rank's live-bytes points."""
        count = _step_count(records)
        step_events, steps_s, step_memory, step_allocated = [], [], [], []
        for k in range(count):
            origin = min(steps[k][0] for steps in records.values())
            events, memory, allocated = [], {}, {}
            for rank in sorted(records):
                timed, live, *peak = records[rank][k][1:]
                if peak:
                    allocated[rank] = float(peak[0])
                events += _events(programs[rank].ops, rank, timed, origin)
                memory[rank] = (
                    tuple(max(t - origin, 0.0) for t, _ in live),
                    tuple(float(b) for _, b in live),
                )
            step_events.append(tuple(sorted(events, key=lambda e: (e.start_s, e.device))))
            steps_s.append(max((e.end_s for e in events), default=0.0))
            step_memory.append(memory)
            step_allocated.append(allocated)
        allocated_peaks = tuple(step_allocated) if any(step_allocated) else ()
        return cls(
            None,
            tuple(step_events),
            tuple(steps_s),
            dict(programs),
            tuple(step_memory),
            allocated_peaks,
        )

    @property
    def steps(self) -> int:
        """Number of timed steps (warm-up excluded)."""
        return len(self.steps_s)

    @cached_property
    def step_time_s(self) -> float:
        """The median step time."""
        return float(np.median(self.steps_s)) if self.steps_s else 0.0

    @cached_property
    def median_step(self) -> int:
        """The index of the step whose time is nearest the median (the one :attr:`events` is)."""
        return int(np.argmin(np.abs(np.asarray(self.steps_s) - self.step_time_s)))

    @property
    def events(self) -> list[Event]:
        """The median step's events, by start time."""
        return list(self.step_events[self.median_step]) if self.steps_s else []

    @cached_property
    def median_dur_s(self) -> dict[tuple[Op, int], float]:
        """(op, device) -> the op's median duration on that device over all timed steps."""
        durations: dict[tuple[Op, int], list[float]] = {}
        for events in self.step_events:
            for e in events:
                durations.setdefault((e.op, e.device), []).append(e.dur_s)
        return {key: float(np.median(found)) for key, found in durations.items()}

    @cached_property
    def wait_s(self) -> dict[tuple[Op, int], float]:
        """(op, device) -> how long a communication op of the median step waited on this
        device for its last participant to call it (its start minus the latest start).

        The rest of the event (``dur_s - wait_s``) is what the simulator's event is:
        the simulator starts a collective when all its participants are ready.
        """
        starts: dict[Op, float] = {}
        for e in self.events:
            if e.stream == "communication":
                starts[e.op] = max(starts.get(e.op, e.start_s), e.start_s)
        return {
            (e.op, e.device): min(starts[e.op] - e.start_s, e.dur_s)
            for e in self.events
            if e.stream == "communication"
        }

    @cached_property
    def devices(self) -> tuple[int, ...]:
        """Ids of the devices that ran ops, ascending."""
        return tuple(sorted({e.device for events in self.step_events for e in events}))

    @cached_property
    def bars(self) -> Bars:
        """The median step's events as columns (what the Gantt chart reads)."""
        events = self.events
        return Bars(
            ops=tuple(e.op for e in events),
            device=np.array([e.device for e in events], dtype=np.int64),
            stream=np.array([e.stream != "compute" for e in events], dtype=np.int8),
            start_s=np.array([e.start_s for e in events], dtype=np.float64),
            dur_s=np.array([e.dur_s for e in events], dtype=np.float64),
            flops=np.zeros(len(events)),
            bytes=np.zeros(len(events)),
        )

    def events_on(self, device: int, stream: str | None = None) -> list[Event]:
        """The median step's events of one device (optionally one stream), by start time."""
        return [e for e in self.events if e.device == device and stream in (None, e.stream)]

    @cached_property
    def busy_s(self) -> dict[int, float]:
        """Time each device computes in the median step."""
        return self._stream_s("compute")

    @cached_property
    def communication_s(self) -> dict[int, float]:
        """Time each device spends in communication calls in the median step (waits too)."""
        return self._stream_s("communication")

    def _stream_s(self, stream: str) -> dict[int, float]:
        out = dict.fromkeys(self.devices, 0.0)
        for e in self.events:
            if e.stream == stream:
                out[e.device] += e.dur_s
        return out

    # -- memory (ranked programs) ------------------------------------------------

    @property
    def has_memory(self) -> bool:
        """Whether live bytes were tracked (a ranked program's measurement)."""
        return bool(self.step_memory)

    def memory_timeline(self, device: int) -> tuple[np.ndarray, np.ndarray]:
        """(times_s, live_bytes) of the median step on ``device``, as
        :meth:`ir.sim.SimResult.memory_timeline`: live bytes from each time to the next.

        What it measures: the bytes of the distinct tensor storages that the rank's
        values hold, tracked by the runner as it runs (inputs all step; an op's
        outputs from its start; a value freed after its last reader, as the
        simulator's liveness has it). Not the process's resident size: torch's
        allocator, the interpreter and gloo's buffers are not counted.
        """
        if not self.has_memory:
            raise ExecutionError(
                "this measurement has no memory curves: only ranked programs track live "
                "bytes (measure ir.sharding.lower_to_ranks(program) instead)"
            )
        memory = self.step_memory[self.median_step]
        if device not in memory:
            raise ExecutionError(f"no rank {device} in this measurement (ranks {sorted(memory)})")
        times, live = memory[device]
        return np.asarray(times, dtype=np.float64), np.asarray(live, dtype=np.float64)

    @cached_property
    def peak_memory_bytes(self) -> dict[int, float]:
        """Device -> the highest live bytes of the median step (ranked programs only)."""
        if not self.has_memory:
            return {}
        memory = self.step_memory[self.median_step]
        return {d: max(live, default=0.0) for d, (_, live) in sorted(memory.items())}

    @property
    def allocated_peak_bytes(self) -> dict[int, float]:
        """Device -> ``torch.cuda.max_memory_allocated`` over the median step (ranked
        programs on CUDA; ``{}`` otherwise): the allocator's peak, which also counts what
        the live bytes do not (kernels' temporaries, the allocator's rounding)."""
        if not self.step_allocated_peak:
            return {}
        return dict(sorted(self.step_allocated_peak[self.median_step].items()))

    def __repr__(self) -> str:
        name = self.function.name if self.function is not None else "ranked program"
        return (
            f"<Measurement step_time_s={self.step_time_s:.6g} (median of {self.steps}) "
            f"of {name!r} on devices {list(self.devices)}>"
        )


def _step_count(records: Mapping[int, Sequence]) -> int:
    counts = {len(steps) for steps in records.values()}
    if len(counts) != 1:
        raise ValueError(f"every device must have the same number of steps, got {counts}")
    return counts.pop()


def _events(
    ops: Sequence[Op], device: int, timed: Sequence[tuple[int, float, float]], origin: float
) -> list[Event]:
    events = []
    for index, start, end in timed:
        op = ops[index]
        comm = get_op(op.op_type).kind is OpKind.COMMUNICATION
        stream = "communication" if comm else "compute"
        channel = "communication" if comm else ""
        events.append(
            Event(op, device, stream, start - origin, end - start, 0.0, 0.0, stream, channel)
        )
    return events
