"""Run ranked (per-rank) programs on real processes: torch kernels, torch.distributed.

:func:`run_ranked` takes what ``ir.sharding.lower_to_ranks`` makes: one process per
rank receives only its rank class's program and its own rank parameters
(``RankedProgram.unique`` and ``parameters``; ranks of a class share one program),
executes its ops with torch kernels (``ir.backends.torch_kernels``) and talks to the
others through ``torch.distributed`` on loopback only (``ir.loopback``): gloo
on the CPU, or, with ``device="cuda"``, NCCL with each rank on its own GPU
(``ir.backends.torch_devices``):

* ``SendTo`` / ``RecvFrom`` pairs, as the lowering matched them (peer and tag), are
  ``isend`` / ``irecv``; a rank waits for its sends at the end of a step;
* a ``RankCollective`` runs on the process group of its ``group`` (every group of
  every program is made, in one order, on every process): ``all_reduce``, and, as
  gloo has no reduce-scatter or all-to-all, all-gathers and all-reduces whose
  results each rank slices (uneven blocks padded for the gather and cut back).
  All-reduces and reduce-scatters are posted asynchronously (``async_op=True``, a
  :class:`Pending` value) and waited for where an op first reads them, as DDP
  overlaps a gradient's all-reduce with the rest of the backward pass; the step waits
  at its end for every one still in flight, read or not (as for its sends). On a CPU
  whose cores the ranks' computing fills (``ir.calibration.comm_mode``: ``2 n >
  cores``) they are waited for at once instead (``overlap=None`` decides so;
  ``True``/``False`` force it): gloo works on its own threads, and a thread woken
  while every core computes waits for a scheduler slice (about 4 ms here,
  ``benchmarks/bench_gloo_wakeup.py``), where a rank that waits frees its core at once.

With ``steps > 1`` the program runs that many times on its ranks; ``carry`` says
which outputs are the next step's inputs (a training step's new weights and
optimizer state): they stay on their ranks between steps, as in a training loop.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_module
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..function import Function
from ..loopback import Rendezvous, join_world
from ..verify import describe_op
from .torch_dist import BackendError, RankTimeoutError
from .workers import (
    Cursor,
    Progress,
    WorkerExitError,
    die_with_parent,
    exited_before,
    next_message,
    single_threaded_blas,
    start_all,
    stop,
)

COMMUNICATING = frozenset({"SendTo", "RecvFrom", "RankCollective"})
"""The ranked ops that wait for peers (a rank in one is blocked, not stalled)."""

__all__ = [
    "Pending",
    "RankContext",
    "carry_of",
    "launch",
    "prepare",
    "resolve",
    "run_op",
    "run_ranked",
]


@dataclass(frozen=True)
class RankContext:
    """What one worker runs its ops with: its rank, every rank's position in the
    torch.distributed world, the process group of each collective group, (imported once,
    not per op) ``torch.distributed`` and the torch kernels, and the ``torch.device`` its
    values live on (``None``: the CPU)."""

    me: int
    rank_of: Mapping[int, int]
    groups: Mapping[tuple[int, ...], Any]
    dist: Any
    kernels: Mapping[str, Any]
    device: Any = None
    overlap: bool = True  # post all-reduces and reduce-scatters asynchronously

    def synchronize(self) -> None:
        """Wait for the kernels this rank has queued (CUDA runs them asynchronously; on
        the CPU they have finished when they return)."""
        if self.device is not None:
            import torch

            torch.cuda.synchronize(self.device)


class Pending:
    """A collective in flight: its gloo ``work``, the buffer it fills (``value``) and what
    to do with the buffer once it is done (``finish``: a mean's division, a rank's slice)."""

    __slots__ = ("finish", "value", "work")

    def __init__(self, work: Any, value: Any, finish: Any = None) -> None:
        self.work, self.value, self.finish = work, value, finish

    def result(self) -> Any:
        self.work.wait()
        return self.value if self.finish is None else self.finish(self.value)


def resolve(x: Any) -> Any:
    """``x``, or the finished result of ``x`` if it is a :class:`Pending` collective."""
    return x.result() if isinstance(x, Pending) else x


def carry_of(source: Function) -> dict[int, str]:
    """``{output index: input name}`` for a step built from ``source`` (a sequential
    training program): each optimizer's new weight or state is the next step's input of
    that name (the transforms keep the source's input names and output order)."""
    from ..transforms._emit import carried_inputs

    return {source.outputs.index(out): v.name for out, v in carried_inputs(source).items()}


def _carry_pairs(ranked, carry: Mapping[int, str]) -> dict[int, list[tuple[int, int]]]:
    """Per rank, (output position, input position) pairs that carry state to the next step."""
    by_name: dict[str, list] = {}
    for b in ranked.inputs:
        by_name.setdefault(b.name, []).append(b)
    pairs: dict[int, list[tuple[int, int]]] = {r: [] for r in ranked.ranks}
    for index, name in carry.items():
        if not 0 <= index < len(ranked.outputs):
            raise BackendError(f"carry: output {index} does not exist ({len(ranked.outputs)})")
        found = by_name.get(name, [])
        if len(found) != 1:
            raise BackendError(
                f"carry: output {index} updates input {name!r}, which has "
                f"{'no' if not found else 'several'} rank bindings"
            )
        out, inp = ranked.outputs[index], found[0]
        outs = list(out.elements) or sorted(out.positions.items())
        ins = list(inp.elements) or sorted(inp.positions.items())
        if [r for r, _ in outs] != [r for r, _ in ins] or out.layout != inp.layout:
            raise BackendError(
                f"carry: output {index} ({out.name!r}) lives on ranks {[r for r, _ in outs]} "
                f"but input {name!r} on ranks {[r for r, _ in ins]}: the state is not resident "
                "(use a steady-state step, resident=True)"
            )
        for (r, o), (_, i) in zip(outs, ins):
            pairs[r].append((o, i))
    return pairs


def _groups(ranked) -> list[tuple[int, ...]]:
    """Every RankCollective group of every rank, sorted, each once, in one fixed order."""
    seen: dict[tuple[int, ...], None] = {}
    for r in ranked.ranks:
        for op in ranked.programs[r].ops:
            if op.op_type == "RankCollective":
                seen[tuple(sorted(op.attributes["group"]))] = None
    return sorted(seen)


def run_ranked(
    ranked,
    inputs: Sequence[Any] | Mapping[str, Any],
    *,
    steps: int = 1,
    carry: Mapping[int, str] | None = None,
    timeout_s: float = 120.0,
    device: str = "cpu",
    overlap: bool | None = None,
) -> tuple:
    """Run ``ranked`` (a :class:`ir.sharding.RankedProgram`) on one process per rank; return
    the global outputs of the last step (merged as ``ir.sharding.run_ranked`` merges them).

    ``steps``: how many steps in a row; ``carry`` (``{output index: input name}``, see
    :func:`carry_of`) feeds each step's outputs to the next step's inputs on their ranks.
    ``device``: ``"cpu"`` (gloo) or ``"cuda"`` (each rank on its own GPU, NCCL; see
    ``ir.backends.torch_devices``); the outputs come back as numpy arrays either way.
    ``overlap``: whether all-reduces and reduce-scatters overlap compute (None: where
    the machine has the cores for it; module doc).
    """
    from ..sharding.ranked import global_outputs

    _check_steps(steps)
    if steps > 1 and not carry:
        raise BackendError("steps > 1 needs carry={output index: input name} (see carry_of)")
    args, pairs, plan = prepare(ranked, inputs, steps, carry, device, overlap)
    outs = launch(ranked, args, pairs, plan, timeout_s)
    return global_outputs(ranked, outs)


def _check_steps(steps: Any) -> None:
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise BackendError(f"steps must be a positive integer, got {steps!r}")


def prepare(
    ranked,
    inputs,
    steps: int,
    carry: Mapping[int, str] | None,
    device: str = "cpu",
    overlap: bool | None = None,
) -> tuple:
    """Check ``ranked``, ``steps`` and ``device`` and split ``inputs``: (each rank's
    arguments, each rank's carry pairs, the plan every worker reads)."""
    from ..sharding.ranked import rank_arguments
    from .torch_devices import check_device
    from .torch_kernels import check_kernels

    _check_steps(steps)
    check_device(device, len(ranked.ranks))
    for i, program in enumerate(ranked.unique):
        check_kernels(program.ops, f"rank class {i} ({program.name})")
    pairs = _carry_pairs(ranked, carry or {})
    args = rank_arguments(ranked, inputs)
    plan = {
        "ranks": list(ranked.ranks),
        "groups": _groups(ranked),
        "steps": steps,
        "parent": os.getpid(),
        "device": device,
        "overlap": _overlap(overlap, device, len(ranked.ranks)),
    }
    return args, pairs, plan


def _overlap(overlap: bool | None, device: str, ranks: int) -> bool:
    """Whether collectives overlap compute: as asked, else on GPUs and where the CPU has a
    core to spare for each rank's communication (module doc)."""
    if overlap is not None:
        if not isinstance(overlap, bool):
            raise BackendError(f"overlap must be True, False or None (auto), got {overlap!r}")
        return overlap
    from ..calibration import comm_mode

    return device != "cpu" or comm_mode(ranks) == "channels"


def launch(ranked, args, pairs, plan, timeout_s: float) -> dict[int, list]:
    """One worker process per rank (module doc); {rank: what it sent back}. A failure or
    a timeout kills them all and raises, naming the rank (a timeout: the rank that
    stopped making progress, :class:`~ir.backends.torch_dist.RankTimeoutError`)."""
    ctx = mp.get_context("fork")
    outbox = ctx.Queue()
    ranks = plan["ranks"]
    progress = Progress(ctx, len(ranks))
    with Rendezvous(len(ranks), timeout_s) as world:
        plan = {**plan, "world": world.address, "progress": progress}
        procs = []
        for r in ranks:
            # each process gets its class's program, its parameters and its arguments only
            work = (
                ranked.unique[ranked.dedup[r]],
                dict(ranked.parameters.get(r, {})),
                args[r],
                pairs[r],
            )
            procs.append(ctx.Process(target=_worker, args=(r, work, plan, outbox), daemon=True))
        start_all(procs, world)
        return _gather(ranked, procs, outbox, progress, timeout_s)


def _gather(ranked, procs: list, outbox, progress: Progress, timeout_s: float) -> dict:
    """What each worker of :func:`launch` sends back, or the error naming who failed."""
    ranks = list(ranked.ranks)
    results: dict[int, list] = {}
    deadline = time.monotonic() + timeout_s
    heard = set()  # positions in procs
    try:
        for _ in procs:
            r, outs, error = next_message(outbox, procs, deadline, skip=heard)
            heard.add(ranks.index(r))
            if error is not None:
                # a peer that died makes the others fail ("Connection reset by peer"):
                # name the cause first
                dead = exited_before(procs, skip=heard)
                if dead is not None:
                    then = f"; then rank {r} failed: {error[1]}"
                    raise _died(ranks[dead.index], dead.how, then)
                raise _failed(r, *error)
            results[r] = outs
    except WorkerExitError as e:
        raise _died(ranks[e.index], e.how) from None
    except queue_module.Empty:
        waiting = [i for i, r in enumerate(ranks) if r not in results]
        names = [f"rank {r}" for r in ranks]

        def describe(i: int, index: int) -> str:
            return describe_op(ranked.programs[ranks[i]].ops[index])

        stuck, said = progress.stalled(waiting, names, describe)
        index = progress.index(stuck)
        raise RankTimeoutError(
            f"ranked torch.distributed run got no result within {timeout_s} s: {said}",
            device=ranks[stuck],
            rank=ranks[stuck],
            op=describe(stuck, index) if index >= 0 else None,
        ) from None
    finally:
        stop(procs, results)
    return results


def _died(rank: int, how: str, then: str = "") -> BackendError:
    return BackendError(
        f"rank {rank} {how}{then} (the other ranks were stopped)", device=rank, rank=rank
    )


def _failed(rank: int, where: str | None, error: str, worker_traceback: str) -> BackendError:
    at = "outside its ops (setting up or sending results)" if where is None else f"at `{where}`"
    return BackendError(
        f"rank {rank} failed {at}\n  {error}\n  (the worker's traceback: "
        "BackendError.worker_traceback)",
        device=rank,
        rank=rank,
        op=where,
        worker_traceback=worker_traceback,
    )


def _worker(rank: int, work: tuple, plan: dict, outbox) -> None:
    """One rank: join the world (gloo, or NCCL on its GPU), run its program ``steps`` times,
    send back its outputs as numpy arrays."""
    program, parameters, args, pairs = work
    ranks = plan["ranks"]
    state = Cursor(plan.get("progress"), ranks.index(rank))
    try:
        die_with_parent(plan["parent"])
        import torch
        import torch.distributed as dist

        from ..sharding.rank_classes import instantiate
        from .torch_devices import to_numpy, to_torch, worker_device

        torch.set_num_threads(1)
        single_threaded_blas()
        rank_of = {r: i for i, r in enumerate(ranks)}
        device = worker_device(plan.get("device", "cpu"), rank_of[rank])
        on_gpu = {} if device is None else {"device_id": device}
        backend = "gloo" if device is None else "nccl"
        join_world(plan["world"], rank_of[rank], len(ranks), backend=backend, **on_gpu)
        barrier = {} if device is None else {"device_ids": [device.index]}
        groups = {g: dist.new_group([rank_of[d] for d in g]) for g in plan["groups"]}
        from .torch_kernels import TORCH_KERNELS

        context = RankContext(
            rank, rank_of, groups, dist, TORCH_KERNELS, device, plan.get("overlap", True)
        )
        program = instantiate(program, parameters)
        values = [to_torch(a, device) for a in args]
        records = []
        for _ in range(plan["steps"]):
            if plan.get("measure"):
                from .ranked_measure import timed_step

                dist.barrier(**barrier)  # every rank starts the step together (one clock)
                outs, record = timed_step(program, values, context, state)
                records.append(record)
            else:
                outs = _step(program, values, context, state)
            for o, i in pairs:
                values[i] = outs[o]
        state.done()
        result = [to_numpy(o) for o in outs]
        if plan.get("measure"):
            result = (records, result)
        dist.barrier(**barrier)
        outbox.put((rank, result, None))
        dist.destroy_process_group()
    except Exception as e:  # said to the parent as text: an exception may not pickle
        op = state.op
        where = describe_op(op) if op is not None else None
        outbox.put((rank, None, (where, f"{type(e).__name__}: {e}", traceback.format_exc())))


def _step(program: Function, args: list, context: RankContext, state: Cursor) -> list:
    env = dict(zip(program.inputs, args))
    sends: list = []
    for index, op in enumerate(program.ops):
        communicating = op.op_type in COMMUNICATING
        state.at(index, op, communicating)
        xs = []
        for v in op.inputs:
            x = env[v]
            if isinstance(x, Pending):  # first read of a collective in flight: wait for it
                state.at(index, op, True)
                x = env[v] = x.result()
                state.at(index, op, communicating)
            xs.append(x)
        results = run_op(op, xs, context, sends)
        if results and isinstance(results[0], Pending):
            sends.append(results[0].work)  # waited for at the step's end, read or not
        env.update(zip(op.outputs, results))
    for work in sends:  # a collective nothing reads is still done (or failed) by then
        work.wait()
    return [resolve(env[v]) for v in program.outputs]


def run_op(op, xs: list, context: RankContext, sends: list) -> list:
    """One op of ``context.me``'s program on torch values: a ``SendTo`` posts an ``isend``
    and appends its work to ``sends`` (the caller waits for it), a ``RecvFrom`` waits for
    its message, a ``RankCollective`` runs on its group; any other op is its torch kernel.
    Returns the op's results in the dtypes of its output types; an all-reduce or a
    reduce-scatter returns a :class:`Pending` (``xs`` must hold none)."""
    dist, rank_of = context.dist, context.rank_of
    a = op.attributes
    if op.op_type == "SendTo":
        x = xs[0].contiguous()
        sends.append(dist.isend(x, rank_of[a["peer"]], tag=a["tag"]))
        results = [x]
    elif op.op_type == "RecvFrom":
        import torch

        dtype = _torch_dtype(op.outputs[0].type.dtype)
        buf = torch.empty(tuple(a["shape"]), dtype=dtype, device=context.device)
        dist.irecv(buf, rank_of[a["peer"]], tag=a["tag"]).wait()
        results = [buf]
    elif op.op_type == "RankCollective":
        result = _collective(xs[0], op, context.me, rank_of, context.groups)
        results = [result if context.overlap else resolve(result)]
    else:
        results = context.kernels[op.op_type](xs, a)
        if not op.inputs:  # an op of no operand (Arange) makes its result on the rank's device
            results = [y.to(context.device) for y in results]
    out = []
    for v, y in zip(op.outputs, results):
        if isinstance(y, Pending):  # the collective keeps its operand's dtype
            out.append(y)
            continue
        if not isinstance(y, tuple) and y.dtype != _torch_dtype(v.type.dtype):
            y = y.to(_torch_dtype(v.type.dtype))  # python floats in a formula promote
        out.append(y)
    return out


def _torch_dtype(dtype):
    import torch

    return getattr(torch, np.dtype(dtype.numpy).name)


def _collective(x, op, me: int, rank_of, groups):
    """This rank's part of a collective over ``op``'s group (module doc)."""
    import torch
    import torch.distributed as dist

    from ..ops.communication import split_sizes

    a = op.attributes
    group = [int(r) for r in a["group"]]
    pg = groups[tuple(sorted(group))]
    pos = group.index(me)
    kind, k = a["kind"], len(group)
    x = x.contiguous()
    if kind in ("allreduce", "reducescatter"):
        how = a["op"]
        ops = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM}
        ops.update(max=dist.ReduceOp.MAX, min=dist.ReduceOp.MIN)
        y = x.clone()
        work = dist.all_reduce(y, op=ops[how], group=pg, async_op=True)
        if kind == "allreduce":
            return Pending(work, y, (lambda y: _mean(y, k)) if how == "mean" else None)
        dim = a["dim"] % y.dim()
        sizes = split_sizes(y.shape[dim], k)
        start = sum(sizes[:pos])

        def mine(y):
            part = y.narrow(dim, start, sizes[pos]).clone()
            return _mean(part, k) if how == "mean" else part

        return Pending(work, y, mine)
    dim = a["dim"] % x.dim()
    parts = _all_gather(x, dim, group, pg)
    if kind == "allgather":
        return torch.cat(parts, dim=dim)
    # alltoall: from every member, the chunk of its split_dim that is this rank's
    sizes = split_sizes(x.shape[dim], k)
    start = sum(sizes[:pos])
    chunks = [p.narrow(dim, start, sizes[pos]) for p in parts]
    return torch.cat(chunks, dim=a["concat_dim"] % x.dim())


