"""Pmap bodies scheduled without walking their ops: :class:`BodySchedule`.

A body whose ops all compute on the pmap's own device runs them back to back on that
device's compute stream, in program order. An op starts at ``max(stream free, inputs
ready)``; an operand that an earlier op of the body made is ready by the time the
stream reaches its reader, and a body input can hold the stream back only at its first
reader (later readers start after that one ended). So one run (*application*) of the
body on a device follows from two things: when the stream is free (``free``) and when
each input is ready. It is a list of *segments*: a segment begins at op ``s`` at time
``base`` (the stream's free time for ``s = 0``, else the ready time of an input that
held the stream), and its op ``k`` starts at ``base + offsets(s)[k - s]``, where
``offsets(s)`` are the durations from op ``s`` on, summed in order (a max-plus
transfer from the inputs and the stream to the outputs and the stream, exact for FIFO
streams).

The engine walks the ops of the bodies it does not schedule here with the same
arithmetic (a segment's base plus the durations summed since; see
``ir.sim.engine``), so an application found here equals the walk to the last bit.
Finding one costs the inputs that arrive after ``free`` (usually one or none) and the
outputs, not the body's ops: a pipeline stage's hundreds of microbatches, or a model's
identical layers, share one schedule per device model, and the events and memory of
each application are expanded from it only when a result asks (``ir.sim.expand``).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Sequence
from itertools import accumulate
from typing import Any

import numpy as np

from ..function import Function
from ..op import Op
from ..registry import OpKind
from ..types import DeviceVar, TensorType

_COMPUTE, _CONTROL = OpKind.COMPUTE, OpKind.CONTROL


class BodyTiming:
    """A schedule's durations on one device model, and its offsets per segment start.

    With a host clock (``hosts``: each op's host time to issue), op ``k`` of an
    application cannot start before ``host + host_offsets[k + 1]``, the host's time at
    the start of the application plus the ops issued so far (summed in order, as the
    walk sums them)."""

    __slots__ = (
        "durations",
        "end_offset",
        "host_offsets",
        "lead_from",
        "offsets_from",
        "out_offsets",
    )

    def __init__(
        self, schedule: BodySchedule, durations: list[float], hosts: list[float] | None
    ) -> None:
        self.durations = durations
        self.offsets_from: dict[int, list[float]] = {}
        self.lead_from: dict[int, list[float]] = {}
        offsets = self.offsets(0)
        self.out_offsets = [offsets[p + 1] for p in schedule.made_op]
        self.end_offset = offsets[-1]
        self.host_offsets = None if hosts is None else list(accumulate(hosts, initial=0.0))

    def offsets(self, s: int) -> list[float]:
        """``offsets[i]``: the durations of ops ``s .. s + i - 1`` summed in order."""
        found = self.offsets_from.get(s)
        if found is None:
            found = self.offsets_from[s] = list(accumulate(self.durations[s:], initial=0.0))
        return found

    def lead(self, s: int) -> list[float]:
        """For a segment that began at op ``s``: ``lead[i]``, the largest over ops ``k`` in
        ``s + 1 .. s + 1 + i`` of ``host_offsets[k + 1] - offsets(s)[k - s]``, how far the
        host's issue of op ``k`` runs behind the segment's stream (approximately: a
        filter, each candidate checked exactly)."""
        found = self.lead_from.get(s)
        if found is None:
            hc, offsets = self.host_offsets, self.offsets(s)
            gaps = [hc[k + 1] - offsets[k - s] for k in range(s + 1, len(self.durations))]
            found = self.lead_from[s] = list(accumulate(gaps, max))
        return found


class BodySchedule:
    """The tables of one pmap body that let the engine time an application of it from
    its inputs' ready times (see the module docstring). Built by :func:`schedule_of`,
    which says whether a body qualifies.

    Local values are numbered: the body's inputs ``0 .. num_inputs - 1``, then every
    result of every op in order. ``made`` are the outputs the body's ops make (each
    application gives them new slots); an output that is a body input is that input.
    """

    def __init__(
        self,
        body: Function,
        ops: list[Op],
        costs: list[tuple],
        reads: list[tuple[int, ...]],
        writes: list[tuple[int, ...]],
        value_bytes: list[int],
        outputs: list[int],
    ) -> None:
        self.body = body
        self.ops = tuple(ops)
        self.costs = tuple(costs)  # the engine's cost entry of each op (shared with the walk)
        self.num_ops = len(ops)
        self.num_inputs = len(body.inputs)
        self.reads = tuple(reads)  # local values each op reads, operands in order
        self.writes = tuple(writes)
        self.value_bytes = value_bytes  # per local value (0 for the inputs)
        self.outputs = tuple(outputs)  # local value of each body output
        producer = {v: k for k, ws in enumerate(writes) for v in ws}
        first = [self.num_ops] * self.num_inputs
        for k, rs in enumerate(reads):
            for v in rs:
                if v < self.num_inputs and first[v] > k:
                    first[v] = k
        self.first_reader = first  # per input: its first reader (num_ops: none)
        self.made = tuple(dict.fromkeys(v for v in outputs if v >= self.num_inputs))
        self.made_op = [producer[v] for v in self.made]
        self.made_bytes = [value_bytes[v] for v in self.made]
        made_index = {v: i for i, v in enumerate(self.made)}
        # per output: its input's position, or ~(its position in ``made``)
        self.output_refs = tuple(v if v < self.num_inputs else ~made_index[v] for v in outputs)
        # for the expansion (ir.sim.expand): per local value its producer and last reader
        # (-1: none); the values no output returns (each application's own slots)
        self.producer = np.asarray(
            [-1] * self.num_inputs
            + [producer[v] for v in range(self.num_inputs, len(value_bytes))],
            dtype=np.int64,
        )
        last = [-1] * len(value_bytes)
        for k, rs in enumerate(reads):
            for v in rs:
                last[v] = k
        self.last_reader = np.asarray(last, dtype=np.int64)
        kept = set(self.made)
        self.internal = np.asarray(
            [v for v in range(self.num_inputs, len(value_bytes)) if v not in kept], dtype=np.int64
        )
        self.flops = np.asarray([c[0] for c in costs], dtype=np.float64)
        self.nbytes = np.asarray([c[1] for c in costs], dtype=np.float64)
        self._timings: dict[int, BodyTiming] = {}

    def like(self, body: Function, ops: list[Op]) -> BodySchedule:
        """This schedule for ``body``, whose ops (``ops``, the ones scheduled) have this
        one's costs, reads and results: the tables and the timings (shared as they are
        found) are this one's, the body and its ops its own."""
        twin = object.__new__(BodySchedule)
        twin.__dict__.update(self.__dict__)
        twin.body, twin.ops = body, tuple(ops)
        return twin

    def timing(self, model: int, device_index: int) -> BodyTiming:
        """The schedule's timing on device model ``model`` (``device_index`` one of its
        devices: the cost entries hold a duration per device)."""
        found = self._timings.get(model)
        if found is None:
            durations = [c[2][device_index] for c in self.costs]
            hosted = self.costs[0][4] is not None
            hosts = [c[4][device_index] for c in self.costs] if hosted else None
            found = self._timings[model] = BodyTiming(self, durations, hosts)
        return found

    def apply(
        self, timing: BodyTiming, free: float, readies: Sequence[float], host: float = 0.0
    ) -> tuple[tuple[tuple[int, float], ...], list[float], float]:
        """One application: ``(segments, ready time of each made output, stream end)``.

        ``segments`` are ``(first op, base)`` pairs; ``free`` is when the stream is free,
        ``readies[j]`` when input ``j`` is ready and ``host`` the host clock (with a
        host clock, see :class:`BodyTiming`)."""
        late: Any = ()
        if max(readies, default=0.0) > free:
            late = [j for j, r in enumerate(readies) if r > free]
        if timing.host_offsets is not None:
            return self._apply_hosted(timing, free, readies, host, late)
        if not late:
            return ((0, free),), [free + o for o in timing.out_offsets], free + timing.end_offset
        first = self.first_reader
        late.sort(key=first.__getitem__)
        segments = [(0, free)]
        s, base, offsets = 0, free, timing.offsets(0)
        n = self.num_ops
        for j in late:
            k = first[j]
            if k >= n:  # an input no op reads
                continue
            r = readies[j]
            if r > base + offsets[k - s]:  # it holds the stream: a segment begins at k
                base = r
                if k == s:
                    segments[-1] = (k, r)
                else:
                    s, offsets = k, timing.offsets(k)
                    segments.append((k, r))
        return self._finish(timing, segments, base, offsets, s)

    def _apply_hosted(
        self, timing: BodyTiming, free: float, readies: Sequence[float], host: float, late: Any
    ) -> tuple[tuple[tuple[int, float], ...], list[float], float]:
        """:meth:`apply` with a host clock: op ``k`` also waits for ``host +
        host_offsets[k + 1]``. The ops where the host may hold the stream are found from
        the segment's :meth:`BodyTiming.lead` (a bisection) and checked exactly, in op
        order with the late inputs' first readers, as the walk would meet them."""
        hc = timing.host_offsets
        if not late:  # the common case: nothing waits (the host well ahead of the stream)
            lead = timing.lead(0)
            slack = 1e-9 * (abs(free) + abs(host) + hc[-1] + timing.end_offset) + 1e-300
            if host + hc[1] <= free and (not lead or lead[-1] <= free - host - slack):
                outs = [free + o for o in timing.out_offsets]
                return ((0, free),), outs, free + timing.end_offset
        first = self.first_reader
        if late and all([first[j] == 0 for j in late]):  # a stage's usual wait: op 0's input
            # what the loop below finds at op 0 (the inputs and the host's issue hold the
            # stream, whose offset there is 0) when the host then issues no op late
            base = max([readies[j] for j in late])
            issued = host + hc[1]
            if issued > base:
                base = issued
            lead = timing.lead(0)
            slack = 1e-9 * (abs(base) + abs(host) + hc[-1] + timing.end_offset) + 1e-300
            if not lead or lead[-1] <= base - host - slack:
                outs = [base + o for o in timing.out_offsets]
                return ((0, base),), outs, base + timing.end_offset
        n = self.num_ops
        late = sorted((first[j], j) for j in late if first[j] < n)
        i_late = 0
        segments = [(0, free)]
        s, base, offsets = 0, free, timing.offsets(0)
        k = 0  # the next op to check: op 0 always (the host may be behind at the start)
        lead, slack, scan = timing.lead(0), 0.0, False
        while k < n:
            r = -1.0
            while i_late < len(late) and late[i_late][0] == k:
                r = max(r, readies[late[i_late][1]])
                i_late += 1
            issued = host + hc[k + 1]
            if issued > r:
                r = issued
            if r > base + offsets[k - s]:  # the stream waits: a segment begins at k
                base = r
                if k == s:
                    segments[-1] = (k, r)
                else:
                    s, offsets = k, timing.offsets(k)
                    segments.append((k, r))
                lead, scan = timing.lead(s), False
            # where next: the next late input's reader, or the next op whose issue may
            # come after the stream (host + hc[k + 1] > base + offsets[k - s], up to
            # rounding: the threshold leaves room, every candidate is checked above)
            slack = 1e-9 * (abs(base) + abs(host) + hc[-1] + offsets[-1]) + 1e-300
            threshold = base - host - slack
            k_in = late[i_late][0] if i_late < len(late) else n
            k_host = n
            at = k + 1 - (s + 1)  # index of op k + 1 in lead (ops s + 1 ..)
            if at < len(lead):
                if not scan and (at == 0 or lead[at - 1] <= threshold):
                    k_host = s + 1 + bisect_right(lead, threshold, lo=at)
                else:  # an op before k + 1 came close and did not bind: look one by one
                    scan = True
                    for q in range(k + 1, min(k_in, n)):
                        if hc[q + 1] - offsets[q - s] > threshold:
                            k_host = q
                            break
            k = min(k_in, k_host)
        return self._finish(timing, segments, base, offsets, s)

    def _finish(
        self,
        timing: BodyTiming,
        segments: list[tuple[int, float]],
        base: float,
        offsets: list[float],
        s: int,
    ) -> tuple[tuple[tuple[int, float], ...], list[float], float]:
        end = base + offsets[self.num_ops - s]
        if len(segments) == 1:
            return tuple(segments), [base + o for o in timing.out_offsets], end
        starts = [seg[0] for seg in segments]
        outs = []
        for p in self.made_op:
            s, base = segments[bisect_right(starts, p) - 1]
            outs.append(base + timing.offsets(s)[p - s + 1])
        return tuple(segments), outs, end


