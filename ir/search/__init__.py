"""Strategy search: every 3D arrangement of a training step on a topology, simulated, with
the Pareto front of step time and peak memory.

>>> import ir
>>> f = ir.models.mlp(64, 32, 32, 8, layers=4)
>>> result = ir.search.search(f, ir.Topology.preset("a100-hgx", 4), progress=False)
>>> best = result.best()
>>> best.strategy.devices, best.status
(4, 'ok')
>>> all(a.step_time_s <= b.step_time_s for a, b in zip(result.pareto(), result.pareto()[1:]))
True

The space (``dp``, ``tp``, ``pp``, ``microbatches``, ``schedules``, ``chunks``,
``zero`` (0 to 3), ``sequence_parallel``, ``recompute``, and the expert and context
degrees ``ep`` and ``cp``) is enumerated by
:func:`ir.search.space.strategies`, pruned without building anything
(:func:`ir.search.space.prune`: the batch does not divide, ``ep`` does not divide the
experts or ``2 cp`` the sequence, the state alone does not fit, the tensor degree would
repeat work on every rank, another point is at least as good by construction), and
every survivor is built by ``T.megatron`` and simulated (rank classes walked once:
``ir.simulate``). A strategy the transform refuses is a row with its error, not a
failed search, and a step leaving a device idle is never "ok"; a request nothing can
satisfy (degrees beyond the devices, a batch smaller than dp, tensor
parallelism on a model it cannot split) is a :class:`SearchError` naming the constraint;
a search interrupted (Ctrl-C, the kernel's interrupt) returns the rows made so far, the
others ``"cancelled"``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

from ..device import Topology
from ..errors import DistIRError
from ..function import Function
from ..registry import ops_cost
from ..transforms._rewrite import batch_inputs, batch_size, is_optimizer
from ..types import compute_dtype
from .result import STATUSES, Row, SearchResult
from .space import ModelFacts, SearchError, Strategy, prune, strategies


def search(
    model: Function,
    topology: Topology,
    batch: int | None = None,
    *,
    optimizer: str | None = "adam",
    dp: Iterable[int] | int | None = None,
    tp: Iterable[int] | int | None = None,
    pp: Iterable[int] | int | None = None,
    microbatches: Iterable[int] | int | None = None,
    schedules: Iterable[str] | str = ("1f1b",),
    chunks: Iterable[int] | int = (1,),
    zero: Iterable[int] | int = (0,),
    sequence_parallel: Iterable[bool] | bool = (False,),
    recompute: Iterable[bool] | bool = (False,),
    ep: Iterable[int] | int = (1,),
    cp: Iterable[int] | int = (1,),
    progress: bool = True,
    executor: Any = None,
) -> SearchResult:
    """Simulate every strategy of the space for ``model`` on all of ``topology``'s devices.

    ``model``: a forward program (trained with ``optimizer``; ``None`` searches it as
    it is, as the workbench's ready transforms run it) or a training step.
    ``batch``: the global batch, which must be the model's (build the model with the
    batch you want; a mismatch is an error rather than a silent resize).
    The other keywords narrow or widen the space (see :func:`strategies`).
    ``executor``: where the strategies are built and simulated: ``None`` here, one after
    another; or anything with ``submit(fn, *args)`` returning futures with
    ``result()``: a ``concurrent.futures.ProcessPoolExecutor``, or a
    ``dask.distributed.Client`` when the work outgrows one machine (programs and
    topologies pickle). The rows are the same either way, in the space's order.
    Returns a :class:`SearchResult` (``.rows``, ``.pareto()``, ``.best()``, CSV).

    Interrupted (KeyboardInterrupt), it returns what it has: the rows simulated so far,
    the pruned ones, and the others with status ``"cancelled"`` (an executor's pending
    work is cancelled).
    """
    from tqdm.auto import tqdm

    from .. import transforms

    if not isinstance(model, Function):
        raise SearchError(f"model must be an ir.Function, got {type(model).__name__}")
    if not isinstance(topology, Topology):
        raise SearchError(f"topology must be an ir.Topology, got {type(topology).__name__}")
    trained = optimizer is None or any(is_optimizer(op) for op in model.ops)
    t = model if trained else transforms.training(model, optimizer)
    rows_of_batch = _batch(t)
    if batch is not None and batch != rows_of_batch:
        raise SearchError(
            f"batch={batch} but {model.name} is built for a batch of {rows_of_batch}; build "
            f"the model with the batch to search"
        )
    space = strategies(
        len(topology.devices),
        rows_of_batch,
        dp=dp,
        tp=tp,
        pp=pp,
        microbatches=microbatches,
        schedules=schedules,
        chunks=chunks,
        zero=zero,
        sequence_parallel=sequence_parallel,
        recompute=recompute,
        ep=ep,
        cp=cp,
    )
    _check_request(len(topology.devices), rows_of_batch, t, space, dp=dp, tp=tp, pp=pp)
    capacity = min(d.memory_bytes for d in topology.devices)
    pruned = prune(space, ModelFacts.of(t, rows_of_batch), capacity, _tensor_problems(t, space))
    model_flops, dtype = _flops(t)
    peak = topology.devices[0].peak_flops_for(dtype, True, allow_tf32=topology.allow_tf32)
    tokens = _tokens_per_sample(t)
    rows: dict[Strategy, Row] = {s: Row(s, "pruned", error=why) for s, why in pruned.items()}
    todo = [s for s in space if s not in pruned]
    args = (t, topology, rows_of_batch, tokens, model_flops, peak)
    if executor is not None and not callable(getattr(executor, "submit", None)):
        raise SearchError(
            "executor must have submit(fn, *args) (a concurrent.futures executor or "
            f"a dask.distributed Client), got {type(executor).__name__}"
        )
    bar = tqdm(total=len(todo), desc="simulating strategies", disable=not progress)
    with bar:
        if executor is None:
            try:
                for s in todo:
                    rows[s] = _simulate(s, *args)
                    bar.update()
            except KeyboardInterrupt:
                pass  # the rows so far; the rest are cancelled below
        else:
            futures: list[tuple[Strategy, Any]] = []
            try:
                for s in todo:
                    futures.append((s, executor.submit(_simulate, s, *args)))
                for s, future in futures:
                    rows[s] = future.result()
                    bar.update()
            except KeyboardInterrupt:
                for s, future in futures:
                    if s not in rows:
                        _keep_if_done(rows, s, future)
    cancelled = "the search was interrupted before this strategy was simulated"
    return SearchResult([rows.get(s) or Row(s, "cancelled", error=cancelled) for s in space])


def _keep_if_done(rows: dict[Strategy, Row], s: Strategy, future: Any) -> None:
    """After an interrupt: keep a finished future's row, cancel an unfinished one."""
    if not future.done():
        future.cancel()
        return
    with contextlib.suppress(Exception, KeyboardInterrupt):  # its worker interrupted, or lost
        rows[s] = future.result()  # finished: no wait


