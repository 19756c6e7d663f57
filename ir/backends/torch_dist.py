"""Run a distributed DistIR program on real processes with torch.distributed (gloo, CPU).

One process per device of the program. Every process walks the same program in
the same order; it computes the ops placed on its own device (with the op's
numpy kernel) and takes part in each communication op that involves it, through
torch.distributed: ``all_reduce`` and ``all_gather`` on process groups made for
the device sets the program uses (each group of a grouped collective its own),
and point-to-point ``isend``/``irecv`` for sends, scatters, gathers, all-to-all
and uneven all-gathers.

Because every process follows the global program order and each transfer joins
exactly the two processes it names, the smallest unfinished communication op
always has all its participants waiting on it: a program that the reference
executor runs cannot deadlock here.

The lowering table ``_LOWERINGS`` is this backend's own record per communication
op type; a test checks that it covers every communication op in the registry
that a global program can contain.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_module
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import DistIRError, ExecutionError
from ..execute import _bind_inputs
from ..function import Function
from ..loopback import Rendezvous, join_world
from ..op import Op
from ..ops.communication import split_array
from ..registry import OpKind, get_op
from ..types import TensorType, TupleType, devices_of
from ..value import Value
from ..verify import describe_op
from .measurement import Measurement
from .workers import (
    Progress,
    WorkerExitError,
    die_with_parent,
    exited_before,
    next_message,
    single_threaded_blas,
    start_all,
    stop,
)

__all__ = ["BackendError", "Measurement", "RankTimeoutError", "measure", "run", "run_ranked"]


class BackendError(DistIRError):
    """The program cannot run on torch.distributed (or a worker process failed).

    For a failed worker, ``device``, ``rank`` and ``op`` (the op as printed, None when
    it failed before running ops) say where, and ``worker_traceback`` holds the
    worker's traceback; the message gives all but the traceback, the original error last.
    """

    def __init__(
        self,
        message: str,
        *,
        device: int | None = None,
        rank: int | None = None,
        op: str | None = None,
        worker_traceback: str = "",
    ) -> None:
        super().__init__(message)
        self.device, self.rank, self.op = device, rank, op
        self.worker_traceback = worker_traceback


class RankTimeoutError(BackendError, ExecutionError):
    """A run that outlasted its ``timeout_s``: ``rank`` and ``device`` name the rank that
    stopped making progress (one that computes, or else the one that has waited
    longest), ``op`` the op it was at; the message says what every unfinished rank was
    doing. An ExecutionError too, as a timeout always was."""


# -- what one process holds -------------------------------------------------------


@dataclass
class _Rank:
    """The state of one worker: its device, the rank of every device, its local values."""

    device: int
    rank_of: Mapping[int, int]
    groups: Mapping[tuple[int, ...], Any]
    env: dict[Value, Any]
    tag: int = 0

    def has(self, device: Any) -> bool:
        return device == self.device


def _compute_device(op: Op) -> Any:
    """Where a compute op runs: its device, or the one device all its values live on (an
    op that makes a tuple, such as a pipeline's microbatch Split, has no single-device
    result type)."""
    if op.device is not None:
        return op.device
    found = {d for v in (*op.inputs, *op.outputs) for d in devices_of(v.type)}
    return found.pop() if len(found) == 1 else None


def _as_tuple(t: TupleType, parts: Any) -> tuple:
    """A tuple value held as {element: part} (see :func:`_local_parts`) as a tuple again."""
    return tuple(
        _as_tuple(e, parts[k]) if isinstance(e, TupleType) else parts[k]
        for k, e in enumerate(t.elements)
    )


def _local_parts(t: Any, x: Any, device: int) -> Any:
    """The part of a value that lives on ``device``: an array, a {index: array} dict, or None."""
    if isinstance(t, TensorType):
        return x if t.device == device else None
    return {
        k: _local_parts(e, xk, device) if isinstance(e, TupleType) else xk
        for k, (e, xk) in enumerate(zip(t.elements, x))
        if isinstance(e, TupleType) or e.device == device
    }


# -- the lowering of each communication op ---------------------------------------------


def _torch():
    import torch
    import torch.distributed as dist

    return torch, dist


def _exchange(rank: _Rank, transfers: Sequence[tuple[int, int, Any, Any]]) -> dict[int, Any]:
    """Run point-to-point transfers (src device, dst device, array at src, type at dst).

    Returns {transfer index: received array} for the transfers this rank receives;
    a transfer within one device is a copy.
    """
    torch, dist = _torch()
    received: dict[int, Any] = {}
    pending, buffers = [], {}
    for i, (src, dst, array, t) in enumerate(transfers):
        if src == dst == rank.device:
            received[i] = np.array(array, copy=True)
        elif src == rank.device:
            tensor = torch.from_numpy(np.ascontiguousarray(array))
            pending.append(dist.isend(tensor, rank.rank_of[dst], tag=rank.tag))
        elif dst == rank.device:
            buffers[i] = torch.empty(t.shape, dtype=_torch_dtype(t))
            pending.append(dist.irecv(buffers[i], rank.rank_of[src], tag=rank.tag))
    for request in pending:
        request.wait()
    for i, buf in buffers.items():
        received[i] = buf.numpy()
    return received


def _torch_dtype(t: TensorType):
    torch, _ = _torch()
    return torch.from_numpy(np.zeros((), dtype=t.dtype.numpy)).dtype


def _send_each(rank: _Rank, op: Op, xs: list) -> list:
    """Element k of the tuple goes to to_devices[k], all pairs at once."""
    t, out = op.inputs[0].type, op.outputs[0].type
    transfers = [
        (e.device, o.device, xs[0].get(k), o)
        for k, (e, o) in enumerate(zip(t.elements, out.elements))
    ]
    return [_exchange(rank, transfers)]


def _ring_shift(rank: _Rank, op: Op, xs: list) -> list:
    """Each member of each ring sends its element ``offset`` members on, all at once."""
    from ..ops.communication import element_groups

    t, out = op.inputs[0].type, op.outputs[0].type
    source = {}  # output element -> input element
    for g in element_groups(op.attributes.get("groups"), len(t)):
        for i, member in enumerate(g):
            source[g[(i + op.attributes["offset"]) % len(g)]] = member
    transfers = [
        (t.elements[source[k]].device, o.device, xs[0].get(source[k]), o)
        for k, o in enumerate(out.elements)
    ]
    return [_exchange(rank, transfers)]


def _send(rank: _Rank, op: Op, xs: list) -> list:
    t = op.outputs[0].type
    got = _exchange(rank, [(op.inputs[0].type.device, t.device, xs[0], t)])
    return [got.get(0)]


def _one_to_many(split: bool) -> Callable[[_Rank, Op, list], list]:
    def lower(rank: _Rank, op: Op, xs: list) -> list:
        src, out = op.inputs[0].type.device, op.outputs[0].type
        parts: list[Any] = [None] * len(out)
        if rank.has(src):
            n = len(out)
            parts = split_array(xs[0], n, op.attributes["dim"]) if split else [xs[0]] * n
        got = _exchange(rank, [(src, e.device, p, e) for p, e in zip(parts, out.elements)])
        return [got]

    return lower


def _many_to_one(combine: Callable[[list, Mapping[str, Any]], Any]) -> Callable:
    def lower(rank: _Rank, op: Op, xs: list) -> list:
        src, out = op.inputs[0].type, op.outputs[0].type
        transfers = [(e.device, out.device, xs[0].get(k), e) for k, e in enumerate(src.elements)]
        got = _exchange(rank, transfers)
        if not rank.has(out.device):
            return [None]
        return [combine([got[k] for k in range(len(transfers))], op.attributes)]

    return lower


def _reduce_parts(parts: list, attrs: Mapping[str, Any]) -> Any:
    from ..ops.communication import _reduce

    return _reduce(parts, attrs["op"])


def _group(rank: _Rank, t: TupleType):
    return rank.groups[tuple(sorted(t.devices))]


def _op_groups(op: Op, t: TupleType) -> list[tuple[list[int], TupleType]]:
    """Each group of a (possibly grouped) collective: its element positions and sub-tuple."""
    from ..ops.communication import element_groups

    return [
        (g, TupleType(tuple(t.elements[i] for i in g)))
        for g in element_groups(op.attributes.get("groups"), len(t))
    ]


def _allreduce(rank: _Rank, op: Op, xs: list) -> list:
    torch, dist = _torch()
    t = op.inputs[0].type
    ops = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}
    ops["min"] = dist.ReduceOp.MIN
    mine = {}
    for members, sub in _op_groups(op, t):
        for k in members:
            if rank.has(t.elements[k].device):
                tensor = torch.from_numpy(np.array(xs[0][k], copy=True))
                dist.all_reduce(tensor, ops[op.attributes["op"]], group=_group(rank, sub))
                value = tensor.numpy()
                mine[k] = value / len(members) if op.attributes["op"] == "mean" else value
    return [mine]


def _allgather_parts(rank: _Rank, t: TupleType, local: Mapping[int, Any]) -> list | None:
    """Every element of ``t`` on this rank (all_gather, or p2p when shapes differ)."""
    torch, dist = _torch()
    k_mine = next((k for k, e in enumerate(t.elements) if rank.has(e.device)), None)
    if len({e.shape for e in t.elements}) == 1:
        if k_mine is None:
            return None
        bufs = [torch.empty(e.shape, dtype=_torch_dtype(e)) for e in t.elements]
        mine = torch.from_numpy(np.ascontiguousarray(local[k_mine]))
        dist.all_gather(bufs, mine, group=_group(rank, t))
        order = sorted(range(len(t)), key=lambda k: rank.rank_of[t.elements[k].device])
        by_element = dict(zip(order, bufs))
        return [by_element[k].numpy() for k in range(len(t))]
    transfers = [
        (src.device, dst.device, local.get(i), src)
        for i, src in enumerate(t.elements)
        for dst in t.elements
    ]
    got = _exchange(rank, transfers)
    if k_mine is None:
        return None
    n = len(t)
    return [got[i * n + k_mine] for i in range(n)]


def _allgather(rank: _Rank, op: Op, xs: list) -> list:
    t = op.inputs[0].type
    out = {}
    for members, sub in _op_groups(op, t):
        if not any(rank.has(e.device) for e in sub.elements):
            continue  # the other groups gather among themselves
        local = {i: xs[0][k] for i, k in enumerate(members) if k in xs[0]}
        parts = _allgather_parts(rank, sub, local)
        if parts is None:
            continue
        full = np.concatenate(parts, axis=op.attributes["dim"])
        out.update({k: full for k in members if rank.has(t.elements[k].device)})
    return [out]


def _reducescatter(rank: _Rank, op: Op, xs: list) -> list:
    summed = _allreduce(rank, op, xs)[0]
    out = {}
    for members, _ in _op_groups(op, op.inputs[0].type):
        for i, k in enumerate(members):
            if k in summed:
                out[k] = split_array(summed[k], len(members), op.attributes["dim"])[i]
    return [out]


def _keepshard(rank: _Rank, op: Op, xs: list) -> list:
    """Each element keeps its group position's block of its own tensor: nothing moves."""
    from ..ops.communication import element_groups

    t = op.inputs[0].type
    out = {}
    for group in element_groups(op.attributes.get("groups"), len(t)):
        for position, k in enumerate(group):
            if rank.has(t.elements[k].device):
                out[k] = split_array(xs[0][k], len(group), op.attributes["dim"])[position]
    return [out]


