"""Pipeline parallelism: stages on devices, K microbatches, an unrolled schedule (seed 000).

Each op runs in a stage (``ir/transforms/stage_cut.py``): the one the program's
pipeline-stage annotations give it (seed 001), or, without annotations, the
stage of the weights it reads, the weights cut into ``stages`` consecutive
groups (in order of first use); forward ops never before the stage of their
operands, backward ops with the forward op they differentiate. The batch inputs
are ``Split`` into K microbatches; every op that touches the batch is copied
once per microbatch; a ``Send`` carries a value to another stage at the
exchange between tasks where Megatron-LM's schedules send and receive it
(:func:`run_exchanges`: out at the sender's exchange after the task that makes
it, in at the receiver's before the first task that reads it; the next forward's
input after a backward), so in program order 1F1B stage ``s`` holds at most
``p - s`` microbatches. The op order *is* the schedule (the simulator follows
it): GPipe runs all forwards then all backwards on each stage; 1F1B runs
``p - s - 1`` warm-up forwards on stage ``s``, then alternates one forward and one
backward. Gradients (and the loss) are accumulated into a running sum (``Add``)
as each microbatch finishes, so live memory does not grow with K, and the
optimizer steps once at the end on each weight's stage.

Outputs: batch-shaped ones are concatenated on the last stage, the loss is the
accumulated sum, updated weights stay on their stage's device.

The program is a steady-state training step (``resident=True``, the default):
each input is taken on the device of the stage that first reads it, so weights
and optimizer state live on their stage, the batch on the first stage and the
labels on the last; there are no per-step weight sends, and step N+1 can take
step N's updated weights as they are. ``resident=False`` takes every input
where the source program has it and sends it to its stage every step (the
seeds' form; the nested compositions use it). The one-time distribution of the
source program's inputs to a resident step's is :func:`setup_program`
(``ir/transforms/setup.py``): execute it once, then the step.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..arguments import bool_arg, function_arg
from ..builder import FunctionBuilder
from ..function import Function
from ..op import Op
from ..ops.communication import split_sizes
from ..registry import OpKind, get_op
from ..types import DeviceRef, TensorType
from ..value import Value
from ..verify import verify
from ._rewrite import (
    Mover,
    TransformError,
    batch_inputs,
    batch_size,
    check_common,
    check_degree,
    check_device,
    check_devices,
    localize_op,
)
from ._spmd import P, R
from .data_parallel import data_plan
from .stage_cut import backward_ops, pipeline_degree, stage_assignment, staged, unmarked

SCHEDULES = ("gpipe", "1f1b", "interleaved")


def _device_sequence(schedule: str, d: int, p: int, v: int, k: int, backward: bool) -> list:
    """The (stage, microbatch, phase) tasks of device ``d`` in its run order.

    ``v`` model chunks per device (interleaved: stage ``c * p + d`` is chunk c of d).
    """
    return [task for group in device_groups(schedule, d, p, v, k, backward) for task in group]


def device_groups(schedule: str, d: int, p: int, v: int, k: int, backward: bool) -> list[list]:
    """Device ``d``'s tasks (:func:`_device_sequence`) in the groups between which
    Megatron-LM's schedules exchange activations and gradients with the neighbouring
    ranks (one ``batch_isend_irecv`` each, the host synchronising after it): a group per
    task, but for the interleaved schedule's steady state, whose forward and backward
    run back to back before one exchange (``send_forward_backward_recv_forward_backward``
    in ``forward_backward_pipelining_with_interleaving``)."""
    if schedule != "interleaved":
        fwd = [(d, m, "F") for m in range(k)]
        if not backward:
            return [[t] for t in fwd]
        if schedule == "gpipe":
            return [[t] for t in fwd + [(d, m, "B") for m in range(k)]]
        warm = min(p - d - 1, k)
        seq = fwd[:warm]
        for i in range(k - warm):
            seq += [fwd[warm + i], (d, i, "B")]
        return [[t] for t in seq + [(d, m, "B") for m in range(k - warm, k)]]

    # Megatron-LM's interleaved 1F1B: microbatches go through the chunks in groups of p.
    def task(i: int, phase: str) -> tuple[int, int, str]:
        chunk = (i // p) % v
        if phase == "B":
            chunk = v - 1 - chunk
        return (chunk * p + d, (i // (p * v)) * p + i % p, phase)

    total = v * k
    if not backward:
        return [[task(i, "F")] for i in range(total)]
    warm = min((p - d - 1) * 2 + (v - 1) * p, total)
    groups = [[task(i, "F")] for i in range(warm)]
    groups += [[task(warm + i, "F"), task(i, "B")] for i in range(total - warm)]
    return groups + [[task(i, "B")] for i in range(total - warm, total)]


class _Pipeline:
    def __init__(
        self,
        f: Function,
        stages: int,
        k: int,
        schedule: str,
        devices: Sequence[DeviceRef],
        batch: Sequence[str] | None,
        chunks: int = 1,
        resident: bool = True,
        stage_of: Mapping[str, int] | None = None,
    ) -> None:
        # Annotations choose the stages; their markers are not ops of the step. Each
        # stage's replays start from what it holds (stage_cut.staged).
        f, marks = unmarked(f, stage_of)
        what = pipeline_degree(len(devices), chunks, "stages")
        f, self.stage = staged(f, stages, marks, what)
        self.f, self.p, self.k, self.v = f, len(devices), k, chunks
        self.resident = resident
        # model stage s runs on device s % p (several stages per device when interleaved)
        self.devices = [devices[s % len(devices)] for s in range(stages)]
        rows = batch_size(f, batch_inputs(f, batch)) if batch_inputs(f, batch) else 1
        check_degree("number of microbatches", k, rows, "batch size")
        # States come from a split in two at least: with one part, whole and partial look alike.
        self.plan = data_plan(f, max(k, min(2, rows)), batch, what="number of microbatches")
        self.position = {op: i for i, op in enumerate(f.ops)}
        self.backward = backward_ops(f)
        self.b = FunctionBuilder(f.name)
        self.move = Mover(self.b)
        self.glob: dict[Value, Value] = {}
        self.pieces: dict[tuple[Value, int], Value] = {}
        self.acc: dict[Value, Value] = {}
        self.split: dict[Value, Value] = {}
        self._index(schedule)

    def _index(self, schedule: str) -> None:
        plan = self.plan
        self.keys = {st.op: st.keys for st in plan.steps if st.op is not None}
        conv = [st for st in plan.steps if st.op is None]
        # a replicated value that meets the batch (a whole-batch constant) is split into
        # the microbatches' pieces where it is made; other conversions wait for the batch
        self.sliced = {st.keys[1]: st for st in conv if st.src == R}
        self.conv_src = {st.keys[1]: st for st in conv if st.src != R}
        self.per_mb = {
            op
            for op, ks in self.keys.items()
            if op in plan.born or any(plan.state[k] != R for k in ks)
        }
        late: set[Value] = set(self.conv_src)
        self.post: list[Op] = []
        self.pre: list[Op] = []
        for op in self.f.ops:
            if op in self.per_mb:
                if any(k in late for k in self.keys[op]):
                    raise TransformError(
                        f"{op.op_type} needs a value summed over the whole batch before the "
                        f"batch is done; it cannot be pipelined over microbatches"
                    )
            elif any(k in late for k in self.keys[op]):
                late.update(op.outputs)
                self.post.append(op)
            else:
                self.pre.append(op)
        outs = {plan.current[v] for v in self.f.outputs}
        self.summed = {k for k in outs if plan.state[k] == P}
        self.summed |= {st.keys[0] for st in conv if st.src == P}
        tasks: dict[tuple[int, str], list[Op]] = {}
        for op in self.f.ops:
            if op in self.per_mb:
                tasks.setdefault((self.stage[op], "B" if op in self.backward else "F"), [])
                tasks[(self.stage[op], "B" if op in self.backward else "F")].append(op)
        self.tasks = tasks
        has_backward = bool(self.backward & self.per_mb)
        self.groups = [
            [
                kept
                for group in device_groups(schedule, d, self.p, self.v, self.k, has_backward)
                if (kept := [(s, m, ph) for s, m, ph in group if (s, ph) in tasks])
            ]
            for d in range(self.p)
        ]

    # -- emission -------------------------------------------------------------------

    def piece(self, key: Value, m: int) -> Value:
        if (key, m) not in self.pieces:
            if key not in self.split and key in self.sliced:
                src, dim = self.sliced[key].keys[0], self.sliced[key].dst.dim
                self.split[key] = self.b.call(
                    "Split", self.glob[src], partitions=self.k, dim=dim, name=f"{key.name}s"
                )
            if key not in self.split:
                raise TransformError(f"microbatch {m} of {key.name!r} is used before it is made")
            self.pieces[(key, m)] = self.b.call(
                "TupleGet", self.split[key], index=m, name=f"{key.name}_mb{m}"
            )
        return self.pieces[(key, m)]

    def emit_global(self, op: Op) -> None:
        dev = self.devices[self.stage[op]]
        ins = [self.move.at(self.glob[k], dev) for k in self.keys[op]]
        for v, out in zip(op.outputs, localize_op(self.b, op, ins, dev)):
            self.glob[v] = out

    def emit_task(self, s: int, m: int, phase: str) -> None:
        dev = self.devices[s]
        for op in self.tasks[(s, phase)]:
            ins = [
                self.move.at(self.glob[k] if self.plan.state[k] == R else self.piece(k, m), dev)
                for k in self.keys[op]
            ]
            outs = localize_op(self.b, op, ins, dev, f"_mb{m}", self._born_types(op, m))
            for v, out in zip(op.outputs, outs):
                self.pieces[(v, m)] = out
                if v in self.summed:
                    prev = self.acc.get(v)
                    name = f"{v.name}_acc{m}"
                    self.acc[v] = out if prev is None else self.b.call("Add", prev, out, name=name)

    def _born_types(self, op: Op, m: int) -> list[TensorType] | None:
        """The result types of microbatch ``m`` of an op that broadcasts to the batch
        (``plan.born``: built per microbatch), else None (they follow the operands)."""
        state = self.plan.born.get(op)
        if state is None:
            return None
        types = []
        for v in op.outputs:
            shape = list(v.type.shape)
            shape[state.dim] = split_sizes(shape[state.dim], self.k)[m]
            types.append(v.type.with_shape(tuple(shape)))
        return types

    def run(self, output_device: DeviceRef | None = None) -> Function:
        b, plan = self.b, self.plan
        for v in self.f.inputs:
            self.glob[v] = b.input(v.name, self._input_type(v))
        for v in self.f.inputs:
            s = plan.state[v]
            if s is not None and s.kind == "S":
                self.split[v] = b.call(
                    "Split", self.glob[v], partitions=self.k, dim=s.dim, name=f"{v.name}s"
                )
        for op in self.pre:
            self.emit_global(op)
        if self.resident:
            self._send_step_values()
        self._merge()
        for dst, st in self.conv_src.items():
            src = st.keys[0]
            self.glob[dst] = self.acc[src] if st.src == P else self._concat(src, st.src.dim)
        for op in self.post:
            self.emit_global(op)
        outs = []
        for v in self.f.outputs:
            key = plan.current[v]
            s = plan.state[key]
            if s == R:
                outs.append(self.glob[key])
            elif s == P:
                outs.append(self.acc[key])
            else:
                outs.append(self._concat(key, s.dim, v.name))
        if output_device is not None:
            outs = [self.move.at(v, output_device) for v in outs]
        return verify(b.finish(outs))

    def _send_step_values(self) -> None:
        """Send each value of the whole step (an input, a value of no batch input) that a
        stage other than its own reads there before the schedule starts, not before the
        first task reading it: a transfer waits for its receiver (Megatron-LM synchronises
        after point-to-point transfers), and one from the first stage to the last, placed
        among the microbatches, would hold the first stage until the last one gets there."""
        for (s, _), ops in self.tasks.items():
            for op in ops:
                for k in self.keys[op]:
                    if self.plan.state[k] == R and k in self.glob:
                        self.move.at(self.glob[k], self.devices[s])

    def _input_type(self, v: Value) -> Any:
        """``v``'s type in the step: on the stage of its first reader when resident."""
        t = v.type
        readers = self.f.consumers.get(v, [])
        if not self.resident or not isinstance(t, TensorType) or not readers:
            return t
        first = min(readers, key=self.position.__getitem__)
        return t.with_device(self.devices[self.stage[first]])

    def _concat(self, key: Value, dim: int, name: str = "") -> Value:
        parts = [self.piece(key, m) for m in range(self.k)]
        dev = parts[-1].type.device
        parts = [self.move.at(x, dev) for x in parts]
        return self.b.call("Concat", *parts, dim=dim, name=name or f"{key.name}_all")

    def _merge(self) -> None:
        """Emit the tasks in an order that respects each device's sequence and the data flow."""
        producer_task: dict[Value, tuple[int, str]] = {}
        for (s, ph), ops in self.tasks.items():
            for op in ops:
                for v in op.outputs:
                    producer_task[v] = (s, ph)
        tasks = self.tasks.items()
        reads = {key: [(self.keys[op], op.outputs) for op in ops] for key, ops in tasks}
        device = self.devices.__getitem__
        exchange_values(self.groups, reads, producer_task, device, self.emit_task, self.send)

    def send(self, k: Value, s: int, m: int) -> None:
        """Send ``k`` (microbatch ``m``'s piece, or the whole value) to stage ``s``'s device."""
        self.move.at(self.glob[k] if self.plan.state[k] == R else self.piece(k, m), self.devices[s])


