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
variable bound (sub-devices resolved through ``device_map``).
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
from .costs import OpCosts, compute_key

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


class _UnknownDeviceError(Exception):
    def __init__(self, ref: Any) -> None:
        self.ref = ref


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
            raise _UnknownDeviceError(bound)
        self[ref] = index = self.index_of[bound]
        return index

    def bind(self, t: Type) -> Type:
        for var, concrete, device_map in self.bindings:
            t = bind_type(t, var, concrete, device_map)
        return t


class Engine:
    """One simulation run; :func:`ir.simulate` builds one and wraps its lists in a SimResult."""

    def __init__(
        self,
        topology: Topology,
        combine: str = "roofline",
        *,
        comm: str = "channels",
        classes: Sequence[Sequence[int]] = (),
        costs: OpCosts | None = None,
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
        self.serial_comm = comm == "serial"
        # a transfer is work on its participants' compute (CPU processes with no spare core)
        self.blocking_comm = comm == "blocking"
        self.costs = costs  # measured op times over the models (ir.sim.costs)
        self.topology = topology
        self.additive = combine == "additive"
        self.index_of = {d.device_id: i for i, d in enumerate(topology.devices)}
        # devices of one model (the same figures) time an op alike: cost each model once
        models: dict[tuple, int] = {}
        self._model_of = [models.setdefault(_hardware_of(d), len(models)) for d in topology.devices]
        first = {k: i for i, k in reversed(list(enumerate(self._model_of)))}
        self._models = [topology.devices[first[k]] for k in range(len(models))]
        self._set_classes(classes)
        n = len(topology.devices)
        self.compute_free = [0.0] * n
        # The host clock: when each device's host has issued its latest op. A kernel cannot
        # start before the host has launched it; the host runs ahead of the device but for
        # sync points (a point-to-point transfer under Megatron-LM's schedules). Devices
        # without a kernel model cost no host time and never wait for it.
        self.host_free = [0.0] * n
        self.host_comm = [d.host_comm_s() for d in topology.devices]
        self.host_sync = [d.syncs_after_p2p for d in topology.devices]
        self.hosted = any(self.host_comm) or any(d.kernels is not None for d in topology.devices)
        # when each communication channel is next free (see _channel): with comm="serial",
        # channel d is device d's one stream; with "channels", one per peer link / group
        self.comm_free = [0.0] * n if self.serial_comm else []
        self.channel_keys: list[tuple] = []  # ("send", src, dst) or ("group", *devices)
        self._channel_of: dict[tuple, int] = {}
        # Flat columns of numbers and shared objects, no per-op containers: the cyclic GC,
        # paused during the walk, would otherwise scan every one of them once it resumes.
        # values: one slot per tensor (tuple values are nested tuples of slots); a slot is
        # allocated when its producer starts and ready when it ends
        self.slot_ready: list[float] = []
        self.slot_bytes: list[int] = []
        self.slot_device: list[int] = []
        self.slot_producer: list[int] = []  # producer instance, or -1 for a function input
        # op instances (an op in a pmap body once per device): the op, its compute device
        # (int) or participants (tuple), start, duration, cost entry, and the slots it reads
        # (use_count[i] of them, consecutive in use_slots)
        self.inst_op: list[Op] = []
        self.inst_where: list[Any] = []
        self.inst_start: list[float] = []
        self.inst_dur: list[float] = []
        self.inst_cost: list[tuple] = []
        self.use_count: list[int] = []
        self.use_slots: list[int] = []
        self.pinned: list[int] = []  # function inputs and outputs: live all step
        self.comm_instances: list[int] = []  # the instances whose ``where`` is a tuple
        self.comm_channels: list[tuple[int, ...]] = []  # their channels, in the same order
        self._prepared: dict[Op, tuple] = {}
        self._opdefs: dict[str, Any] = {}
        self._cost_by_types: dict[tuple, tuple[float, float]] = {}
        self._comm_cache: dict[tuple, tuple] = {}  # by collective, size, devices, root
        self._comm_by_op: dict[tuple, tuple] = {}  # by (op, pmap bindings): pmap bodies

    # -- rank classes -------------------------------------------------------

    def _set_classes(self, classes: Sequence[Sequence[int]]) -> None:
        """``rep_of[i]``: the device index whose walk stands for device index ``i``.

        The devices of a class (of one hardware model) do identical work at identical
        times, so a pmap body runs on the first of them only, and the others' slots are
        the first's (their events and memory curves are the first's; see SimResult).
        """
        self.rep_of = list(range(len(self.topology.devices)))
        for group in classes:
            by_model: dict[int, list[int]] = {}
            for d in group:
                i = self.index_of.get(d)
                if i is not None:
                    by_model.setdefault(self._model_of[i], []).append(i)
            for members in by_model.values():
                rep = min(members)
                for i in members:
                    self.rep_of[i] = rep
        self.mirrored = any(r != i for i, r in enumerate(self.rep_of))
        self._owners: dict[tuple[int, ...], tuple[int, ...] | None] = {}

    def owners(self, devices: tuple[int, ...]) -> tuple[int, ...] | None:
        """For a tuple whose elements live on device indices ``devices``: the position whose
        value stands for each element (its class representative's), or None if each
        element stands for itself."""
        found = self._owners.get(devices, False)
        if found is not False:
            return found
        rep_of = self.rep_of
        position: dict[int, int] = {}
        for k, d in enumerate(devices):
            position.setdefault(d, k)
        owners = tuple(position.get(rep_of[d], k) for k, d in enumerate(devices))
        result = None if all(o == k for k, o in enumerate(owners)) else owners
        self._owners[devices] = result
        return result

    def flat_slots(
        self, sizes: Sequence[int], devices: Sequence[int], ready: float, producer: int
    ) -> tuple[int, ...]:
        """Slots for a tuple of tensors (``sizes`` bytes on device indices ``devices``); an
        element of a mirrored device shares its representative's slot."""
        owners = self.owners(tuple(devices)) if self.mirrored else None
        first = len(self.slot_ready)
        if owners is None:
            n = len(sizes)
            self.slot_ready.extend([ready] * n)
            self.slot_bytes.extend(sizes)
            self.slot_device.extend(devices)
            self.slot_producer.extend([producer] * n)
            return tuple(range(first, first + n))
        slots: list[int] = []
        for k, owner in enumerate(owners):
            if owner != k and owner < k:
                slots.append(slots[owner])
                continue
            if owner != k:  # the representative comes later in the tuple: filled below
                slots.append(-1)
                continue
            slots.append(len(self.slot_ready))
            self.slot_ready.append(ready)
            self.slot_bytes.append(sizes[k])
            self.slot_device.append(devices[k])
            self.slot_producer.append(producer)
        return tuple(slots[o] if s == -1 else s for s, o in zip(slots, owners))

    # -- entry ----------------------------------------------------------------

    def run(self, function: Function) -> None:
        scope = _Scope(self.index_of)
        env: dict[Value, Any] = {}
        for v in function.inputs:
            try:
                slots = self._new_slots(_template(v.type), scope, 0.0, -1)
            except _UnknownDeviceError as e:
                raise SimulationError(
                    f"input {v.name!r} of {function.name!r} lives on device {_shown(e.ref)}, "
                    f"which topology {self.topology.name!r} lacks (devices: "
                    f"{list(self.topology.device_ids)})"
                ) from None
            env[v] = slots
            self.pinned.extend(_leaves(slots))
        self._run_ops(function.ops, env, scope, once=True)
        for v in function.outputs:
            self.pinned.extend(_leaves(env[v]))

    @property
    def step_time_s(self) -> float:
        return max([0.0, *self.compute_free, *self.comm_free])

    # -- the walk -------------------------------------------------------------

    def _run_ops(
        self, ops: tuple[Op, ...], env: dict[Value, Any], scope: _Scope, once: bool = False
    ) -> None:
        # The one walk (the top level and pmap bodies): each op prepared once, its devices
        # and comm timing resolved per pmap iteration. Locals for everything it touches,
        # one append per instance and per slot, C-level map/max over operands, last uses
        # settled later with numpy.
        prepared = self._prepared
        slot_ready = self.slot_ready
        new_ready, new_bytes = slot_ready.append, self.slot_bytes.append
        new_device, new_producer = self.slot_device.append, self.slot_producer.append
        inst_op = self.inst_op
        add_op, add_where = inst_op.append, self.inst_where.append
        add_start, add_dur, add_cost = (
            self.inst_start.append,
            self.inst_dur.append,
            self.inst_cost.append,
        )
        add_count, add_uses = self.use_count.append, self.use_slots.extend
        compute_free, comm_free = self.compute_free, self.comm_free
        ready_of, value_of = slot_ready.__getitem__, env.__getitem__
        compute_kind, comm_kind = _COMPUTE_KIND, _COMMUNICATION_KIND
        prepare = self._prepare
        mirrored, rep_of = self.mirrored, self.rep_of
        blocking = self.blocking_comm
        host_free, hosted = self.host_free, self.hosted
        for op in ops:
            if once:  # a top-level op runs once: keep nothing per op (costs are shared)
                prep = prepare(op)
            else:  # a pmap body's op runs once per device
                prep = prepared.get(op)
                if prep is None:
                    prep = prepared[op] = prepare(op)
            kind = prep[0]
            try:
                if kind is compute_kind:
                    ins = list(map(value_of, op.inputs))
                    try:
                        ready = max(map(ready_of, ins)) if ins else 0.0
                    except TypeError:  # a tuple operand (Concat, Sum of a tuple)
                        ins = _leaves(ins)
                        ready = max(map(ready_of, ins)) if ins else 0.0
                    _, cost, dev_ref, templates, size, out_ref = prep
                    where = scope[dev_ref]
                    if mirrored and rep_of[where] != where:
                        raise self._false_class(op, where)
                    dur = cost[2][where]
                    start = compute_free[where]
                    if ready > start:
                        start = ready
                    hosts = cost[4]
                    if hosts is not None:  # the host issues the op, then the device runs it
                        issued = host_free[where] + hosts[where]
                        host_free[where] = issued
                        if issued > start:
                            start = issued
                    end = start + dur
                    compute_free[where] = end
                elif kind is comm_kind:
                    ins = _leaves(list(map(value_of, op.inputs)))
                    ready = max(map(ready_of, ins)) if ins else 0.0
                    where, dur, cost, channels, syncs = self._collective(op, scope, prep, once)
                    start = max([ready, *(comm_free[c] for c in channels)])
                    if blocking:
                        start = max([start, *(compute_free[d] for d in where)])
                        for d in where:
                            compute_free[d] = start + dur
                    if hosted:
                        start = self._issue(where, start)
                    end = start + dur
                    if syncs:  # the hosts wait for their devices (torch.cuda.synchronize)
                        self._sync(where, end)
                    for c in channels:
                        comm_free[c] = end
                    self.comm_instances.append(len(inst_op))
                    self.comm_channels.append(channels)
                    templates, size = prep[1], None
                else:
                    prep[1](self, op, env, scope)
                    continue
                producer = len(inst_op)
                add_op(op)
                add_where(where)
                add_start(start)
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
                for v, template in zip(op.outputs, templates):
                    if template.__class__ is tuple:  # a tensor: (size_bytes, device ref)
                        env[v] = len(slot_ready)
                        new_ready(end)
                        new_bytes(template[0])
                        new_device(scope[template[1]])
                        new_producer(producer)
                    else:
                        env[v] = self._new_slots(template, scope, end, producer)
            except _UnknownDeviceError as e:
                raise self._device_error(op, e.ref) from None

    def _issue(self, where: tuple[int, ...], start: float) -> float:
        """Each participant's host issues its part of a transfer; the transfer starts once
        every part is issued (and ``start`` has come). Mirrored devices answer for their
        class representative."""
        rep_of, host_free, host_comm = self.rep_of, self.host_free, self.host_comm
        for d in dict.fromkeys(rep_of[d] for d in where):
            issued = host_free[d] + host_comm[d]
            host_free[d] = issued
            if issued > start:
                start = issued
        return start

    def _sync(self, where: tuple[int, ...], end: float) -> None:
        """The hosts of ``where`` wait until the transfer and their devices' work are done."""
        rep_of, host_free, compute_free = self.rep_of, self.host_free, self.compute_free
        for d in dict.fromkeys(rep_of[d] for d in where):
            if self.host_sync[d]:
                host_free[d] = max(host_free[d], end, compute_free[d])

    def _false_class(self, op: Op, where: int) -> SimulationError:
        ids = self.topology.device_ids
        return SimulationError(
            f"{op.op_type} runs on device {ids[where]} alone, but the program declares that "
            f"device's rank class identical to device {ids[self.rep_of[where]]} "
            "(rank_classes): a transform that declares classes must give every member the "
            f"same work\n  in: {describe_op(op)}"
        )

    def _new_slots(self, template: Any, scope: _Scope, ready: float, producer: int) -> Any:
        """Slots for a value of ``template``'s structure (an int, or nested tuples of ints)."""
        if template.__class__ is not tuple:
            if template and all(t.__class__ is tuple for t in template):
                sizes = [t[0] for t in template]
                return self.flat_slots(sizes, [scope[t[1]] for t in template], ready, producer)
            return tuple(self._new_slots(t, scope, ready, producer) for t in template)
        self.slot_ready.append(ready)
        self.slot_bytes.append(template[0])
        self.slot_device.append(scope[template[1]])
        self.slot_producer.append(producer)
        return len(self.slot_ready) - 1

    def columns(self) -> dict[str, Any]:
        """The instance and slot columns (lists), for the result's lazy views."""
        return {
            "op": self.inst_op,
            "where": self.inst_where,
            "start": self.inst_start,
            "dur": self.inst_dur,
            "cost": self.inst_cost,
            "use_count": self.use_count,
            "use_slots": self.use_slots,
            "slot_bytes": self.slot_bytes,
            "slot_device": self.slot_device,
            "slot_producer": self.slot_producer,
        }

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
            return (_COMMUNICATION_KIND, [_template(v.type) for v in op.outputs], opdef)
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
            dtype = compute_dtype((*in_types, *out_types))
            measured = self.costs.compute.get(key) if self.costs is not None else None
            if measured is None:
                durations = self._durations(c, dtype)
            else:
                durations = [measured] * len(self._model_of)
            cost = (c.flops, nbytes, durations, sizes, self._host_times(c))
            self._cost_by_types[key] = cost
        sizes = cost[3]
        if len(sizes) == 1 and sizes[0].__class__ is tuple:
            templates = [(sizes[0][0], op.outputs[0].type.device)]
        else:
            templates = [
                (size[0], v.type.device) if size.__class__ is tuple else _template(v.type)
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
            d.op_time_s(cost, dtype, allow_tf32=tf32, additive=self.additive) for d in self._models
        ]
        return [per_model[k] for k in self._model_of]

    def _host_times(self, cost: Any) -> list[float] | None:
        """The host time to issue an op of ``cost`` on each device; None if nothing costs."""
        if not self.hosted:
            return None
        per_model = [d.host_time_s(cost) for d in self._models]
        return [per_model[k] for k in self._model_of]

    def _collective(
        self, op: Op, scope: _Scope, prep: tuple, once: bool = False
    ) -> tuple[tuple[int, ...], float, tuple[float, float], tuple[int, ...], bool]:
        """(participants, duration, cost entry, channels, whether the hosts then wait for
        their devices) of a communication op; kept per (op, pmap bindings) unless the op
        runs ``once`` (top level)."""
        opdef = prep[2]
        key = None if once else (op, scope.key)
        hit = self._comm_by_op.get(key) if key is not None else None
        if hit is not None:
            return hit
        in_types = tuple(scope.bind(v.type) for v in op.inputs)
        out_types = tuple(scope.bind(v.type) for v in op.outputs)
        for t in (*in_types, *out_types):
            for ref in _refs(t):
                scope[ref]  # raises _UnknownDeviceError for a device the topology lacks
        c = opdef.comm_rule(CostContext(in_types, out_types, op.attributes))
        ckey = (c.kind, c.size_bytes, c.devices, c.root, c.groups, opdef.extra.get("async_p2p"))
        timing = self._comm_cache.get(ckey)
        if timing is None:
            try:
                participants = tuple(self.index_of[d] for d in c.participants)
            except KeyError as e:
                raise _UnknownDeviceError(e.args[0]) from None
            dur = None
            if self.costs is not None:
                dur = self.costs.communication_time_s(c.kind, c.size_bytes, len(c.devices))
            if dur is None:
                dur = c.time_s(self.topology)
            channels = self._channels(c.kind, participants, c.groups)
            syncs = (
                c.kind == "send"
                and not opdef.extra.get("async_p2p")
                and any(self.host_sync[d] for d in participants)
            )
            timing = (participants, dur, (0.0, float(c.size_bytes)), channels, syncs)
            self._comm_cache[ckey] = timing
        if key is not None:
            self._comm_by_op[key] = timing
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
    var = op.attributes["device_var"]
    device_map = op.attributes.get("device_map")
    first = op.inputs[0].type
    assert isinstance(first, TupleType)
    ids = engine.topology.device_ids
    where = tuple(scope[ref] for ref in first.devices)
    owners = engine.owners(where) if engine.mirrored else None
    per_device: list = []
    for k, index in enumerate(where):
        if owners is not None and owners[k] != k:  # a mirror: its representative's values
            per_device.append(None)
            continue
        inner = _Scope(engine.index_of, ((var, ids[index], device_map), *scope.bindings))
        body_env = {p: env[v][k] for p, v in zip(body.inputs, op.inputs)}
        engine._run_ops(body.ops, body_env, inner)
        per_device.append([body_env[o] for o in body.outputs])
    if owners is not None:
        per_device = [per_device[o] for o in owners]
    for j, v in enumerate(op.outputs):
        env[v] = tuple(outs[j] for outs in per_device)


def _tuple_get(engine: Engine, op: Op, env: dict[Value, Any], scope: _Scope) -> None:
    env[op.outputs[0]] = env[op.inputs[0]][op.attributes["index"]]


def _make_tuple(engine: Engine, op: Op, env: dict[Value, Any], scope: _Scope) -> None:
    env[op.outputs[0]] = tuple(env[v] for v in op.inputs)


def _annotation(engine: Engine, op: Op, env: dict[Value, Any], scope: _Scope) -> None:
    # A marker (the pipeline stage of its operand's op) is its operand: no time, no memory.
    env[op.outputs[0]] = env[op.inputs[0]]


# Dispatch per structural node kind, as the executor's interpreter does.
_STRUCTURAL = {
    "Pmap": _pmap,
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


def _leaves(slots: Any) -> list[int]:
    if slots.__class__ is int:
        return [slots]
    return [s for x in slots for s in _leaves(x)]


def _map_key(device_map: Any) -> Any:
    """A pmap's ``device_map`` as a dict key (nested lists become tuples)."""
    if isinstance(device_map, (list, tuple)):
        return tuple(_map_key(m) for m in device_map)
    if isinstance(device_map, Mapping):
        return tuple(sorted(((k, _map_key(v)) for k, v in device_map.items()), key=repr))
    return device_map


def _shown(ref: Any) -> str:
    return "?" if ref is None else str(ref)
