"""The event engine: one deterministic pass over the program's ops.

Each device has a FIFO compute stream; communication runs on FIFO channels.
With ``comm="channels"`` (the default) there is one channel per directed peer
pair for point-to-point sends and one per communicator group (the set of
participants) for collectives, as NCCL gives each its own communicator and
stream: transfers on different channels run concurrently, transfers on one
channel in program order. With ``comm="serial"`` each device has one
communication stream, and a transfer waits for those of all its participants.
An op waits until its inputs are ready and its stream (channel) is free, runs
for the time the cost model gives, then frees it and makes its outputs ready.
Streams take ops in program order, as CUDA streams and NCCL communicators do,
so the program order is the schedule: a pipeline transform chooses GPipe or
1F1B by the order it writes ops in. Concurrent channels do not share link
bandwidth (no contention is modelled): each transfer takes its alpha-beta time.

Because program order is a topological order of both the data edges and the
stream-order edges, the event calendar of a discrete-event simulator (a heap of
``(time, priority, sequence)``) always pops events in the order the ops are
listed; the engine therefore walks the ops once and computes
``start = max(inputs ready, stream free)``. The trace is a pure function of the
program and topology (no wall clock, no randomness, no ties to break), and
start times are max-plus expressions of durations, so making any op or link
faster never delays anything (no scheduling anomalies).

Ops inside a Pmap body run once per device of the pmap, with the device
variable bound (sub-devices resolved through ``device_map``). Within one such run, a
stream's time is the time it last waited (``base``) plus the durations of the ops run
since, summed in order: that arithmetic lets a body whose ops all compute on the pmap's
device be scheduled from its inputs' ready times without walking its ops
(:mod:`ir.sim.bodies`), with the same result to the last bit. The devices of a rank
class share one walk (``classes``), and a tuple's elements on a class share one slot,
so the walk's cost follows the logical program and the classes, not the devices.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..device import Topology
from ..errors import DistIRError, UnknownOpError
from ..function import Function
from ..op import Op
from ..registry import CostContext, OpKind, get_op
from ..types import (
    DeviceVar,
    TensorType,
    TupleType,
    Type,
    bind_device,
    bind_type,
    compute_dtype,
)
from ..value import Value
from ..verify import describe_op
from .bodies import BodySchedule, BodyTiming, schedule_of
from .clock import on_clock
from .costs import OpCosts, compute_key
from .slots import SlotTable, UnknownDeviceError, element, leaves_of, unique_leaves
from .tasks import TaskMemo

COMBINE_MODES = ("roofline", "additive")
COMM_MODES = ("channels", "serial", "blocking")

COMPUTE, COMMUNICATION = 0, 1  # stream numbers in the trace

# Enum class attributes go through EnumType.__getattr__ (hundreds of ns each in
# Python 3.11): the hot paths compare against these module constants instead.
_COMPUTE_KIND, _COMMUNICATION_KIND, _CONTROL_KIND = (
    OpKind.COMPUTE,
    OpKind.COMMUNICATION,
    OpKind.CONTROL,
)


class SimulationError(DistIRError):
    """A program the simulator cannot cost: unknown device, op without a cost rule, ..."""


class _Scope(dict):
    """Device reference -> topology index, for one pmap iteration (or the top level)."""

    def __init__(self, index_of: dict[int, int], bindings: tuple = ()) -> None:
        super().__init__()
        self.index_of = index_of
        self.bindings = bindings  # ((var, concrete id, device_map), ...), innermost first
        self.key = tuple(
            (var, concrete, _map_key(device_map)) for var, concrete, device_map in bindings
        )

    def __missing__(self, ref: Any) -> int:
        bound = ref
        for var, concrete, device_map in self.bindings:
            bound = bind_device(bound, var, concrete, device_map)
        if isinstance(bound, bool) or not isinstance(bound, int) or bound not in self.index_of:
            raise UnknownDeviceError(bound)
        self[ref] = index = self.index_of[bound]
        return index

    def bind(self, t: Type) -> Type:
        for var, concrete, device_map in self.bindings:
            t = bind_type(t, var, concrete, device_map)
        return t


class Engine(SlotTable):
    """One simulation run; :func:`ir.simulate` builds one and wraps it in a SimResult.

    ``share_bodies``: schedule the pmap bodies that qualify once per device model
    (:mod:`ir.sim.bodies`) instead of walking their ops on every application; the
    result is the same to the last bit (``False`` is the reference it is tested against).
    ``share_tasks`` (by default ``share_bodies``): time a task application whose start
    times are an earlier one's shifted from that one (:mod:`ir.sim.tasks`), likewise.
    """

    def __init__(
        self,
        topology: Topology,
        combine: str = "roofline",
        *,
        comm: str = "channels",
        classes: Sequence[Sequence[int]] = (),
        costs: OpCosts | None = None,
        share_bodies: bool = True,
        share_tasks: bool | None = None,
    ) -> None:
        if not isinstance(combine, str) or combine not in COMBINE_MODES:
            raise SimulationError(
                f"combine must be one of {', '.join(COMBINE_MODES)}, got {combine!r}"
            )
        if not isinstance(comm, str) or comm not in COMM_MODES:
            raise SimulationError(
                f"comm must be one of {', '.join(COMM_MODES)} ('channels': one FIFO channel "
                f"per peer pair and per collective group; 'serial': one FIFO communication "
                f"stream per device; 'blocking': channels, and a transfer also holds its "
                f"participants' compute), got {comm!r}"
            )
        super().__init__(topology)
        self.serial_comm = comm == "serial"
        # a transfer is work on its participants' compute (CPU processes with no spare core)
        self.blocking_comm = comm == "blocking"
        self.costs = costs  # measured op times over the models (ir.sim.costs)
        self.additive = combine == "additive"
        self.share_bodies = share_bodies
        # repeated tasks replayed from an earlier application (ir.sim.tasks); by default
        # with the shared bodies, both off being the reference walk
        if share_tasks is None:
            share_tasks = share_bodies
        self.task_memo = TaskMemo() if share_tasks else None
        # devices of one model (the same figures) time an op alike: cost each model once
        models: dict[tuple, int] = {}
        self._model_of = [models.setdefault(_hardware_of(d), len(models)) for d in topology.devices]
        first = {k: i for i, k in reversed(list(enumerate(self._model_of)))}
        self._models = [topology.devices[first[k]] for k in range(len(models))]
        self._set_classes(classes, self._model_of)
        n = len(topology.devices)
        self.compute_free = [0.0] * n
        # The host clock: when each device's host has issued its latest op. A kernel cannot
        # start before the host has launched it; the host runs ahead of the device but for
        # sync points (a point-to-point transfer under Megatron-LM's schedules). Devices
        # without a kernel model cost no host time and never wait for it.
        self.host_free = [0.0] * n
        self.host_comm = [on_clock(d.host_comm_s()) for d in topology.devices]
        self.host_sync = [d.syncs_after_p2p for d in topology.devices]
        # Point-to-point transfers a host issues one after another (nothing issued between)
        # are one batch_isend_irecv: all posted, then one wait for them all. The host's
        # clock when it posted the batch's latest (p2p_posted[d]), and its clock after the
        # wait (p2p_waited[d]): while host_free[d] is still that, the batch goes on.
        self.p2p_posted = [0.0] * n
        self.p2p_waited = [-1.0] * n
        self.hosted = any(self.host_comm) or any(d.kernels is not None for d in topology.devices)
        # A stream's time inside a pmap body's run: it last waited until seg_base[d] and
        # has run ops of seg_off[d] seconds since (compute_free[d] is always seg_base[d] +
        # seg_off[d]); the host's likewise (host_free[d] = host_base[d] + host_off[d]).
        # See ir.sim.bodies: this is what lets a body be scheduled without a walk.
        self.seg_base = [0.0] * n
        self.seg_off = [0.0] * n
        self.host_base = [0.0] * n
        self.host_off = [0.0] * n
        # when each communication channel is next free (see _channel): with comm="serial",
        # channel d is device d's one stream; with "channels", one per peer link / group
        self.comm_free = [0.0] * n if self.serial_comm else []
        self.channel_keys: list[tuple] = []  # ("send", src, dst) or ("group", *devices)
        self._channel_of: dict[tuple, int] = {}
        # units, in program order: an op instance (an op in a walked pmap body once per
        # device), or one application of a scheduled body (cost None; see ``apps``): the
        # op, its compute device (int) or participants (tuple), start, end (as the walk
        # found it: a body's base plus the time run since, not always start + dur to the
        # last bit), duration, cost entry, and the slots it reads (use_count[i] of them,
        # consecutive in use_slots)
        self.inst_op: list[Op] = []
        self.inst_where: list[Any] = []
        self.inst_start: list[float] = []
        self.inst_end: list[float] = []
        self.inst_dur: list[float] = []
        self.inst_cost: list[tuple | None] = []
        self.use_count: list[int] = []
        self.use_slots: list[int] = []
        self.pinned: list[int] = []  # function inputs and outputs: live all step
        # per top-level op, its first unit: the units from there to the next one's are its
        # own or, for a pmap, its body's runs (Bars.top)
        self.top_start: list[int] = []
        self.comm_instances: list[int] = []  # the units whose ``where`` is a tuple
        self.comm_channels: list[tuple[int, ...]] = []  # their channels, in the same order
        self.comm_groups: list[int] = []  # and their participants' index in participant_sets
        # applications of scheduled bodies, as columns: the unit, schedule and timing, the
        # base of the first segment (the others: app_segments, for the few that wait
        # inside), the input slots (app_in_slots: schedule.num_inputs per application)
        # and the first of the slots its made outputs take (consecutive)
        self.app_unit: list[int] = []
        self.app_schedule: list[BodySchedule] = []
        self.app_timing: list[BodyTiming] = []
        self.app_base: list[float] = []
        self.app_segments: dict[int, tuple[tuple[int, float], ...]] = {}
        self.app_in_slots: list[int] = []
        self.app_first: list[int] = []
        self.participant_sets: list[tuple[int, ...]] = []  # distinct collective groups
        self._prepared: dict[Op, tuple] = {}
        self._opdefs: dict[str, Any] = {}
        self._cost_by_types: dict[tuple, tuple[float, float]] = {}
        self._comm_cache: dict[tuple, tuple] = {}  # by collective, size, devices, root
        self._comm_by_op: dict[tuple, tuple] = {}  # by (op, pmap bindings): pmap bodies
        self._comm_by_types: dict[tuple, list] = {}  # by types: [(attributes, timing)]
        self._schedules: dict[tuple[Function, str], BodySchedule | None] = {}
        # bodies of one shape (ops alike, wired alike: a stage's layers, every stage of a
        # model of equal layers) share their schedule's tables (ir.sim.bodies.schedule_of)
        self._shapes: dict[tuple, BodySchedule] = {}
        self._pmap_plans: dict[tuple, tuple] = {}

    # -- entry ----------------------------------------------------------------

    def run(self, function: Function) -> None:
        scope = _Scope(self.index_of)
        env: dict[Value, Any] = {}
        for v in function.inputs:
            try:
                slots = self.new_slots(v.type, scope, 0.0, -1)
            except UnknownDeviceError as e:
                raise SimulationError(
                    f"input {v.name!r} of {function.name!r} lives on device {_shown(e.ref)}, "
                    f"which topology {self.topology.name!r} lacks (devices: "
                    f"{list(self.topology.device_ids)})"
                ) from None
            env[v] = slots
            self.pinned.extend(unique_leaves(slots))
        self._run_ops(function.ops, env, scope, once=True)
        for v in function.outputs:
            self.pinned.extend(unique_leaves(env[v]))

    @property
    def step_time_s(self) -> float:
        return max([0.0, *self.compute_free, *self.comm_free])

    # -- the walk -------------------------------------------------------------

    def _run_ops(
        self,
        ops: tuple[Op, ...],
        env: dict[Value, Any],
        scope: _Scope,
        once: bool = False,
        top: bool = True,
    ) -> None:
        # The one walk (the top level, task bodies and pmap bodies): each op prepared once,
        # its devices and comm timing resolved per pmap iteration. Locals for everything it
        # touches, one append per instance and per slot, C-level map/max over operands,
        # last uses settled later with numpy. ``once``: ops of their own (the top level's
        # and a task body's: each runs once per run of its program); ``top``: the top
        # level's, each run once in all (nothing kept per op), where a task body's ops run
        # once per application of the task (prepared once, like a pmap body's).
        fresh = once and top
        prepared = self._prepared
        slot_ready = self.slot_ready
        new_ready, new_bytes = slot_ready.append, self.slot_bytes.append
        new_device, new_producer = self.slot_device.append, self.slot_producer.append
        inst_op = self.inst_op
        add_op, add_where = inst_op.append, self.inst_where.append
        add_start, add_end, add_dur, add_cost = (
            self.inst_start.append,
            self.inst_end.append,
            self.inst_dur.append,
            self.inst_cost.append,
        )
        add_count, add_uses = self.use_count.append, self.use_slots.extend
        compute_free, comm_free = self.compute_free, self.comm_free
        seg_base, seg_off = self.seg_base, self.seg_off
        host_free, host_base, host_off, hosted = (
            self.host_free,
            self.host_base,
            self.host_off,
            self.hosted,
        )
        ready_of, value_of = slot_ready.__getitem__, env.__getitem__
        compute_kind, comm_kind = _COMPUTE_KIND, _COMMUNICATION_KIND
        prepare = self._prepare
        mirrored, rep_of = self.mirrored, self.rep_of
        blocking = self.blocking_comm
        add_top = self.top_start.append
        for op in ops:
            if fresh:  # a top-level op runs once: keep nothing per op (costs are shared)
                add_top(len(inst_op))
                prep = prepare(op)
            else:  # a body's op runs once per device, or per application of its task
                prep = prepared.get(op)
                if prep is None:
                    prep = prepared[op] = prepare(op)
            kind = prep[0]
            try:
                if kind is compute_kind:
                    ins = list(map(value_of, op.inputs))
                    try:
                        ready = max(map(ready_of, ins)) if ins else 0.0
                        if ins and min(ins) < 0:  # a class's tuple (~slot: see element)
                            raise TypeError
                    except TypeError:  # a tuple operand (Concat, Sum of a tuple)
                        ins = leaves_of(ins)
                        ready = max(map(ready_of, ins)) if ins else 0.0
                    _, cost, dev_ref, templates, size, out_ref = prep
                    where = scope[dev_ref]
                    if mirrored and rep_of[where] != where:
                        raise self._false_class(op, where)
                    dur = cost[2][where]
                    start = compute_free[where]
                    hosts = cost[4]
                    if once:  # an op of its own: start when ready, free and issued
                        if ready > start:
                            start = ready
                        if hosts is not None:  # the host issues the op, then the device runs it
                            issued = host_free[where] = host_base[where] = (
                                host_free[where] + hosts[where]
                            )
                            host_off[where] = 0.0
                            if issued > start:
                                start = issued
                        end = seg_base[where] = start + dur
                        seg_off[where] = 0.0
                    else:  # in a body's run: each stream's base plus the time run since
                        if hosts is not None:
                            h = host_off[where] + hosts[where]
                            host_off[where] = h
                            issued = host_free[where] = host_base[where] + h
                            if issued > ready:
                                ready = issued
                        if ready > start:
                            start = seg_base[where] = ready
                            off = dur
                        else:
                            off = seg_off[where] + dur
                        seg_off[where] = off
                        end = seg_base[where] + off
                    compute_free[where] = end
                elif kind is comm_kind:
                    ins = leaves_of(list(map(value_of, op.inputs)))
                    ready = max(map(ready_of, ins)) if ins else 0.0
                    timing = self._collective(op, scope, prep, fresh)
                    where, dur, cost, channels, group = timing[:5]
                    start = max([ready, *(comm_free[c] for c in channels)])
                    if blocking or op.attributes.get("stream") == "compute":
                        start = max([start, *(compute_free[d] for d in where)])
                        for d in where:
                            compute_free[d] = seg_base[d] = start + dur
                            seg_off[d] = 0.0
                    if timing[5]:  # a batch of point-to-point transfers (see _post)
                        start = self._post(timing[6], start)
                    elif hosted:
                        start = self._issue(timing[6], start)
                    end = start + dur
                    if timing[5]:  # the hosts wait for their devices (torch.cuda.synchronize)
                        self._sync(timing[6], end)
                    for c in channels:
                        comm_free[c] = end
                    self.comm_instances.append(len(inst_op))
                    self.comm_channels.append(channels)
                    self.comm_groups.append(group)
                    templates, size = prep[1], None
                else:
                    prep[1](self, op, env, scope)
                    continue
                producer = len(inst_op)
                add_op(op)
                add_where(where)
                add_start(start)
                add_end(end)
                add_dur(dur)
                add_cost(cost)
                add_count(len(ins))
                add_uses(ins)
                if size is not None:  # the common case: one tensor result
                    env[op.outputs[0]] = len(slot_ready)
                    new_ready(end)
                    new_bytes(size)
                    new_device(scope[out_ref])
                    new_producer(producer)
                    continue
                for v, t in zip(op.outputs, templates):
                    if t.__class__ is tuple:  # a compute op's tensor: (size_bytes, device ref)
                        env[v] = len(slot_ready)
                        new_ready(end)
                        new_bytes(t[0])
                        new_device(scope[t[1]])
                        new_producer(producer)
                    else:  # a type
                        env[v] = self.new_slots(t, scope, end, producer)
            except UnknownDeviceError as e:
                raise self._device_error(op, e.ref) from None

    def _issue(self, hosts: tuple[int, ...], start: float) -> float:
        """Each participant's host issues its part of a transfer; the transfer starts once
        every part is issued (and ``start`` has come). ``hosts``: the participants' class
        representatives (mirrored devices answer for them)."""
        host_free, host_base, host_off, host_comm = (
            self.host_free,
            self.host_base,
            self.host_off,
            self.host_comm,
        )
        for d in hosts:
            issued = host_free[d] = host_base[d] = host_free[d] + host_comm[d]
            host_off[d] = 0.0
            if issued > start:
                start = issued
        return start

    def _post(self, hosts: tuple[int, ...], start: float) -> float:
        """:meth:`_issue` for a point-to-point transfer after which the hosts synchronise:
        a host that has issued nothing since its last such transfer posts this one in the
        same batch (Megatron-LM's ``batch_isend_irecv`` of an exchange's sends and
        receives), from its clock before that batch's wait, not after it: the transfers
        of one exchange run together, and the host waits once for them all."""
        host_free, host_comm, posted, waited = (
            self.host_free,
            self.host_comm,
            self.p2p_posted,
            self.p2p_waited,
        )
        for d in hosts:
            clock = posted[d] if host_free[d] == waited[d] else host_free[d]
            issued = posted[d] = clock + host_comm[d]
            if issued > host_free[d]:
                host_free[d] = self.host_base[d] = issued
                self.host_off[d] = 0.0
            if issued > start:
                start = issued
        return start

    def _sync(self, hosts: tuple[int, ...], end: float) -> None:
        """The hosts of ``hosts`` wait until the transfer and their devices' work are done."""
        host_free, compute_free, waited = self.host_free, self.compute_free, self.p2p_waited
        for d in hosts:
            if self.host_sync[d]:
                host_free[d] = self.host_base[d] = waited[d] = max(
                    host_free[d], end, compute_free[d]
                )
                self.host_off[d] = 0.0

    def _false_class(self, op: Op, where: int) -> SimulationError:
        ids = self.topology.device_ids
        return SimulationError(
            f"{op.op_type} runs on device {ids[where]} alone, but the program declares that "
            f"device's rank class identical to device {ids[self.rep_of[where]]} "
            "(rank_classes): a transform that declares classes must give every member the "
            f"same work\n  in: {describe_op(op)}"
        )

    # -- scheduled pmap bodies ----------------------------------------------------

    def schedule(self, body: Function, var: str) -> BodySchedule | None:
        """The body's schedule if it qualifies (see :func:`ir.sim.bodies.schedule_of`)."""
        key = (body, var)
        if key not in self._schedules:
            prepared = self._prepared

            def prepare(op: Op) -> tuple:
                found = prepared.get(op)
                if found is None:
                    found = prepared[op] = self._prepare(op)
                return found

            found = schedule_of(body, var, prepare, self._shapes) if self.share_bodies else None
            self._schedules[key] = found
        return self._schedules[key]

    def segments(self, app: int) -> tuple[tuple[int, float], ...]:
        """The segments of application ``app`` (see :mod:`ir.sim.bodies`)."""
        return self.app_segments.get(app) or ((0, self.app_base[app]),)

    def pmap_plan(self, op: Op, body: Function, scope: _Scope) -> tuple:
        """``(layout, schedule or None, [(element, device index, timing)] of the elements
        the walk runs)`` of a pmap: the same for every pmap of ``body`` over one tuple type
        (a stage's microbatches), so found once."""
        first = op.inputs[0].type
        var = op.attributes["device_var"]
        device_map = op.attributes.get("device_map")
        key = (body, first, scope.key, var, device_map is None)
        found = self._pmap_plans.get(key)
        if found is None:
            if not isinstance(first, TupleType):
                raise UnknownDeviceError(None)
            layout = self.layout(first, scope)
            if layout is None:
                raise UnknownDeviceError(None)
            schedule = self.schedule(body, var) if device_map is None else None
            reps = []
            for k in layout.reps:
                index = layout.where[k]
                timing = None
                if schedule is not None:
                    timing = schedule.timing(self._model_of[index], index)
                reps.append((k, index, timing))
            found = self._pmap_plans[key] = (layout, schedule, reps)
        return found

    def apply(
        self, op: Op, schedule: BodySchedule, timing: BodyTiming, index: int, in_slots: list[int]
    ) -> list:
        """Run one application of ``schedule`` (the body of pmap ``op``, ``timing`` on its
        device model) on device index ``index``, its inputs in ``in_slots``; return the
        slots of the body's outputs."""
        ready = self.slot_ready
        free = self.compute_free[index]
        host = self.host_free[index]
        readies = [ready[s] for s in in_slots]
        segments, times, end = schedule.apply(timing, free, readies, host)
        self.compute_free[index] = self.seg_base[index] = end
        self.seg_off[index] = 0.0
        if timing.host_offsets is not None:
            self.host_free[index] = self.host_base[index] = host + timing.host_offsets[-1]
            self.host_off[index] = 0.0
        unit = len(self.inst_op)
        start = segments[0][1]
        self.inst_op.append(op)
        self.inst_where.append(index)
        self.inst_start.append(start)
        self.inst_end.append(end)
        self.inst_dur.append(end - start)
        self.inst_cost.append(None)
        self.use_count.append(0)  # its reads are the expansion's (ir.sim.expand)
        first = len(ready)
        n = len(times)
        ready.extend(times)
        self.slot_bytes.extend(schedule.made_bytes)
        self.slot_device.extend([index] * n)
        self.slot_producer.extend([unit] * n)
        if len(segments) > 1:
            self.app_segments[len(self.app_unit)] = segments
        self.app_unit.append(unit)
        self.app_schedule.append(schedule)
        self.app_timing.append(timing)
        self.app_base.append(start)
        self.app_in_slots += in_slots
        self.app_first.append(first)
        return [in_slots[r] if r >= 0 else first + ~r for r in schedule.output_refs]

    # -- per-op data, computed once per op ------------------------------------

    def _prepare(self, op: Op) -> tuple:
        opdef = self._opdefs.get(op.op_type)
        if opdef is None:
            try:
                opdef = self._opdefs[op.op_type] = get_op(op.op_type)
            except UnknownOpError as e:
                raise SimulationError(f"{e}\n  in: {describe_op(op)}") from None
        kind = opdef.kind
        if kind is _CONTROL_KIND:
            structural = _STRUCTURAL.get(opdef.name)
            if structural is None:
                raise SimulationError(
                    f"the simulator has no rule for the structural op {opdef.name}\n"
                    f"  in: {describe_op(op)}"
                )
            return (_CONTROL_KIND, structural)
        if kind is _COMMUNICATION_KIND:
            if opdef.comm_rule is None:
                raise SimulationError(
                    f"communication op {opdef.name} has no comm_rule, so the simulator cannot "
                    "cost it; attach one with ir.registry.attach_rule(name, 'comm_rule', fn)\n"
                    f"  in: {describe_op(op)}"
                )
            return (_COMMUNICATION_KIND, [v.type for v in op.outputs], opdef)
        if opdef.cost_rule is None:
            raise SimulationError(
                f"op {opdef.name} has no cost rule, so the simulator cannot time it; give its "
                f"OpDef a cost_rule\n  in: {describe_op(op)}"
            )
        # Ops of one type on equal shapes cost the same: key the cost rule's answer (and the
        # output sizes) by type and shapes, so a long program evaluates each rule a few times.
        key = compute_key(opdef.name, op)
        cost = self._cost_by_types.get(key)
        if cost is None:
            in_types = tuple(v.type for v in op.inputs)
            out_types = tuple(v.type for v in op.outputs)
            c = opdef.cost_rule(CostContext(in_types, out_types, op.attributes))
            nbytes = c.bytes_read + c.bytes_written
            sizes = [_template(t) for t in out_types]  # device refs replaced below
            grown = opdef.extra.get("appends_to")
            if grown is not None:  # result 0 extends an operand's storage in place (KV cache)
                sizes[0] = (sizes[0][0] - in_types[grown].size_bytes, sizes[0][1])
            dtype = compute_dtype((*in_types, *out_types))
            measured = self.costs.compute.get(key) if self.costs is not None else None
            if measured is None:
                durations = self._durations(c, dtype)
            else:
                durations = [on_clock(measured)] * len(self._model_of)
            # the key last: what bodies of equal shape are told apart by (ir.sim.bodies)
            cost = (c.flops, nbytes, durations, sizes, self._host_times(c), key)
            self._cost_by_types[key] = cost
        sizes = cost[3]
        if len(sizes) == 1 and sizes[0].__class__ is tuple:
            templates = [(sizes[0][0], op.outputs[0].type.device)]
        else:
            templates = [
                (size[0], v.type.device) if size.__class__ is tuple else v.type
                for size, v in zip(sizes, op.outputs)
            ]
        dev_ref = op.device
        if dev_ref is None:
            refs = [r for v in (*op.outputs, *op.inputs) for r in _refs(v.type)]
            dev_ref = refs[0] if refs else None
        single = templates[0] if len(templates) == 1 and templates[0].__class__ is tuple else None
        size, out_ref = single if single is not None else (None, None)
        return (_COMPUTE_KIND, cost, dev_ref, templates, size, out_ref)

    def _durations(self, cost: Any, dtype: Any = None) -> list[float]:
        """The time of a compute op of ``cost`` on each device (``Device.op_time_s``: the
        device's kernel model, or launch + roofline, additive with ``combine="additive"``)."""
        tf32 = self.topology.allow_tf32
        per_model = [
            on_clock(d.op_time_s(cost, dtype, allow_tf32=tf32, additive=self.additive))
            for d in self._models
        ]
        return [per_model[k] for k in self._model_of]

    def _host_times(self, cost: Any) -> list[float] | None:
        """The host time to issue an op of ``cost`` on each device; None if nothing costs."""
        if not self.hosted:
            return None
        per_model = [on_clock(d.host_time_s(cost)) for d in self._models]
        return [per_model[k] for k in self._model_of]

    def _collective(self, op: Op, scope: _Scope, prep: tuple, once: bool = False) -> tuple:
        """(participants, duration, cost entry, channels, index of the participants in
        ``participant_sets``, whether the hosts then wait for their devices, the
        participants' class representatives) of a communication op; kept per (op, pmap
        bindings) for a body's op, and per (types, attributes) for all."""
        key = None if once else (op, scope.key)
        hit = self._comm_by_op.get(key) if key is not None else None
        if hit is not None:
            return hit
        # A program repeats each transfer (every microbatch's, on types it shares): its
        # rule is asked once per types and attributes, whatever the number of devices.
        typed = (
            op.op_type,
            tuple([v.type for v in op.inputs]),
            tuple([v.type for v in op.outputs]),
            scope.key,
        )
        attributes = op.attributes
        seen = self._comm_by_types.setdefault(typed, [])
        for known, timing in seen:
            if known is attributes or known == attributes:
                if key is not None:
                    self._comm_by_op[key] = timing
                return timing
        timing = self._timing(op, scope, prep[2])
        seen.append((attributes, timing))
        if key is not None:
            self._comm_by_op[key] = timing
        return timing

    def _timing(self, op: Op, scope: _Scope, opdef: Any) -> tuple:
        in_types = tuple(scope.bind(v.type) for v in op.inputs)
        out_types = tuple(scope.bind(v.type) for v in op.outputs)
        for t in (*in_types, *out_types):
            for ref in _refs(t):
                scope[ref]  # raises UnknownDeviceError for a device the topology lacks
        c = opdef.comm_rule(CostContext(in_types, out_types, op.attributes))
        ckey = (c.kind, c.size_bytes, c.devices, c.root, c.groups, opdef.extra.get("async_p2p"))
        timing = self._comm_cache.get(ckey)
        if timing is None:
            try:
                participants = tuple(self.index_of[d] for d in c.participants)
            except KeyError as e:
                raise UnknownDeviceError(e.args[0]) from None
            dur = None
            if self.costs is not None:
                dur = self.costs.communication_time_s(c.kind, c.size_bytes, len(c.devices))
            if dur is None:
                dur = c.time_s(self.topology)
            dur = on_clock(dur)
            channels = self._channels(c.kind, participants, c.groups)
            group = len(self.participant_sets)
            self.participant_sets.append(participants)
            syncs = (
                c.kind == "send"
                and not opdef.extra.get("async_p2p")
                and any(self.host_sync[d] for d in participants)
            )
            hosts = tuple(dict.fromkeys(self.rep_of[d] for d in participants))
            timing = (participants, dur, (0.0, float(c.size_bytes)), channels, group, syncs, hosts)
            self._comm_cache[ckey] = timing
        return timing

    def _channels(
        self, kind: str, participants: tuple[int, ...], groups: tuple = ()
    ) -> tuple[int, ...]:
        """The FIFO channels a transfer occupies (indices into ``comm_free``).

        ``serial``: the communication stream of every participant. ``channels``: one
        channel, as NCCL has one communicator (and stream) per peer pair for
        point-to-point and per process group for collectives: a send's is its
        (source, destination) pair, one per direction; a collective's is its group,
        the set of its participants (whatever the root or ring order).
        """
        if kind == "local":  # nothing moves: no channel to wait for
            return ()
        if self.serial_comm:
            return participants
        if groups:  # a grouped op: one communicator per group, one stream for the op's groups
            key: tuple = ("groups", kind == "send", groups)
        elif kind == "send":
            key = ("send", participants[0], participants[-1])
        else:
            key = ("group", *sorted(participants))
        channel = self._channel_of.get(key)
        if channel is None:
            channel = self._channel_of[key] = len(self.comm_free)
            self.comm_free.append(0.0)
            self.channel_keys.append(key)
        return (channel,)

    def _device_error(self, op: Op, ref: Any) -> SimulationError:
        if ref is None or isinstance(ref, DeviceVar):
            what = "has no device assigned" if ref is None else f"uses unresolved device {ref}"
            return SimulationError(
                f"{op.op_type} {what}; place every value on a device before simulating\n"
                f"  in: {describe_op(op)}"
            )
        return SimulationError(
            f"device {ref} used by {op.op_type} is not in topology {self.topology.name!r} "
            f"(devices: {list(self.topology.device_ids)})\n  in: {describe_op(op)}"
        )


