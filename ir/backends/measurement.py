"""What :func:`ir.backends.torch_dist.measure` returns: timed steps shaped like a SimResult.

A :class:`Measurement` holds every timed step's events (one per op per device that
computes it or takes part in it, as the simulator's events are) and answers the
questions a :class:`ir.sim.SimResult` answers, field by field: ``events``,
``bars``, ``step_time_s``, ``devices``, ``busy_s``, ``communication_s``,
``events_on``. It needs no torch; a test builds one from records.

>>> import ir
>>> f = ir.models.mlp(4, 3, 5, 2)
>>> relu = next(i for i, op in enumerate(f.ops) if op.op_type == "Relu")
>>> m = Measurement.from_records(f, {0: [(10.0, [(0, 10.0, 10.002), (relu, 10.002, 10.003)])]})
>>> round(m.step_time_s, 6), [e.op.op_type for e in m.events]
(0.003, ['MatMul', 'Relu'])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..function import Function
from ..op import Op
from ..registry import OpKind, get_op
from ..sim.result import Bars, Event

__all__ = ["Measurement", "StepRecord"]

# one rank's step: the clock when it left the step's barrier, then (op index, start, end)
StepRecord = tuple[float, Sequence[tuple[int, float, float]]]


@dataclass(frozen=True)
class Measurement:
    """Timed steps of one program on real processes (warm-up excluded).

    ``step_events[k]`` are step ``k``'s events, times in seconds from the first
    rank's barrier exit; ``steps_s[k]`` its time: until the last op ends on any rank.
    :attr:`events` and the per-device times are those of the *median step* (the
    step whose time is nearest the median), so the timeline shown is one real
    step, not a mixture; :attr:`median_dur_s` has the per-op medians over all steps.
    """

    function: Function
    step_events: tuple[tuple[Event, ...], ...]
    steps_s: tuple[float, ...]

    @classmethod
    def from_records(
        cls, function: Function, records: Mapping[int, Sequence[StepRecord]]
    ) -> Measurement:
        """From each device's timed steps (all devices ran the same number of steps)."""
        counts = {len(steps) for steps in records.values()}
        if len(counts) != 1:
            raise ValueError(f"every device must have the same number of steps, got {counts}")
        (count,) = counts
        ops = function.ops
        step_events, steps_s = [], []
        for k in range(count):
            origin = min(steps[k][0] for steps in records.values())
            events = []
            for device in sorted(records):
                for index, start, end in records[device][k][1]:
                    op = ops[index]
                    comm = get_op(op.op_type).kind is OpKind.COMMUNICATION
                    stream = "communication" if comm else "compute"
                    channel = "communication" if comm else ""
                    dur_s = end - start
                    events.append(
                        Event(op, device, stream, start - origin, dur_s, 0.0, 0.0, stream, channel)
                    )
            end_s = max((e.end_s for e in events), default=0.0)
            step_events.append(tuple(sorted(events, key=lambda e: (e.start_s, e.device))))
            steps_s.append(end_s)
        return cls(function, tuple(step_events), tuple(steps_s))

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

    def __repr__(self) -> str:
        return (
            f"<Measurement step_time_s={self.step_time_s:.6g} (median of {self.steps}) "
            f"of {self.function.name!r} on devices {list(self.devices)}>"
        )