def _alltoall(rank: _Rank, op: Op, xs: list) -> list:
    """Within each group (all elements: one group), member i's chunk j goes to member j,
    which concatenates what it receives in member order."""
    from ..ops.communication import element_groups

    t, out = op.inputs[0].type, op.outputs[0].type
    split, axis = op.attributes["split_dim"], op.attributes["concat_dim"]
    transfers, slots = [], {}  # slots: (dst element, src position) -> transfer index
    for g in element_groups(op.attributes.get("groups"), len(t)):
        n = len(g)
        for src in g:
            e_src = t.elements[src]
            chunks = split_array(xs[0][src], n, split) if rank.has(e_src.device) else None
            shape = list(e_src.shape)
            shape[split] //= n
            for j, dst in enumerate(g):
                slots[(dst, g.index(src))] = len(transfers)
                chunk = chunks[j] if chunks is not None else None
                transfers.append(
                    (e_src.device, out.elements[dst].device, chunk, e_src.with_shape(tuple(shape)))
                )
    got = _exchange(rank, transfers)
    result = {}
    for g in element_groups(op.attributes.get("groups"), len(t)):
        for dst in g:
            if rank.has(out.elements[dst].device):
                parts = [got[slots[(dst, i)]] for i in range(len(g))]
                result[dst] = np.concatenate(parts, axis)
    return [result]