# -- structural ops: zero time, they only re-wire slots ---------------------------


def _pmap(engine: Engine, op: Op, env: dict[Value, Any], scope: _Scope) -> None:
    (body,) = op.subfunctions
    plan = engine.pmap_plan(op, body, scope)
    layout, schedule, reps = plan
    per_rep: list[list] = []
    if schedule is not None:
        apply = engine.apply
        for k, index, timing in reps:
            per_rep.append(
                apply(op, schedule, timing, index, [element(env[v], k) for v in op.inputs])
            )
    else:
        var = op.attributes["device_var"]
        device_map = op.attributes.get("device_map")
        ids = engine.topology.device_ids
        for k, index, _ in reps:
            inner = _Scope(engine.index_of, ((var, ids[index], device_map), *scope.bindings))
            body_env = {p: element(env[v], k) for p, v in zip(body.inputs, op.inputs)}
            engine.seg_base[index] = engine.compute_free[index]  # a run: its own segments
            engine.seg_off[index] = 0.0
            engine.host_base[index] = engine.host_free[index]
            engine.host_off[index] = 0.0
            engine._run_ops(body.ops, body_env, inner)
            per_rep.append([body_env[o] for o in body.outputs])
    if len(per_rep) == 1:
        assemble, outs = layout.assemble, per_rep[0]
        for j, v in enumerate(op.outputs):
            env[v] = assemble([outs[j]])
        return
    for j, v in enumerate(op.outputs):
        env[v] = layout.assemble([outs[j] for outs in per_rep])