def schedule_of(
    body: Function,
    var: str,
    prepare: Callable[[Op], tuple],
    shapes: dict[tuple, BodySchedule] | None = None,
) -> BodySchedule | None:
    """The schedule of ``body`` (a pmap body over device variable ``var``), or None if it
    does not qualify: every op must be a compute op on ``var`` itself with tensor
    operands and results (``PipelineStage`` markers pass their operand through);
    anything else (a transfer, a nested pmap, a sub-device, a tuple) is walked.

    ``shapes``: the schedules found so far, by shape. A body of the shape of one of them
    (the same cost entry per op, named by its last element, the cost key: type,
    attributes, shapes; the same reads, results and outputs) shares its tables and
    timings (:meth:`BodySchedule.like`): a step's stages of equal layers are timed, and
    expanded (``ir.sim.expand``), once per shape and device model."""
    on = DeviceVar(var)
    local: dict[Any, int] = {}
    for v in body.inputs:
        if v.type.__class__ is not TensorType:
            return None
        local[v] = len(local)
    value_bytes = [0] * len(local)
    ops, costs, reads, writes = [], [], [], []
    for op in body.ops:
        prep = prepare(op)
        if prep[0] is _CONTROL:
            if op.op_type != "PipelineStage":
                return None
            local[op.outputs[0]] = local[op.inputs[0]]
            continue
        if prep[0] is not _COMPUTE or prep[2] != on:
            return None
        templates = prep[3]
        if any(t.__class__ is not tuple or t[1] != on for t in templates):
            return None
        if any(v.type.__class__ is not TensorType for v in op.inputs):
            return None
        ops.append(op)
        costs.append(prep[1])
        reads.append(tuple(local[v] for v in op.inputs))
        made = []
        for v, t in zip(op.outputs, templates):
            local[v] = len(value_bytes)
            value_bytes.append(t[0])
            made.append(local[v])
        writes.append(tuple(made))
    if not ops:
        return None
    outputs = [local[v] for v in body.outputs]
    if shapes is None:
        return BodySchedule(body, ops, costs, reads, writes, value_bytes, outputs)
    key = (tuple([c[-1] for c in costs]), tuple(reads), tuple(writes), tuple(outputs))
    key += (len(body.inputs),)
    found = shapes.get(key)
    if found is not None:
        return found.like(body, ops)
    found = shapes[key] = BodySchedule(body, ops, costs, reads, writes, value_bytes, outputs)
    return found
