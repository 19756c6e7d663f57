"""Measure each distinct op of a program on the torch backend: :func:`profile_ops`.

The result, an :class:`ir.sim.costs.OpCosts`, is what ``ir.simulate(..., costs=table)``
composes instead of its roofline and alpha-beta models. Each op is measured the way
``torch_dist.measure`` measures a program, so that a table and a measurement agree on
what one op costs:

* **compute**: the distinct compute ops (``ir.sim.costs.compute_key``: type, attributes,
  shapes, element types), in program order, are copied into one profiling program, each
  op reading its own random operands (``ir.random_inputs``: labels below the class
  count, and so on), so that an op runs among the others as in the program, not hot
  from a copy of itself; the program runs ``warmup + repeats`` times, each after a
  barrier of the processes, through ``ranked_measure.timed_step`` (the measurement's
  own loop: torch kernels, live-byte bookkeeping, the timers), as a measured step runs;
  an op costs the median over the ``repeats`` runs of the time from its start to the
  next op's (the op and the loop's bookkeeping after it);
* **communication**: every distinct transfer (``(kind, bytes, group size)``) runs
  ``repeats`` times through the ranked backend's own collective code (gloo; all-gathers
  and all-reduces with slicing where gloo lacks the collective), each after a barrier,
  on groups of consecutive ranks that partition the processes (several groups at once,
  as a data-parallel all-reduce runs beside the others), at least ``COMM_REPEATS``
  times; a collective costs the *mean* over repeats (a step pays the long tail of
  waking blocked threads, not the median) of the time from the last rank's call to
  the last rank's return (the simulator's definition: a collective starts when all
  are ready; one host, one clock), a send half the round trip of a ping-pong between
  two ranks.

``processes`` processes run it all at once, one gloo world on loopback: on a machine
with fewer cores than processes, each op is measured sharing the cores as the program's
ranks will share them. Broadcast, scatter, gather and reduce are not measured (the
steady-state programs the transforms build do not use them), nor is a transfer over
more devices than ``processes``: the simulator models those (``OpCosts.missing`` lists
them). An all-reduce or reduce-scatter, which the ranked backend posts asynchronously,
is timed until it is done here (divided or sliced), as a step's first read waits for it.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_module
import statistics
import time
import traceback
from types import SimpleNamespace
from typing import Any

import numpy as np

from ..function import Function
from ..loopback import Rendezvous, join_world
from ..sim.costs import OpCosts, communication_keys, compute_ops, unrolled
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

__all__ = ["profile_ops"]

# A transfer's time on a busy or virtual machine has a long tail (a 16 KB gloo all-reduce
# between two processes here: median 0.45 ms, mean 1 ms, 90th percentile 3-4 ms: waking a
# blocked thread), and a step pays the tail: transfers are timed this many times at least
# and cost their mean
COMM_REPEATS = 30
MEASURED_KINDS = ("allreduce", "allgather", "reducescatter", "alltoall", "send")


def profile_ops(
    program: Function,
    processes: int | None = None,
    *,
    repeats: int = 15,
    warmup: int = 2,
    costs: OpCosts | None = None,
    timeout_s: float = 300.0,
    progress: bool = True,
) -> OpCosts:
    """Measure every distinct op of ``program`` (pmap bodies included) with the torch
    backend on ``processes`` processes at once (default: as many as the program has
    devices); return the table (module doc). ``costs``: a table measured before with the
    same ``processes``; only the ops it lacks are measured, and the result holds both
    (profiling a second strategy of one model measures only its new shapes). Transfers
    over more devices than ``processes`` and the kinds outside ``MEASURED_KINDS`` are left
    out (``OpCosts.missing``); an op without a torch kernel is refused, naming it. A
    worker that fails or dies stops them all, and the error names it.
    """
    from .torch_kernels import check_kernels

    if not isinstance(program, Function):
        raise BackendError(f"profile_ops profiles an ir.Function, got {type(program).__name__}")
    if processes is None:
        processes = max(1, len(program.devices))
    for name, value, least in (("processes", processes, 1), ("repeats", repeats, 2)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise BackendError(f"profile_ops: {name} must be an integer >= {least}, got {value!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise BackendError(f"profile_ops: warmup must be an integer >= 0, got {warmup!r}")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or timeout_s <= 0:
        raise BackendError(f"profile_ops: timeout_s must be a number > 0, got {timeout_s!r}")
    if costs is not None and not isinstance(costs, OpCosts):
        raise BackendError(
            "profile_ops: costs must be an ir.sim.costs.OpCosts (a table profile_ops made), "
            f"got {type(costs).__name__}"
        )
    if costs is not None and costs.processes != processes:
        raise BackendError(
            f"profile_ops: the given costs were measured with {costs.processes} processes at "
            f"once, not {processes}"
        )
    known = costs or OpCosts(processes=processes)
    flat = unrolled(program)
    ops = [(k, op) for k, op in compute_ops(flat) if k not in known.compute]
    check_kernels(
        (op for _, op in ops),
        f"profile_ops, program {program.name!r}",
        "simulate without a profile (ir.simulate costs every op with its models)",
    )
    transfers = [
        t
        for t in communication_keys(flat)
        if t[0] in MEASURED_KINDS and t not in known.communication and t[2] <= processes
    ]
    if not ops and not transfers:  # all known already (or nothing measurable): no processes
        return known
    measured = _measure(ops, transfers, processes, repeats, warmup, timeout_s, progress)
    fresh = OpCosts(
        dict(zip((k for k, _ in ops), measured["compute"])),
        dict(zip(transfers, measured["communication"])),
        processes,
        (
            f"torch backend, {processes} process(es) at once on {os.cpu_count()} CPU(s); "
            f"median of {repeats} after {warmup} warm-up run(s)",
        ),
    )
    return known.updated(fresh)


def _profiling_program(ops: list[tuple[tuple, Any]]) -> Function:
    """The distinct ops in program order, each on its own operands, as one program: an op
    runs among the others, its caches as warm as in the program, not hot from itself."""
    from ..builder import FunctionBuilder

    b = FunctionBuilder("profile")
    outputs: list = []
    for i, (_, op) in enumerate(ops):
        operands = [b.input(f"x{i}_{j}", v.type) for j, v in enumerate(op.inputs)]
        new = b.add_like(op, operands, [f"y{i}_{j}" for j in range(len(op.outputs))])
        outputs += list(new.outputs)
    return b.finish(outputs)


def _measure(ops, transfers, processes, repeats, warmup, timeout_s, progress) -> dict:
    from tqdm.auto import tqdm

    from ..execute import random_inputs

    program = _profiling_program(ops) if ops else None
    args = random_inputs(program, seed=0) if program is not None else []
    plan = {
        "parent": os.getpid(),
        "processes": processes,
        "repeats": repeats,
        "comm_repeats": max(repeats, COMM_REPEATS),
        "warmup": warmup,
        "transfers": transfers,
        "groups": sorted({t[2] for t in transfers}),
    }
    ctx = mp.get_context("fork")
    outbox = ctx.Queue()
    plan["progress"] = where = Progress(ctx, processes)
    total = (warmup + repeats) * (1 if ops else 0) + len(transfers)
    results: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    with (
        Rendezvous(processes, timeout_s) as world,
        tqdm(total=total, desc="profiling ops", disable=not progress) as bar,
    ):
        plan["world"] = world.address
        procs = [
            ctx.Process(target=_worker, args=(r, program, args, plan, outbox), daemon=True)
            for r in range(processes)
        ]
        start_all(procs, world)
        try:
            while len(results) < processes:
                r, kind, payload = next_message(outbox, procs, deadline, skip=results)
                if kind == "tick":
                    bar.update()
                elif kind == "error":
                    # a peer that died makes the others fail ("Connection reset by peer"):
                    # name the cause first
                    dead = exited_before(procs, skip={*results, r})
                    first = "" if dead is None else f"process {dead.index} {dead.how}; then "
                    raise BackendError(f"profiling failed: {first}process {r} said: {payload}")
                else:
                    results[r] = payload
        except WorkerExitError as e:
            raise BackendError(
                f"profiling failed: process {e.index} {e.how} (the other processes were stopped)"
            ) from None
        except queue_module.Empty:
            waiting = [r for r in range(processes) if r not in results]
            names = [f"process {r}" for r in range(processes)]
            stuck, said = where.stalled(waiting, names)
            raise RankTimeoutError(
                f"profile_ops got no result within {timeout_s} s: {said}", rank=stuck
            ) from None
        finally:
            stop(procs, results)
    compute = []
    if ops:
        per_rank = [results[r]["compute"] for r in range(processes)]
        compute = [statistics.mean(ts) for ts in zip(*per_rank)]
    communication = []
    for i in range(len(transfers)):
        samples = [results[r]["communication"][i] for r in range(processes)]
        taken = [s for s in samples if s]  # the ranks of the first group (a send: its sender)
        # from the last rank's arrival to the last rank's completion (one host: one clock)
        runs = [
            max(s[k][1] for s in taken) - max(s[k][0] for s in taken) for k in range(len(taken[0]))
        ]
        communication.append(statistics.mean(runs))
    return {"compute": compute, "communication": communication}


def _worker(rank: int, program, args, plan, outbox) -> None:
    try:
        die_with_parent(plan["parent"])
        import torch
        import torch.distributed as dist

        from .torch_kernels import TORCH_KERNELS
        from .torch_ranked import RankContext

        torch.set_num_threads(1)
        single_threaded_blas()
        n = plan["processes"]
        join_world(plan["world"], rank, n)
        groups = {}
        for size in plan["groups"]:  # every group made on every process, in one order
            for start in range(0, n - size + 1, size):
                g = tuple(range(start, start + size))
                groups[g] = dist.new_group(list(g))
        context = RankContext(rank, {r: r for r in range(n)}, groups, dist, TORCH_KERNELS)
        out = {"compute": [], "communication": []}
        if program is not None:
            out["compute"] = _time_compute(program, args, context, plan, outbox, rank)
        for kind, size_bytes, size in plan["transfers"]:
            out["communication"].append(
                _time_transfer(kind, size_bytes, size, context, plan["comm_repeats"])
            )
            if rank == 0:
                outbox.put((rank, "tick", None))
        dist.barrier()
        outbox.put((rank, "done", out))
        dist.destroy_process_group()
    except Exception as e:  # said to the parent as text: an exception may not pickle
        outbox.put((rank, "error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


def _time_compute(program, args, context, plan, outbox, rank) -> list[float]:
    """Each op's median period over ``repeats`` runs of the one-round ``program``, each run
    after a barrier of all processes, as the measurement runs a step."""
    import torch

    from .ranked_measure import timed_step

    values = [torch.from_numpy(np.array(a, copy=True)) for a in args]
    state = Cursor(plan.get("progress"), rank)
    runs = []
    for step in range(plan["warmup"] + plan["repeats"]):
        context.dist.barrier()
        _, (_, timed, _) = timed_step(program, values, context, state)
        if step >= plan["warmup"]:
            timed = sorted(timed)
            # each op from its start to the next op's start (its bookkeeping included);
            # the last op to its own end
            periods = [timed[i + 1][1] - timed[i][1] for i in range(len(timed) - 1)]
            runs.append([*periods, timed[-1][2] - timed[-1][1]])
        if rank == 0:
            outbox.put((rank, "tick", None))
    return [statistics.median(column) for column in zip(*runs)]


def _time_transfer(kind: str, size_bytes: float, size: int, context, repeats: int) -> list:
    """This rank's ``(start, end)`` clock readings of ``repeats`` runs of one transfer, in
    the first group of its size only (empty elsewhere; a send's: its sender's)."""
    import torch

    from .torch_ranked import _collective, resolve

    dist, me = context.dist, context.me
    groups = [g for g in context.groups if len(g) == size]
    mine = next((g for g in groups if me in g), None)
    timed = groups and me in groups[0]  # the other groups run beside it, untimed
    elements = max(1, round(size_bytes / 4))
    if kind == "allgather":
        elements = max(1, elements // size)
    x = torch.randn(elements)
    buffer = torch.empty_like(x)
    times = []
    for _ in range(repeats + 1):  # the first run warms the connection up
        dist.barrier()
        if mine is None:
            continue
        t0 = time.perf_counter()
        if kind == "send":  # a ping-pong: half the round trip, whatever the barrier's skew
            if me == mine[0]:
                dist.isend(x, mine[1], tag=7).wait()
                dist.irecv(buffer, mine[1], tag=8).wait()
                if timed:
                    times.append((t0, t0 + (time.perf_counter() - t0) / 2))
            else:
                dist.irecv(buffer, mine[0], tag=7).wait()
                dist.isend(buffer, mine[0], tag=8).wait()
            continue
        attrs = {"kind": kind, "group": list(mine), "op": "sum", "dim": 0, "concat_dim": 0}
        # an all-reduce or reduce-scatter is posted asynchronously: its time ends when it is
        # done here (and divided or sliced, as a step's first read of it waits for that)
        resolve(
            _collective(x, SimpleNamespace(attributes=attrs), me, context.rank_of, context.groups)
        )
        if timed:
            times.append((t0, time.perf_counter()))
    return times[1:]