def _task(engine: Engine, op: Op, env: dict[Value, Any], scope: _Scope) -> None:
    # The body's ops as if they stood in its place (each on its own, program order): the
    # same walk as the flat program's, with the body's values bound to this application's;
    # or, where an earlier application started from the same times shifted, that one's
    # units and slots shifted (ir.sim.tasks: the same to the last bit).
    (body,) = op.subfunctions
    values = list(map(env.__getitem__, op.inputs))

    def walk() -> list:
        inner = dict(zip(body.inputs, values))
        engine._run_ops(body.ops, inner, scope, once=True, top=False)
        return [inner[out] for out in body.outputs]

    memo = engine.task_memo
    outs = walk() if memo is None or scope.bindings else memo.run(engine, body, values, walk)
    for v, out in zip(op.outputs, outs):
        env[v] = out


def _tuple_get(engine: Engine, op: Op, env: dict[Value, Any], scope: _Scope) -> None:
    env[op.outputs[0]] = element(env[op.inputs[0]], op.attributes["index"])


def _make_tuple(engine: Engine, op: Op, env: dict[Value, Any], scope: _Scope) -> None:
    env[op.outputs[0]] = tuple(env[v] for v in op.inputs)


def _annotation(engine: Engine, op: Op, env: dict[Value, Any], scope: _Scope) -> None:
    # A marker (the pipeline stage of its operand's op) is its operand: no time, no memory.
    env[op.outputs[0]] = env[op.inputs[0]]