def received_values(
    reads: Mapping[tuple[int, str], Sequence[tuple[Sequence[Value], Sequence[Value]]]],
    producer: Mapping[Value, tuple[int, str]],
    device: Callable[[int], Any],
) -> dict[tuple[int, str], list[Value]]:
    """Per task kind ``(stage, phase)``, given the values each of its ops (items) reads and
    makes in order (``reads``), the task that makes each value (``producer``) and each
    stage's device (``device``): the values it reads from another device before making
    them itself, which :func:`run_exchanges` receives before the task. A backward task
    does not receive again what its stage's forward task received."""
    out: dict[tuple[int, str], list[Value]] = {}
    for (s, phase), ops in sorted(reads.items(), key=lambda x: x[0][1] == "B"):
        made: set[Value] = set()
        keys: dict[Value, None] = {}
        for ins, outs in ops:
            for k in ins:
                if k not in made and k in producer and device(producer[k][0]) != device(s):
                    keys[k] = None
            made.update(outs)
        before = set(out.get((s, "F"), ())) if phase == "B" else set()
        out[(s, phase)] = [k for k in keys if k not in before]
    return out


def exchange_values(
    groups: list[list[list]],
    reads: Mapping[tuple[int, str], Sequence[tuple[Sequence[Value], Sequence[Value]]]],
    producer: Mapping[Value, tuple[int, str]],
    device: Callable[[int], Any],
    emit: Callable[[int, int, str], None],
    send: Callable[[Value, int, int], None],
) -> None:
    """A pipeline's tasks and transfers in order: :func:`run_exchanges` over the values
    each task kind receives (:func:`received_values`), ``send(value, stage, microbatch)``
    for each value where it crosses."""
    received = received_values(reads, producer, device)

    def receive(s: int, m: int, phase: str, sources: frozenset) -> None:
        for k in received[(s, phase)]:
            if producer[k] in sources:
                send(k, s, m)

    deps = {key: {producer[k] for k in keys} for key, keys in received.items()}
    run_exchanges(groups, deps, emit, receive)