def _mean(total, k: int):
    """``total / k`` in place, in ``total``'s dtype (integers: rounded toward zero, as the
    result's declared integer type holds it)."""
    if total.is_floating_point() or total.is_complex():
        return total.div_(k)
    return total.div_(k, rounding_mode="trunc")


def _all_gather(x, dim: int, group: list[int], pg) -> list:
    """Every member's ``x`` in ``group`` order; uneven sizes along ``dim`` padded and cut."""
    import torch
    import torch.distributed as dist

    order = sorted(group)  # a process group's ranks are in ascending order
    size = torch.tensor([x.shape[dim]], dtype=torch.int64, device=x.device)
    sizes = [torch.zeros_like(size) for _ in group]
    dist.all_gather(sizes, size, group=pg)
    biggest = int(max(s.item() for s in sizes))
    padded = x
    if x.shape[dim] < biggest:
        pad_shape = list(x.shape)
        pad_shape[dim] = biggest - x.shape[dim]
        padded = torch.cat([x, torch.zeros(pad_shape, dtype=x.dtype, device=x.device)], dim=dim)
    out = [torch.empty_like(padded) for _ in group]
    dist.all_gather(out, padded.contiguous(), group=pg)
    by_rank = {r: o.narrow(dim, 0, int(s.item())) for r, o, s in zip(order, out, sizes)}
    return [by_rank[r] for r in group]