_LOWERINGS: dict[str, Callable[[_Rank, Op, list], list]] = {
    "Send": _send,
    "SendEach": _send_each,
    "RingShift": _ring_shift,
    "Scatter": _one_to_many(split=True),
    "Broadcast": _one_to_many(split=False),
    "Gather": _many_to_one(lambda parts, a: np.concatenate(parts, axis=a["dim"])),
    "Reduce": _many_to_one(_reduce_parts),
    "AllReduce": _allreduce,
    "AllGather": _allgather,
    "ReduceScatter": _reducescatter,
    "AllToAll": _alltoall,
    "KeepShard": _keepshard,
}

# -- control ops on one rank ------------------------------------------------------------


def _control(rank: _Rank, op: Op, xs: list) -> list:
    if op.op_type == "TupleGet":
        (parts,) = xs
        i = op.attributes["index"] % len(op.inputs[0].type)
        # a tuple made by a compute op on another device (a pipeline's microbatch split)
        # has no part here
        return [None if parts is None else parts.get(i)]
    if op.op_type == "MakeTuple":
        return [
            {
                k: x
                for k, (v, x) in enumerate(zip(op.inputs, xs))
                if isinstance(v.type, TupleType) or rank.has(v.type.device)
            }
        ]
    raise BackendError(f"the torch.distributed backend cannot run {op.op_type}: {describe_op(op)}")


