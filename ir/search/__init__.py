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
:func:`ir.search.space.strategies` (or listed: ``strategies=[Strategy(...), ...]``,
:func:`ir.search.space.listed`), pruned without building anything
(:func:`ir.search.space.prune`: the batch does not divide, ``ep`` does not divide the
experts or ``2 cp`` the sequence, the state alone does not fit, the tensor degree would
repeat work on every rank, another point is at least as good by construction), every
survivor estimated in closed form and those that can reach the front built by
``T.megatron`` and simulated (``ir.search.tiers``; rank classes walked once, pmap bodies
scheduled once: ``ir.simulate``). A strategy the transform refuses is a row with its
error, not a failed search, and a step leaving a device idle is never "ok"; a request
nothing can satisfy (degrees beyond the devices, a batch smaller than dp, tensor
parallelism on a model it cannot split) is a :class:`SearchError` naming the constraint;
a search interrupted (Ctrl-C, the kernel's interrupt) returns the rows made so far, the
others ``"cancelled"``.
"""

from __future__ import annotations

import contextlib
import inspect
import numbers
import os
import pickle
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

from ..device import Topology
from ..errors import DistIRError
from ..function import Function
from ..interrupt import check
from ..registry import ops_cost
from ..transforms._rewrite import batch_inputs, batch_size, is_optimizer
from ..types import compute_dtype
from .estimate import Estimator
from .result import STATUSES, Row, SearchResult
from .space import (
    ModelFacts,
    SearchError,
    SharedPlans,
    Strategy,
    _choices,
    listed,
    prune,
    strategies,
)
from .tiers import MODES, decide


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
    strategies: Iterable[Strategy] | None = None,
    simulate: str = "front",
    progress: bool | Callable[[int, int], None] = True,
    executor: Any = None,
    on_row: Callable[[Row], None] | None = None,
) -> SearchResult:
    """Search the strategies of the space for ``model`` on all of ``topology``'s devices.

    ``model``: a forward program (trained with ``optimizer``; ``None`` searches it as
    it is, as the workbench's ready transforms run it) or a training step.
    ``batch``: the global batch, which must be the model's (build the model with the
    batch you want; a mismatch is an error rather than a silent resize).
    The other keywords narrow or widen the space (see :func:`strategies`); or
    ``strategies`` lists the strategies to search instead (``Strategy`` objects: a grid
    that is no product of knobs, rows kept from an earlier search), each checked as the
    knobs are and then pruned, estimated and simulated as the space's would be.
    ``simulate``: ``"front"`` (two tiers: every strategy estimated in closed form, the
    event simulation on those that can reach the Pareto front; :mod:`ir.search.tiers`),
    ``"fastest"`` (two tiers, simulating only those that could be the fastest strategy
    that fits: ``best()`` is the same, the rest of the front is left estimated) or
    ``"all"`` (every strategy simulated). The front is the same with ``"front"`` and
    ``"all"``.
    ``progress``: a bar (tqdm) of the strategies decided, or a callable given
    ``(decided, total)`` after each (a dashboard's own bar).
    ``executor``: where the strategies are built and simulated: ``None`` here, one after
    another; or anything with ``submit(fn, *args)`` returning futures with
    ``result()``: a ``concurrent.futures.ProcessPoolExecutor``, or a
    ``dask.distributed.Client`` when the work outgrows one machine (programs and
    topologies pickle). Each job is a batch of strategies that share analyses (the same
    batch pieces, stages and tensor degree side by side), built with one set of shared
    plans, a few batches per worker. The rows are the same either way, in the space's
    order.
    ``on_row``: called with each row as it is decided (a dashboard draws the front as it
    grows); :func:`search_rows` yields them instead.
    Returns a :class:`SearchResult` (``.rows``, ``.pareto()``, ``.best()``, CSV).

    Interrupted (KeyboardInterrupt), it returns what it has: the rows decided so far and
    the others with status ``"cancelled"`` (an executor's pending work is cancelled).
    """
    if on_row is not None and not callable(on_row):
        raise SearchError(f"on_row must be a function of a row, got {type(on_row).__name__}")
    request = _request(model, topology, batch, optimizer, dp, tp, pp, microbatches, schedules,
                       chunks, zero, sequence_parallel, recompute, ep, cp,
                       chosen=strategies)  # fmt: skip
    rows: dict[Strategy, Row] = {}
    try:
        for row in _decided(request, simulate, progress, executor):
            rows[row.strategy] = row
            if on_row is not None:
                on_row(row)
    except KeyboardInterrupt:
        pass  # the rows so far; the rest are cancelled below
    cancelled = "the search was interrupted before this strategy was simulated"
    space = request.space
    return SearchResult([rows.get(s) or Row(s, "cancelled", error=cancelled) for s in space])


def search_rows(
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
    strategies: Iterable[Strategy] | None = None,
    simulate: str = "front",
    progress: bool | Callable[[int, int], None] = False,
    executor: Any = None,
) -> Iterator[Row]:
    """:func:`search`'s rows one by one as they are decided (pruned ones first, then the
    estimated and simulated in the order the search takes them), for a view that shows
    the front as it grows. ``SearchResult(list(...))`` of them is what :func:`search`
    returns, but for the order.

    >>> import ir
    >>> f = ir.models.mlp(64, 32, 32, 8, layers=4)
    >>> rows = ir.search.search_rows(f, ir.Topology.preset("a100-hgx", 4), pp=1)
    >>> sorted({row.status for row in rows})
    ['ok']
    """
    request = _request(model, topology, batch, optimizer, dp, tp, pp, microbatches, schedules,
                       chunks, zero, sequence_parallel, recompute, ep, cp,
                       chosen=strategies)  # fmt: skip
    yield from _decided(request, simulate, progress, executor)


class _Request(NamedTuple):
    """A search request: its space and pruned rows, then what each strategy is built and
    simulated with (``args()``: :func:`_simulate`'s arguments after the strategy)."""

    space: list[Strategy]
    pruned: dict[Strategy, str]
    t: Function  # the training step
    topology: Topology
    batch: int
    tokens: int  # per sample
    model_flops: float
    peak_flops: float
    shared: SharedPlans  # the analyses the request's strategies share
    name: str  # a fresh random name: what names it to an executor's workers

    def args(self) -> tuple:
        return (self.t, self.topology, self.batch, self.tokens, self.model_flops,
                self.peak_flops)  # fmt: skip


def _request(
    model: Function,
    topology: Topology,
    batch: int | None,
    optimizer: str | None,
    *space: Any,
    chosen: Iterable[Strategy] | None = None,
) -> _Request:
    """The space asked for and what its strategies are built and simulated with."""
    from .. import transforms

    if not isinstance(model, Function):
        raise SearchError(f"model must be an ir.Function, got {type(model).__name__}")
    if not isinstance(topology, Topology):
        raise SearchError(f"topology must be an ir.Topology, got {type(topology).__name__}")
    trained = optimizer is None or any(is_optimizer(op) for op in model.ops)
    t = model if trained else transforms.training(model, optimizer)
    if batch is not None and (isinstance(batch, bool) or not isinstance(batch, numbers.Integral)):
        raise SearchError(f"batch must be an integer (the model's batch) or None, got {batch!r}")
    rows_of_batch = _batch(t)
    if batch is not None and batch != rows_of_batch:
        raise SearchError(
            f"batch={batch} but {model.name} is built for a batch of {rows_of_batch}; build "
            f"the model with the batch to search"
        )
    dp, tp, pp, microbatches, schedules, chunks, zero, sequence_parallel, recompute, ep, cp = space
    if chosen is not None:
        return _request_listed(t, topology, rows_of_batch, chosen, space)
    strategies_ = strategies(
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
    _check_request(len(topology.devices), rows_of_batch, t, strategies_, dp=dp, tp=tp, pp=pp, cp=cp)
    return _requested(t, topology, rows_of_batch, strategies_)


# the knobs, in _request's order, and their defaults (strategies' own, as search's):
# strategies= takes their place
_KNOBS = {
    name: p.default
    for name, p in inspect.signature(strategies).parameters.items()
    if p.kind is inspect.Parameter.KEYWORD_ONLY
}


def _request_listed(
    t: Function, topology: Topology, batch: int, chosen: Iterable[Strategy], knobs: tuple
) -> _Request:
    """_request for ``search(strategies=[...])``: the listed strategies are the space."""
    for (name, default), given in zip(_KNOBS.items(), knobs, strict=True):
        if given is not None and _choices(name, given, ()) != _choices(name, default, ()):
            raise SearchError(
                f"give either strategies= or the knobs that make a space, not both "
                f"({name}={given!r} with strategies=)"
            )
    space = listed(len(topology.devices), batch, chosen)
    if all(s.tp > 1 for s in space):  # else those that cannot split are rows saying why
        from ..transforms.megatron import tensor_split_problem

        problems = {k: tensor_split_problem(t, k) for k in sorted({s.tp for s in space})}
        if all(problems.values()):
            raise SearchError(
                f"strategies: tensor parallelism cannot split {t.name}, and every strategy "
                f"listed splits it ({space[0]}: {problems[space[0].tp]}); list strategies "
                "with tp=1"
            )
    return _requested(t, topology, batch, space)


def _requested(t: Function, topology: Topology, rows_of_batch: int, strategies_: list) -> _Request:
    """The request of space ``strategies_`` of training step ``t`` (see _request)."""
    capacity = min(d.memory_bytes for d in topology.devices)
    facts = ModelFacts.of(t, rows_of_batch)
    # the analyses strategies share (the tensor degree's, the stages', the batch pieces'),
    # run once in this request (not in an executor's processes: each builds its own)
    shared = SharedPlans()
    problems = _tensor_problems(t, strategies_, shared, rows_of_batch)
    pruned = prune(strategies_, facts, capacity, problems)
    model_flops, dtype = _flops(t)
    peak = topology.devices[0].peak_flops_for(dtype, True, allow_tf32=topology.allow_tf32)
    tokens = _tokens_per_sample(t)
    name = uuid.uuid4().hex  # what names the request to an executor's workers (_simulate_batch)
    return _Request(strategies_, pruned, t, topology, rows_of_batch, tokens, model_flops, peak,
                    shared, name)  # fmt: skip


def _decided(request: _Request, simulate: str, progress: bool, executor: Any) -> Iterator[Row]:
    from tqdm.auto import tqdm

    space, pruned, t, topology, batch = (request.space, request.pruned, request.t,
                                         request.topology, request.batch)  # fmt: skip
    if simulate not in MODES:
        raise SearchError(f"simulate must be one of {MODES}, got {simulate!r}")
    if executor is not None and not callable(getattr(executor, "submit", None)):
        raise SearchError(
            "executor must have submit(fn, *args) (a concurrent.futures executor or "
            f"a dask.distributed Client), got {type(executor).__name__}"
        )
    for s, why in pruned.items():
        yield Row(s, "pruned", error=why)
    todo = [s for s in space if s not in pruned]
    args, shared, name = request.args(), request.shared, request.name
    submit = None
    if executor is not None:
        step = pickle.dumps(t, protocol=pickle.HIGHEST_PROTOCOL)  # once, not once a job
        submit = lambda ss: executor.submit(_simulate_batch, ss, name, step, *args[1:])  # noqa: E731
        # an executor in this process (threads) shares the request's own plans
        with _WORKER_PLANS_LOCK:
            _WORKER_PLANS[name] = (t, shared)
    capacity = min(d.memory_bytes for d in topology.devices)
    report = progress if callable(progress) else None
    bar = tqdm(total=len(todo), desc="searching strategies", disable=report or not progress)
    with bar, _forgotten(name):
        for done, row in enumerate(
            decide(
                todo,
                lambda s: _simulate(s, *args, shared),
                lambda: Estimator(t, topology, batch, todo, shared),
                capacity,
                simulate,
                submit,
                _workers(executor),
            ),
            1,
        ):
            bar.update()
            if report is not None:
                report(done, len(todo))
            yield row
            check()  # a dashboard's Cancel: stop between strategies


def _workers(executor: Any) -> int:
    """How many strategies ``executor`` runs at once: a dask Client's threads, a
    ``concurrent.futures`` pool's workers, else this machine's cores."""
    if executor is None:
        return 1
    threads = getattr(executor, "nthreads", None)
    if callable(threads):  # dask.distributed.Client
        with contextlib.suppress(Exception):
            return max(1, sum(threads().values()))
    return max(1, getattr(executor, "_max_workers", None) or os.cpu_count() or 1)


def _check_request(
    devices: int,
    batch: int,
    t: Function,
    space: list[Strategy],
    *,
    dp: Iterable[int] | int | None,
    tp: Iterable[int] | int | None,
    pp: Iterable[int] | int | None,
    cp: Iterable[int] | int | None = None,
) -> None:
    """Refuse, naming the constraint, a request that no strategy could satisfy."""
    named = (("dp", dp), ("tp", tp), ("pp", pp), ("cp", cp))
    asked = {name: _listed(name, given) for name, given in named}
    for name, degrees in asked.items():
        over = [d for d in degrees or () if d > devices]
        if over:
            raise SearchError(
                f"{name}={over[0]} needs at least {over[0]} devices; the topology has "
                f"{devices} (a search runs on all of them: dp x cp x tp x pp = {devices})"
            )
    if not space:
        shown = ", ".join(
            f"{n}={d}" for n, d in asked.items() if d is not None and (n != "cp" or d != [1])
        )
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


def _tensor_problems(
    t: Function, space: list[Strategy], shared: SharedPlans | None = None, batch: int = 1
) -> dict[int, str | None]:
    """For each tensor-parallel degree of the space, why it would repeat work on every
    tensor rank (beyond the attention heads, say), or None: analysed once per degree,
    so the builds need not check again (``shared``: the search's, whose vocabulary forms
    the builds then reuse; analysed at the batch pieces the estimator analyses ``t`` at,
    where ``batch`` has them, so that it reuses the analyses)."""
    from ..transforms.megatron import tensor_replication_problem
    from .estimate import analysed_pieces

    analyses = shared.of(t, False)[1] if shared is not None else None
    degrees = sorted({s.tp for s in space})
    pieces = analysed_pieces(batch) or 1
    problems = {k: tensor_replication_problem(t, k, analyses, pieces) for k in degrees if k > 1}
    return {k: why.splitlines()[0] if why else None for k, why in problems.items()}


def _listed(name: str, given: Iterable[int] | int | None) -> list[int] | None:
    return None if given is None else _choices(name, given, ())


def _simulate(
    s: Strategy,
    t: Function,
    topology: Topology,
    batch: int,
    tokens: int,
    model_flops: float,
    peak_flops: float,
    shared: SharedPlans | None = None,
) -> Row:
    from .. import simulate

    try:
        # tensor degrees that would repeat work were pruned (_tensor_problems): no recheck;
        # the plans' lock: a thread executor's jobs build with the same plans at once
        with shared.lock if shared is not None else contextlib.nullcontext():
            # each repeated task one op (T.megatron(tasks=True)): the same simulation
            g = s.build(t, topology, allow_replication=True, shared=shared, tasks=True)
        r = simulate(g, topology)
    except DistIRError as e:
        return Row(s, "error", error=str(e).splitlines()[0])
    except Exception as e:  # a bug, not the strategy's fault: reported, not fatal
        why = (str(e).splitlines() or [""])[0]
        return Row(s, "error", error=f"internal error ({type(e).__name__}): {why}")
    totals = r.totals  # from the walked devices: no work per device
    if totals.idle_devices:  # the transforms refuse such cuts; a row must never call one "ok"
        idle = sorted(set(range(s.devices)) - {d for d in r.devices if r.busy_s[d] > 0})
        why = f"device(s) {idle} of the {s.devices} compute nothing in the step"
        return Row(s, "error", error=why)
    step = r.step_time_s
    peak = totals.max_peak_memory_bytes
    exposed = step - totals.mean_busy_s - totals.mean_idle_s
    bubble = totals.mean_idle_s / step if step else 0.0
    status = "ok" if totals.fits else "over capacity"
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


def _simulate_batch(
    strategies: list[Strategy], request: str, step: bytes | Function, *args: Any
) -> list[Row]:
    """The rows of a batch of strategies (:func:`ir.search.tiers.batches`), each
    :func:`_simulate`'d on the training step and ``args``: what an executor's worker runs.
    ``request`` names the search the batch belongs to (:func:`_requested`): the worker's
    batches of one search share one :class:`SharedPlans` (each analysis made once per
    worker, not once per batch) and the training step they were made of, unpickled from
    ``step`` (the search pickles it once) by the worker's first batch only."""
    t, plans = _worker_plans(request, step)
    return [_simulate(s, t, *args, plans) for s in strategies]


# In a worker: the shared plans of the last few searches it ran batches of, by request
# name (a fresh random name per search request, never an object's id): kept while a
# search runs, dropped two searches later. Locked: a dask worker runs batches in threads.
_WORKER_PLANS: OrderedDict[str, tuple[Function, SharedPlans]] = OrderedDict()
_WORKER_PLANS_KEPT = 2
_WORKER_PLANS_LOCK = threading.Lock()


@contextlib.contextmanager
def _forgotten(request: str) -> Iterator[None]:
    """This process's plans of ``request`` dropped when its search ends (the workers'
    are dropped two searches later)."""
    try:
        yield
    finally:
        with _WORKER_PLANS_LOCK:
            _WORKER_PLANS.pop(request, None)


def _worker_plans(request: str, step: bytes | Function) -> tuple[Function, SharedPlans]:
    with _WORKER_PLANS_LOCK:
        found = _WORKER_PLANS.get(request)
        if found is None:
            t = pickle.loads(step) if isinstance(step, bytes) else step
            found = _WORKER_PLANS[request] = (t, SharedPlans())
            while len(_WORKER_PLANS) > _WORKER_PLANS_KEPT:
                _WORKER_PLANS.popitem(last=False)
        _WORKER_PLANS.move_to_end(request)
        return found


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
    "search_rows",
    "strategies",
]
