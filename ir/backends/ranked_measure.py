"""Measuring ranked programs: every op of every rank's own program timed on real processes.

:func:`measure_ranked` runs ``warmup + steps`` steps of a
:class:`ir.sharding.RankedProgram` the way :func:`ir.backends.torch_dist.run_ranked`
does (one process per rank, its rank class's program, torch kernels), and with
``carry`` each step takes the previous step's outputs on their ranks: the steps
timed are a training loop's steady state, not reruns of the first step. Each
rank times its ops (:func:`timed_step`):

* a step starts with a barrier of all ranks; on one host every process reads one
  monotonic clock, so a step's times are relative to the first rank's start (its
  barrier exit and the measurement's own set-up of the step's bookkeeping);
* a compute op runs from its call to its return (torch on the CPU is synchronous); on
  CUDA (``device="cuda"``) the rank waits for its GPU before the start stamp and again
  before the end stamp, so an op's time is its kernels' GPU time plus their launch;
  a ``RecvFrom`` until its message has arrived, an all-gather or all-to-all
  ``RankCollective`` until it has completed here (both include waiting for peers, as
  the global measure's do);
* a ``SendTo``, an all-reduce and a reduce-scatter are asynchronous (the rank goes on
  computing, as in ``run_ranked``): the event runs from its posting to the first op
  boundary at which it is seen complete, to the moment an op that reads it has waited
  for it, or to the end of the step, where the rank waits for it. On CUDA the wait for
  the GPU around each timed op (``torch.cuda.synchronize``) waits for every stream of
  the device, NCCL's included: there a measured step overlaps no collective with
  compute (an unmeasured ``run_ranked`` does);
* tuple ops (``MakeTuple``, ``TupleGet``) are not timed (they move no data).

Each rank also tracks its live bytes (:meth:`Measurement.memory_timeline` says
what they are): one point at each op's start with its outputs allocated, one at
its end with the values it read for the last time freed.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..function import Function
from ..registry import OpKind, get_op
from .measurement import Measurement
from .torch_dist import BackendError

__all__ = ["measure_ranked", "timed_step"]


def measure_ranked(
    ranked,
    inputs: Sequence[Any] | Mapping[str, Any],
    *,
    steps: int = 5,
    warmup: int = 2,
    carry: Mapping[int, str] | None = None,
    timeout_s: float = 300.0,
    device: str = "cpu",
    overlap: bool | None = None,
) -> Measurement:
    """Time ``warmup + steps`` steps of ``ranked`` on one process per rank; return the
    :class:`~ir.backends.measurement.Measurement` of the ``steps`` after the warm-up (its
    ``programs`` are the rank programs as they ran, its memory curves the ranks' live bytes,
    its ``outputs`` the global outputs of the last step).

    ``carry`` (``{output index: input name}``, see
    :func:`ir.backends.torch_ranked.carry_of`) feeds each step's outputs to the next
    step's inputs on their ranks; without it every step reruns ``inputs``. ``device``:
    ``"cpu"`` (gloo) or ``"cuda"`` (each rank on its own GPU, NCCL;
    ``ir.backends.torch_devices``).

    >>> import ir
    >>> from ir.sharding import lower_to_ranks
    >>> measure_ranked(lower_to_ranks(ir.models.mlp(4, 3, 5, 2)), {}, steps=0)
    Traceback (most recent call last):
    ...
    ir.backends.torch_dist.BackendError: measure needs steps >= 1 and warmup >= 0, got 0, 2
    """
    from ..sharding.ranked import global_outputs
    from .torch_ranked import launch, prepare

    for value, least in ((steps, 1), (warmup, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise BackendError(
                f"measure needs steps >= 1 and warmup >= 0, got {steps!r}, {warmup!r}"
            )
    _check_lowered(ranked)
    args, pairs, plan = prepare(ranked, inputs, warmup + steps, carry, device, overlap)
    plan["measure"] = True
    results = launch(ranked, args, pairs, plan, timeout_s)
    programs = {r: ranked.program_for(r) for r in ranked.ranks}
    records = {r: record[warmup:] for r, (record, _) in results.items()}
    outputs = global_outputs(ranked, {r: outs for r, (_, outs) in results.items()})
    return replace(Measurement.from_rank_records(programs, records), outputs=outputs)


def _check_lowered(ranked) -> None:
    from ..sharding.lower import RankedProgram

    if not isinstance(ranked, RankedProgram):
        raise BackendError(
            "measure_ranked takes what ir.sharding.lower_to_ranks returns, got "
            f"{type(ranked).__name__}; for a global program use torch_dist.measure"
        )


class _Live:
    """The bytes of distinct tensor storages that a rank's values hold, kept as they change."""

    def __init__(self) -> None:
        self.bytes = 0
        self.count: dict[int, int] = {}

    def _storages(self, x: Any) -> list[tuple[int, int]]:
        if isinstance(x, tuple | list):
            return [s for e in x for s in self._storages(e)]
        x = getattr(x, "value", x)  # a collective in flight holds its buffer
        storage = getattr(x, "untyped_storage", None)
        if storage is None:
            return []
        s = storage()
        return [(s.data_ptr(), s.nbytes())]

    def add(self, x: Any) -> None:
        for key, nbytes in self._storages(x):
            if self.count.get(key, 0) == 0:
                self.bytes += nbytes
            self.count[key] = self.count.get(key, 0) + 1

    def drop(self, x: Any) -> None:
        for key, nbytes in self._storages(x):
            self.count[key] -= 1
            if self.count[key] == 0:
                del self.count[key]
                self.bytes -= nbytes