# -- the worker and the launcher ---------------------------------------------------------


def _collective_groups(function: Function) -> list[tuple[int, ...]]:
    """Device sets of the collectives that use process groups, in program order, once each."""
    seen: dict[tuple[int, ...], None] = {}
    for op in function.ops:
        if op.op_type in ("AllReduce", "AllGather", "ReduceScatter"):
            # a grouped op (a 3D step's) runs one collective per group, on its own group
            for _, sub in _op_groups(op, op.inputs[0].type):
                seen[tuple(sorted(sub.devices))] = None
    return list(seen)


def _involves(op: Op, device: int) -> bool:
    """Whether ``device`` takes part in a communication op (sends, receives or reduces)."""
    return any(device in devices_of(v.type) for v in (*op.inputs, *op.outputs))


def _run_ops(
    function: Function,
    rank: _Rank,
    timed: list | None = None,
    progress: Progress | None = None,
    position: int = 0,
) -> None:
    """Walk ``function`` on one rank, its values in ``rank.env``.

    With ``timed``, append ``(op index, start, end)`` (``time.perf_counter``) for each
    op this rank computes or takes part in: a communication op's time runs from this
    rank's call to its completion here, waits for its peers included. With
    ``progress``, mark each op as it starts (``position``: this rank's slot).
    """
    env, me = rank.env, rank.device
    for index, op in enumerate(function.ops):
        rank.tag = index
        xs = [env[v] for v in op.inputs]
        opdef = get_op(op.op_type)
        if progress is not None:
            progress.at(position, index, opdef.kind is OpKind.COMMUNICATION)
        start = time.perf_counter()
        if opdef.kind is OpKind.COMMUNICATION:
            results = _LOWERINGS[op.op_type](rank, op, xs)
            mine = _involves(op, me)
        elif opdef.kind is OpKind.CONTROL:
            results, mine = _control(rank, op, xs), False
        elif _compute_device(op) == me:
            # a tuple on one device is held as {element: array}; kernels take tuples
            args = [
                _as_tuple(v.type, x) if isinstance(v.type, TupleType) else x
                for v, x in zip(op.inputs, xs)
            ]
            results = [
                _local_parts(v.type, y, me) if isinstance(v.type, TupleType) else y
                for v, y in zip(op.outputs, opdef.kernel(args, op.attributes))
            ]
            mine = True
        else:
            results, mine = [None] * len(op.outputs), False
        if timed is not None and mine:
            timed.append((index, start, time.perf_counter()))
        env.update(zip(op.outputs, results))