def _check_request(
    devices: int,
    batch: int,
    t: Function,
    space: list[Strategy],
    *,
    dp: Iterable[int] | int | None,
    tp: Iterable[int] | int | None,
    pp: Iterable[int] | int | None,
) -> None:
    """Refuse, naming the constraint, a request that no strategy could satisfy."""
    asked = {name: _listed(given) for name, given in (("dp", dp), ("tp", tp), ("pp", pp))}
    for name, degrees in asked.items():
        over = [d for d in degrees or () if d > devices]
        if over:
            raise SearchError(
                f"{name}={over[0]} needs at least {over[0]} devices; the topology has "
                f"{devices} (a search runs on all of them: dp x cp x tp x pp = {devices})"
            )
    if not space:
        shown = ", ".join(f"{n}={list(d)}" for n, d in asked.items() if d is not None)
        raise SearchError(
            f"no dp x cp x tp x pp of the degrees asked ({shown}) uses exactly the topology's "
            f"{devices} devices, as a search does"
        )
    big = [d for d in asked["dp"] or () if d > batch]
    if big:
        raise SearchError(
            f"the batch of {batch} is smaller than dp={big[0]}: every data-parallel replica "
            "needs at least one sample; ask for smaller dp or build the model with a larger "
            "batch"
        )
    if asked["tp"] and min(asked["tp"]) > 1:
        from ..transforms.megatron import tensor_split_problem

        problems = [tensor_split_problem(t, k) for k in sorted(set(asked["tp"]))]
        if all(problems):
            raise SearchError(
                f"tensor parallelism cannot split {t.name}: {problems[0]}; search with tp=1"
            )