# Dispatch per structural node kind, as the executor's interpreter does.
_STRUCTURAL = {
    "Pmap": _pmap,
    "Task": _task,
    "TupleGet": _tuple_get,
    "MakeTuple": _make_tuple,
    "PipelineStage": _annotation,
}


# -- helpers ----------------------------------------------------------------------


def _template(t: Type) -> Any:
    """(size_bytes, device ref) for a tensor; a list of templates for a tuple."""
    if isinstance(t, TensorType):
        return (t.size_bytes, t.device)
    return [_template(e) for e in t.elements]


def _hardware_of(device: Any) -> tuple:
    """What a device's compute times depend on (everything but its id and name)."""
    return (
        device.peak_flops,
        device.matrix_peak_flops,
        device.vector_peak_flops,
        device.mem_bandwidth_bytes_per_s,
        device.launch_overhead_s,
        device.kernels,
    )


def _refs(t: Type) -> list[Any]:
    if isinstance(t, TensorType):
        return [t.device]
    return [r for e in t.elements for r in _refs(e)]


def _map_key(device_map: Any) -> Any:
    """A pmap's ``device_map`` as a dict key (nested lists become tuples)."""
    if isinstance(device_map, (list, tuple)):
        return tuple(_map_key(m) for m in device_map)
    if isinstance(device_map, Mapping):
        return tuple(sorted(((k, _map_key(v)) for k, v in device_map.items()), key=repr))
    return device_map


def _shown(ref: Any) -> str:
    return "?" if ref is None else str(ref)