def run_exchanges(
    groups: list[list[list]],
    deps: dict,
    emit: Callable[[int, int, str], None],
    receive: Callable[[int, int, str, frozenset], None],
) -> None:
    """Call ``emit(stage, microbatch, phase)`` for every task of every device's ``groups``
    (:func:`device_groups`, in order) and ``receive(stage, microbatch, phase, sources)``
    where the task's inputs made by ``sources`` (task kinds on other devices) cross over.

    From the neighbouring stage (a forward's input from the forward before it, a
    backward's from the backward after it) they cross at the exchanges between groups as
    Megatron-LM's schedules make them: what a group makes goes out at the exchange after
    it, what a group needs comes in at the exchange before it, and an exchange is one
    meeting of the devices it joins (``batch_isend_irecv`` on each, which returns once
    every transfer of it is done). So such a transfer's place in the step is the same on
    both of its sides: its sender's exchange after the producer and its receiver's
    before the consumer (with the hosts synchronising after transfers, a transfer placed
    after the sender's next group, or before the receiver's previous one, holds that
    device). From any other stage (a skip connection past a stage, a MoE model's
    auxiliary losses summed on the last stage), which no exchange of Megatron-LM's
    carries, a value is sent once its producer has run, at the receiver's exchange
    before the consumer: tying it to the sender's exchanges too could ask one device to
    be at two exchanges at once. ``deps[(stage, phase)]``: the task kinds (same
    microbatch) whose results the task receives from other devices."""
    where: dict[tuple[int, int, str], tuple[int, int]] = {}  # task -> (device, group)
    for d, device in enumerate(groups):
        for g, group in enumerate(device):
            for task in group:
                where[task] = (d, g)
    # each transfer (a task's inputs from other devices, by source), what it waits for
    # (devices at exchanges, producers' groups emitted) and the exchanges that wait for it
    transfers: list[tuple[tuple, frozenset, tuple[tuple[int, int], ...]]] = []
    joining: dict[tuple[int, int], list[int]] = {}  # exchange -> transfers waiting for it
    emitted: dict[tuple[int, int], list[int]] = {}  # (device, group) -> transfers waiting
    left: dict[tuple[int, int], int] = {}  # exchange -> its transfers not yet made
    absent: list[int] = []  # per transfer, what it still waits for
    for task, (d, g) in where.items():
        s, m, phase = task
        neighbour = (s - 1, "F") if phase == "F" else (s + 1, "B")
        near: dict[tuple[int, str], tuple[int, int]] = {}  # source -> its exchange after it
        for source in sorted(deps[(s, phase)]):
            s2, ph2 = source
            d2, g2 = where[(s2, m, ph2)]
            if d2 == d:
                continue
            if source == neighbour:
                near[source] = (d2, g2 + 1)
                continue
            u = len(transfers)  # from afar: once made, at the receiver's exchange
            transfers.append((task, frozenset([source]), ((d, g),)))
            joining.setdefault((d, g), []).append(u)
            emitted.setdefault((d2, g2), []).append(u)
            absent.append(2)
            left[(d, g)] = left.get((d, g), 0) + 1
        if near:
            meets = {(d, g), *near.values()}
            u = len(transfers)
            transfers.append((task, frozenset(near), tuple(meets)))
            for meet in meets:
                joining.setdefault(meet, []).append(u)
                left[meet] = left.get(meet, 0) + 1
            absent.append(len(meets))
    ready: deque[int] = deque()  # transfers with nothing left to wait for
    free: deque[int] = deque()  # devices at an exchange with no transfer left to make
    at = [0] * len(groups)  # each device's next group: it is at the exchange before it

    def met(waiting: list[int]) -> None:
        for u in waiting:
            absent[u] -= 1
            if not absent[u]:
                ready.append(u)

    def arrive(d: int) -> None:
        meet = (d, at[d])
        met(joining.get(meet, ()))
        if not left.get(meet):
            free.append(d)

    for d in range(len(groups)):
        arrive(d)
    while ready or free:
        if ready:
            task, sources, meets = transfers[ready.popleft()]
            receive(*task, sources)
            for meet in meets:
                left[meet] -= 1
                if not left[meet]:
                    free.append(meet[0])
            continue
        d = free.popleft()
        if at[d] < len(groups[d]):
            for task in groups[d][at[d]]:
                emit(*task)
            met(emitted.get((d, at[d]), ()))
            at[d] += 1
            arrive(d)
    stuck = [d for d, device in enumerate(groups) if at[d] < len(device)]
    if stuck or any(left.values()):
        waiting = [transfers[u][0] for u in range(len(transfers)) if absent[u]]
        raise TransformError(
            f"the pipeline schedule deadlocks: device(s) {stuck} never reach their next "
            f"exchange; the transfers still waiting are for the tasks (stage, microbatch, "
            f"phase) {waiting[:4]}{' ...' if len(waiting) > 4 else ''}"
        )