def _last_reads(program: Function) -> dict[int, list]:
    """Op index -> the values it reads for the last time (inputs and outputs stay all step)."""
    pinned = {*program.inputs, *program.outputs}
    last: dict = {}
    for index, op in enumerate(program.ops):
        for v in op.inputs:
            last[v] = index
        for v in op.outputs:
            last.setdefault(v, index)  # a value nothing reads is freed when its op ends
    out: dict[int, list] = {}
    for v, index in last.items():
        if v not in pinned:
            out.setdefault(index, []).append(v)
    return out


def timed_step(program: Function, args: list, context, state) -> tuple:
    """One step of rank ``context.me``'s ``program`` (a
    :class:`~ir.backends.torch_ranked.RankContext`) with every op timed (module doc).

    Returns (outputs, (origin, [(op index, start, end)], [(clock, live bytes)])); on CUDA
    the record ends with the step's ``torch.cuda.max_memory_allocated``.
    """
    from .torch_ranked import COMMUNICATING, Pending, resolve, run_op

    context.synchronize()  # on CUDA: the previous step's kernels end before this one starts
    if context.device is not None:
        import torch

        torch.cuda.reset_peak_memory_stats(context.device)
    env = dict(zip(program.inputs, args))
    live = _Live()
    for x in env.values():
        live.add(x)
    frees = _last_reads(program)
    untimed = [get_op(op.op_type).kind is OpKind.CONTROL for op in program.ops]
    origin = time.perf_counter()  # the bookkeeping above is not the step's work
    memory = [(origin, live.bytes)]
    timed: list[tuple[int, float, float]] = []
    sends: list = []
    # (op index, start, work) of sends and collectives in flight
    pending: list[tuple[int, float, Any]] = []
    for index, op in enumerate(program.ops):
        communicating = op.op_type in COMMUNICATING
        state.at(index, op, communicating)
        xs = []
        for v in op.inputs:
            x = env[v]
            if isinstance(x, Pending):  # the first read of a collective in flight: wait
                state.at(index, op, True)
                x.work.wait()
                state.at(index, op, communicating)
                pending = _finished(pending, timed)
                live.drop(x)
                x = env[v] = x.result()
                live.add(x)
            xs.append(x)
        posted = len(sends)
        context.synchronize()
        start = time.perf_counter()
        results = run_op(op, xs, context, sends)
        context.synchronize()
        end = time.perf_counter()
        if len(sends) > posted:  # a SendTo: timed until it is seen complete
            pending.append((index, start, sends[-1]))
        elif results and isinstance(results[0], Pending):  # likewise a posted collective
            pending.append((index, start, results[0].work))
        elif not untimed[index]:
            timed.append((index, start, end))
        for v, y in zip(op.outputs, results):
            env[v] = y
            live.add(y)
        memory.append((start, live.bytes))
        for v in frees.get(index, ()):
            live.drop(env.pop(v))
        memory.append((end, live.bytes))
        if pending:
            pending = _finished(pending, timed)
    for index, start, work in pending:
        work.wait()
        timed.append((index, start, time.perf_counter()))
    outputs = [resolve(env[v]) for v in program.outputs]
    record = (origin, timed, memory)
    if context.device is not None:
        context.synchronize()
        record += (torch.cuda.max_memory_allocated(context.device),)
    return outputs, record


def _finished(pending: list, timed: list) -> list:
    """Stamp the sends and collectives seen complete now; return those still in flight."""
    now = time.perf_counter()
    left = []
    for index, start, work in pending:
        if work.is_completed():
            timed.append((index, start, now))
        else:
            left.append((index, start, work))
    return left