def _worker(
    function: Function,
    args: list,
    devices: list[int],
    rank_id: int,
    world: tuple[int, int],
    outbox,
    steps: int = 0,
    parent: int = 0,
    progress: Progress | None = None,
) -> None:
    """One process: run ``function`` once (``steps=0``) and send back its outputs, or run it
    ``steps`` times, each after a barrier, and send back the barrier exits and op times.
    ``world``: the parent's rendezvous (``ir.loopback``)."""
    rank: _Rank | None = None
    try:
        die_with_parent(parent)
        torch, dist = _torch()
        torch.set_num_threads(1)
        single_threaded_blas()
        join_world(world, rank_id, len(devices))
        rank_of = {d: r for r, d in enumerate(devices)}
        groups = {g: dist.new_group([rank_of[d] for d in g]) for g in _collective_groups(function)}
        me = devices[rank_id]
        local = {v: _local_parts(v.type, x, me) for v, x in zip(function.inputs, args)}
        rank = _Rank(me, rank_of, groups, dict(local), tag=-1)
        if not steps:
            _run_ops(function, rank, None, progress, rank_id)
            rank.tag = -1
            if progress is not None:
                progress.done(rank_id)
            # no rank leaves while another still connects its groups (a rank with nothing
            # to send, as under KeepShard, would close the connection it waits for)
            dist.barrier()
            outbox.put((rank_id, [rank.env[v] for v in function.outputs], None))
        else:
            record = []
            for _ in range(steps):
                rank.env = dict(local)
                timed: list = []
                dist.barrier()  # every rank starts the step together (one host: one clock)
                origin = time.perf_counter()
                _run_ops(function, rank, timed, progress, rank_id)
                rank.tag = -1
                record.append((origin, timed))
            if progress is not None:
                progress.done(rank_id)
            dist.barrier()
            outbox.put((rank_id, record, None))
        dist.destroy_process_group()
    except Exception as e:  # said to the parent as text: an exception may not pickle
        index = rank.tag if rank is not None else -1  # the op running (-1: none)
        where = (index, describe_op(function.ops[index])) if index >= 0 else None
        outbox.put((rank_id, None, (where, f"{type(e).__name__}: {e}", traceback.format_exc())))


def _check_runnable(function: Function) -> list[int]:
    for op in function.ops:
        if op.op_type == "Pmap":
            raise BackendError("internal: pmap must be unrolled before running")
        if get_op(op.op_type).kind is OpKind.COMMUNICATION and op.op_type not in _LOWERINGS:
            raise BackendError(
                f"{op.op_type} has no torch.distributed lowering (it belongs to ranked "
                f"programs); run the global program instead: {describe_op(op)}"
            )
    values = [*function.inputs, *(v for op in function.ops for v in op.outputs)]
    for v in values:
        bad = [d for d in devices_of(v.type) if not isinstance(d, int)]
        if bad:
            raise BackendError(
                f"every value needs a concrete device to run; {v.name!r} is on {bad[0]}"
            )
    return sorted(function.devices)


