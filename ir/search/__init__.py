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
``zero``, ``sequence_parallel``, ``recompute``) is enumerated by
:func:`ir.search.space.strategies`, pruned without building anything
(:func:`ir.search.space.prune`: the batch does not divide, the state alone does not
fit, another point is at least as good by construction), and every survivor is built
by ``T.megatron`` and simulated (rank classes walked once: ``ir.simulate``). A
strategy the transform refuses is a row with its error, not a failed search.
"""

from __future__ import annotations

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
    )
    capacity = min(d.memory_bytes for d in topology.devices)
    pruned = prune(space, ModelFacts.of(t, rows_of_batch), capacity)
    model_flops, dtype = _flops(t)
    peak = topology.devices[0].peak_flops_for(dtype, True, allow_tf32=topology.allow_tf32)
    tokens = _tokens_per_sample(t)
    rows: dict[Strategy, Row] = {s: Row(s, "pruned", error=why) for s, why in pruned.items()}
    todo = [s for s in space if s not in pruned]
    args = (t, topology, rows_of_batch, tokens, model_flops, peak)
    bar = tqdm(total=len(todo), desc="simulating strategies", disable=not progress)
    with bar:
        if executor is None:
            for s in todo:
                rows[s] = _simulate(s, *args)
                bar.update()
        else:
            if not callable(getattr(executor, "submit", None)):
                raise SearchError(
                    "executor must have submit(fn, *args) (a concurrent.futures executor or "
                    f"a dask.distributed Client), got {type(executor).__name__}"
                )
            futures = [(s, executor.submit(_simulate, s, *args)) for s in todo]
            for s, future in futures:
                rows[s] = future.result()
                bar.update()
    return SearchResult([rows[s] for s in space])


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
        g = s.build(t, topology)
        r = simulate(g, topology)
    except DistIRError as e:
        return Row(s, "error", error=str(e).splitlines()[0])
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