def pipeline_parallel(
    f: Function,
    stages: int,
    microbatches: int,
    schedule: str = "gpipe",
    devices: Sequence[DeviceRef] | None = None,
    *,
    batch_inputs: Sequence[str] | None = None,
    topology: Any = None,
    output_device: DeviceRef | None = None,
    chunks: int = 1,
    resident: bool = True,
    stage_of: Mapping[str, int] | None = None,
) -> Function:
    """``f`` pipelined over ``stages`` devices with ``microbatches`` microbatches.

    Stages: where ``f`` carries pipeline-stage annotations (``PipelineStage`` markers,
    ``ir.sharding.annotate_stages``) or ``stage_of={value_name: stage}`` is given, the
    op making each named value runs in its stage and the rest follows
    (``ir.transforms.stage_cut``); the annotations must make ``stages * chunks``
    stages. Otherwise the weights are cut into balanced consecutive groups.

    ``resident=True`` (the default): a steady-state step, each input taken on the
    device of the stage that first reads it (weights and optimizer state on their
    stage, no per-step weight sends; see :func:`setup_program`). ``resident=False``:
    inputs where ``f`` has them, sent to their stages every step.

    ``schedule="interleaved"`` (Megatron-LM's interleaved 1F1B) cuts the model into
    ``stages * chunks`` stages, stage ``c * stages + d`` on device ``d``; the
    microbatches must be a multiple of ``stages``.

    ``output_device``: send every output there (nested compositions); by default
    each output stays on the stage that made it.

    >>> import ir
    >>> from ir.transforms import pipeline_parallel
    >>> b = ir.FunctionBuilder("mlp")
    >>> w1 = b.input("w1", ir.TensorType((4, 8), ir.DType.float64, 0))
    >>> w2 = b.input("w2", ir.TensorType((8, 3), ir.DType.float64, 0))
    >>> x = b.input("x", ir.TensorType((6, 4), ir.DType.float64, 0))
    >>> a = b.call("MatMul", x, w1, name="a")
    >>> g = pipeline_parallel(b.finish(b.call("MatMul", a, w2, name="y")), 2, 2)
    >>> [op.op_type for op in g.ops][:4]
    ['Split', 'TupleGet', 'MatMul', 'Send']
    >>> [(v.name, v.type.device) for v in g.inputs]
    [('w1', 0), ('w2', 1), ('x', 0)]
    """
    check_common("pipeline_parallel", f, topology)
    resident = bool_arg("pipeline_parallel", "resident", resident)
    if output_device is not None:
        check_device(output_device, "pipeline_parallel: output_device")
    if not isinstance(schedule, str) or schedule not in SCHEDULES:
        raise TransformError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1:
        raise TransformError(f"microbatches must be a positive integer, got {microbatches!r}")
    devices = check_devices(devices, stages, topology, what="number of stages")
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise TransformError(f"chunks must be a positive integer, got {chunks!r}")
    if chunks > 1 and schedule != "interleaved":
        raise TransformError(f"chunks={chunks} needs schedule='interleaved', got {schedule!r}")
    if schedule == "interleaved" and microbatches % stages:
        raise TransformError(
            f"the interleaved schedule takes microbatches in groups of the {stages} stages; "
            f"{microbatches} is not a multiple of {stages}"
        )
    pipe = _Pipeline(
        f,
        stages * chunks,
        microbatches,
        schedule,
        devices,
        batch_inputs,
        chunks=chunks,
        resident=resident,
        stage_of=stage_of,
    )
    return pipe.run(output_device)