def run(
    function: Function, inputs: Sequence[Any] | Mapping[str, Any], timeout_s: float = 120.0
) -> tuple[Any, ...]:
    """Run ``function`` with one torch.distributed process per device; return its outputs.

    The outputs have the same form as :func:`ir.execute`'s (arrays, tuples of arrays),
    assembled from the processes that hold them.
    """
    function = _runnable(function)
    args = _bind_inputs(function, inputs)
    devices = _check_runnable(function)
    results = _launch(function, args, devices, timeout_s, steps=0)
    return tuple(_assemble(v.type, i, results, devices) for i, v in enumerate(function.outputs))


def measure(
    function: Any,
    inputs: Sequence[Any] | Mapping[str, Any],
    steps: int = 5,
    warmup: int = 2,
    timeout_s: float = 300.0,
    *,
    carry: Mapping[int, str] | None = None,
    device: str = "cpu",
    overlap: bool | None = None,
) -> Measurement:
    """Run ``function`` ``warmup + steps`` times on real processes and time every op on every
    rank; return the :class:`~ir.backends.measurement.Measurement` of the ``steps`` after
    the warm-up (shaped like :class:`ir.sim.SimResult`: ``events``, ``step_time_s``,
    ``busy_s``).

    Every step starts with a barrier of all ranks; on one host all processes read one
    monotonic clock, so a step's times are relative to the first rank's barrier exit.
    Each step reruns the same inputs (the program's own state is not carried over).
    Programs with a ``Pmap`` run unrolled; ``measurement.function`` is what ran.

    ``function`` may also be a :class:`ir.sharding.RankedProgram`: each process then runs
    its rank's own program with torch kernels, ``carry`` feeds each step's outputs to the
    next step's inputs, and the measurement has memory curves
    (:func:`ir.backends.ranked_measure.measure_ranked`); ``device="cuda"`` runs each rank
    on its own GPU (NCCL; ``ir.backends.torch_devices``); ``overlap`` whether its
    all-reduces overlap compute (None: where the machine has the cores for it;
    ``ir.backends.torch_ranked``). A global program runs on the CPU.
    """
    from ..sharding.lower import RankedProgram

    if isinstance(function, RankedProgram):
        from .ranked_measure import measure_ranked

        return measure_ranked(
            function,
            inputs,
            steps=steps,
            warmup=warmup,
            carry=carry,
            timeout_s=timeout_s,
            device=device,
            overlap=overlap,
        )
    if overlap is not None:
        raise BackendError("overlap= needs a ranked program (ir.sharding.lower_to_ranks(program))")
    if device != "cpu":
        raise BackendError(
            f"device={device!r} needs a ranked program (ir.sharding.lower_to_ranks(program)): "
            "the global measure runs on the CPU"
        )
    if carry is not None:
        raise BackendError(
            "carry= needs a ranked program (ir.sharding.lower_to_ranks(program)): the global "
            "measure reruns the same inputs every step"
        )
    if steps < 1 or warmup < 0:
        raise BackendError(f"measure needs steps >= 1 and warmup >= 0, got {steps}, {warmup}")
    function = _runnable(function)
    args = _bind_inputs(function, inputs)
    devices = _check_runnable(function)
    results = _launch(function, args, devices, timeout_s, steps=warmup + steps)
    records = {devices[r]: record[warmup:] for r, record in results.items()}
    return Measurement.from_records(function, records)


def _runnable(function: Function) -> Function:
    if any(op.subfunctions for op in function.ops):  # pmaps and tasks
        from ..transforms import unroll_pmap

        return unroll_pmap(function)
    return function


def _launch(
    function: Function, args: list, devices: list[int], timeout_s: float, steps: int
) -> dict[int, Any]:
    """One worker process per device; {rank: what it sent back}. A failure kills them all;
    a run past ``timeout_s`` raises :class:`RankTimeoutError` naming the rank that stopped
    making progress."""
    ctx = mp.get_context("fork")
    outbox = ctx.Queue()
    progress = Progress(ctx, len(devices))
    with Rendezvous(len(devices), timeout_s) as world:
        procs = [
            ctx.Process(
                target=_worker,
                args=(function, args, devices, r, world.address, outbox, steps, os.getpid()),
                kwargs={"progress": progress},
                daemon=True,
            )
            for r in range(len(devices))
        ]
        start_all(procs, world)
        return _gather(function, devices, procs, outbox, progress, timeout_s)