def _tensor_problems(t: Function, space: list[Strategy]) -> dict[int, str | None]:
    """For each tensor-parallel degree of the space, why it would repeat work on every
    tensor rank (beyond the attention heads, say), or None: analysed once per degree,
    so the builds need not check again."""
    from ..transforms.megatron import tensor_replication_problem

    problems = {k: tensor_replication_problem(t, k) for k in sorted({s.tp for s in space}) if k > 1}
    return {k: why.splitlines()[0] if why else None for k, why in problems.items()}


def _listed(given: Iterable[int] | int | None) -> list[int] | None:
    if given is None:
        return None
    return [given] if isinstance(given, int) else list(given)


def _simulate(
    s: Strategy,
    t: Function,
    topology: Topology,
    batch: int,
    tokens: int,
    model_flops: float,
    peak_flops: float,
) -> Row:
    from .. import simulate

    try:
        # tensor degrees that would repeat work were pruned (_tensor_problems): no recheck
        g = s.build(t, topology, allow_replication=True)
        r = simulate(g, topology)
    except DistIRError as e:
        return Row(s, "error", error=str(e).splitlines()[0])
    except Exception as e:  # a bug, not the strategy's fault: reported, not fatal
        why = (str(e).splitlines() or [""])[0]
        return Row(s, "error", error=f"internal error ({type(e).__name__}): {why}")
    idle = sorted(set(range(s.devices)) - {d for d in r.devices if r.busy_s[d] > 0})
    if idle:  # the transforms refuse such cuts; a row must never call one "ok"
        why = f"device(s) {idle} of the {s.devices} compute nothing in the step"
        return Row(s, "error", error=why)
    step = r.step_time_s
    devices = r.devices
    peak = max(r.peak_memory_bytes.values())
    exposed = sum(step - r.busy_s[d] - r.idle_s[d] for d in devices) / len(devices)
    bubble = sum(r.idle_s[d] for d in devices) / len(devices) / step if step else 0.0
    status = "over capacity" if r.over_capacity else "ok"
    return Row(
        s,
        status,
        step_time_s=step,
        samples_per_s=batch / step if step else float("inf"),
        tokens_per_s=batch * tokens / step if step else float("inf"),
        mfu=model_flops / (step * s.devices * peak_flops) if step else 0.0,
        peak_memory_bytes=peak,
        exposed_comm_s=exposed,
        bubble=bubble,
    )


def _batch(t: Function) -> int:
    inputs = batch_inputs(t)
    if not inputs:
        raise SearchError(f"{t.name} has no batch input to split over replicas")
    try:
        return batch_size(t, inputs)
    except DistIRError as e:
        raise SearchError(str(e)) from None


def _tokens_per_sample(t: Function) -> int:
    """Tokens per sample: the sequence length of an integer (token id) batch input of
    rank 2, else 1."""
    for v in batch_inputs(t):
        if not v.type.dtype.is_float and v.type.rank == 2:
            return v.type.shape[1]
    return 1


def _flops(t: Function) -> tuple[float, object]:
    """The FLOPs of one sequential step (its cost rules) and the dtype it computes in."""
    return ops_cost(t.ops).flops, compute_dtype(v.type for v in t.inputs)


__all__ = [
    "STATUSES",
    "Row",
    "SearchError",
    "SearchResult",
    "Strategy",
    "search",
    "strategies",
]