def live_microbatches(g: Function, device: DeviceRef) -> int:
    """The most microbatches whose activations are alive at once on ``device``.

    A value named ``*_mb{m}`` made by a compute or communication op on ``device`` is
    alive from its op to its last reader (program order). Outputs' pieces (read by the
    final ``Concat``) and gradient contributions (read by the running sum ``*_acc{m}``)
    are not activations.
    """
    function_arg("live_microbatches", "g", g)
    check_device(device, "live_microbatches: device")
    index = {op: i for i, op in enumerate(g.ops)}
    outputs = set(g.outputs)
    spans: dict[int, list[tuple[int, int]]] = {}
    for op in g.ops:
        if get_op(op.op_type).kind is OpKind.CONTROL:
            continue
        for v in op.outputs:
            match = re.search(r"_mb(\d+)(_at\w+)?$", v.name)
            if not match or not isinstance(v.type, TensorType) or v.type.device != device:
                continue
            users = g.consumers.get(v, [])
            if any(_is_sink(u, outputs) for u in users) or v in outputs:
                continue
            end = max((index[u] for u in users), default=index[op])
            spans.setdefault(int(match.group(1)), []).append((index[op], end))
    best = 0
    for t in range(len(g.ops)):
        alive = sum(any(a <= t <= e for a, e in sp) for sp in spans.values())
        best = max(best, alive)
    return best


def _is_sink(op: Op, outputs: set[Value]) -> bool:
    if op.op_type == "Concat" and op.outputs[0] in outputs:
        return True
    return any(re.search(r"_acc\d+$", v.name) for v in op.outputs)


__all__ = ["backward_ops", "live_microbatches", "pipeline_parallel", "stage_assignment"]