def _gather(
    function: Function,
    devices: list[int],
    procs: list,
    outbox,
    progress: Progress,
    timeout_s: float,
) -> dict[int, Any]:
    """What each worker of :func:`_launch` sends back, or the error naming who failed."""
    results: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    try:
        for _ in procs:
            rank_id, outs, error = next_message(outbox, procs, deadline, skip=results)
            if error is not None:
                # a peer that died makes the others fail: name the cause first
                dead = exited_before(procs, skip={*results, rank_id})
                if dead is not None:
                    raise WorkerExitError(
                        dead.index,
                        f"{dead.how}; then the process of device {devices[rank_id]} failed: "
                        f"{error[1]}",
                    )
                raise _worker_failed(function, devices, rank_id, *error)
            results[rank_id] = outs
    except WorkerExitError as e:
        raise BackendError(
            f"the process of device {devices[e.index]} {e.how} (the others were stopped)",
            device=devices[e.index],
            rank=e.index,
        ) from None
    except queue_module.Empty:
        raise _timed_out(function, devices, results, progress, timeout_s) from None
    finally:
        stop(procs, results)
    return results


def _timed_out(
    function: Function,
    devices: list[int],
    results: Mapping[int, Any],
    progress: Progress,
    timeout_s: float,
) -> RankTimeoutError:
    """The timeout's error: who stopped making progress (:meth:`Progress.stalled`)."""
    waiting = [r for r in range(len(devices)) if r not in results]
    names = [f"rank {r} (device {d})" for r, d in enumerate(devices)]
    stuck, said = progress.stalled(waiting, names, lambda _w, i: describe_op(function.ops[i]))
    index = progress.index(stuck)
    return RankTimeoutError(
        f"torch.distributed run of {function.name!r} got no result within {timeout_s} s: {said}",
        device=devices[stuck],
        rank=stuck,
        op=describe_op(function.ops[index]) if index >= 0 else None,
    )


def _worker_failed(
    function: Function,
    devices: list[int],
    rank_id: int,
    where: tuple[int, str] | None,
    error: str,
    worker_traceback: str,
) -> BackendError:
    device = devices[rank_id]
    who = f"device {device} (rank {rank_id} of {len(devices)}) running {function.name!r}"
    if where is None:
        message = f"{who} failed outside its ops (setting up or sending results): {error}"
    else:
        index, op = where
        message = f"{who} failed at op {index}: {op}\n  {error}"
    return BackendError(
        message + "\n  (the worker's traceback: BackendError.worker_traceback)",
        device=device,
        rank=rank_id,
        op=None if where is None else where[1],
        worker_traceback=worker_traceback,
    )


def _assemble(t: Any, index: int, results: Mapping[int, list], devices: list[int]) -> Any:
    return _whole(t, [results[r][index] for r in range(len(devices))], devices)


def _whole(t: Any, parts: list, devices: list[int]) -> Any:
    """A value from each rank's local part of it (nested tuples: dicts by element)."""
    if isinstance(t, TensorType):
        return parts[devices.index(t.device)]
    return tuple(
        _whole(e, [None if p is None else p.get(k) for p in parts], devices)
        for k, e in enumerate(t.elements)
    )


def run_ranked(ranked: Any, inputs: Sequence[Any] | Mapping[str, Any], **options: Any) -> tuple:
    """Run a :class:`ir.sharding.RankedProgram` on one process per rank, each with only its
    rank class's program, torch kernels and gloo communication; see
    :func:`ir.backends.torch_ranked.run_ranked` (``steps``, ``carry``, ``timeout_s``,
    ``device``)."""
    from .torch_ranked import run_ranked as run_ranks

    return run_ranks(ranked, inputs, **options)
