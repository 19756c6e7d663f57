"""The two tiers of a search: every strategy estimated, the event simulation on those that
can reach the front (:func:`decide`).

With ``simulate="front"`` the strategies are taken in order of their estimated step time
made optimistic by the estimator's measured error (:data:`ir.search.estimate.TIME_MARGIN`,
on roofline topologies ``ROOFLINE_TIME_MARGIN``, on what the
estimate adds to the busiest device's compute,
:func:`~ir.search.estimate.optimistic_step_s`; :data:`~ir.search.estimate.MEMORY_MARGIN`
on the peak: its estimates exceed the simulator's figures by at most that much): a
strategy is simulated unless a strategy already simulated is faster than its optimistic
step time and needs no more memory than its optimistic peak (then the simulation could
not put it on the front), or its optimistic peak already exceeds the devices. Every
simulated strategy checks the margins: where the estimate exceeded the simulation by
more, the margins widen to that error (and half again) for the strategies still to
come. The optimistic step time is raised to the strategy's floor where that is higher
(:meth:`~ir.search.estimate.Estimator.bound_s`: longest paths of its compute and the
collectives it waits for, each rank's tasks in the schedule's order, which no
simulation goes below), made only for strategies the margin alone leaves; a simulated
step below its floor turns the floors off for the rest of the search. Likewise a
strategy whose peak, less the margin, fits is skipped if what its schedule must hold at
once is over the devices (:meth:`~ir.search.estimate.Estimator.peak_floor_bytes`: its
inputs, and the activations and gradient sums live at once in its rank's task order,
which no simulated peak is below), made last, for the strategies nothing else skips.
The order is the estimates', but a strategy about to be simulated whose floor is above
its estimate (the estimate is then known short: interleaved stages of uneven length stall
where the closed form's bubble does not) waits for its floor's place, so that the
strategies ahead of it can spare its simulation. ``simulate="fastest"`` asks only for the
fastest strategy that fits: a strategy is
simulated unless a simulated strategy that fits is faster than its optimistic step time
(whatever the memory), or its optimistic peak exceeds the devices; the front's slower,
leaner points are left estimated (on GPT-3's every-knob space on 1,024 GPUs, about a
seventh of what the front needs). ``simulate="all"`` simulates every strategy (the
reference both are tested against). Rows come out as they are decided.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any, TypeVar

import numpy as np

from .estimate import MEMORY_MARGIN, Estimator, optimistic_step_s, step_error
from .estimate import time_margin as starting_margin
from .result import Row
from .space import Strategy

MODES = ("front", "fastest", "all")
T = TypeVar("T")


class Front:
    """The simulated rows that fit, as a staircase: ascending step time, descending peak."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.peaks: list[float] = []

    def add(self, time_s: float, peak_bytes: float) -> None:
        i = bisect_left(self.times, time_s)
        if i > 0 and self.peaks[i - 1] <= peak_bytes:
            return  # a faster row needs no more memory
        j = i
        while j < len(self.times) and self.peaks[j] >= peak_bytes:
            j += 1  # the rows it beats
        self.times[i:j] = [time_s]
        self.peaks[i:j] = [peak_bytes]

    def beats(self, time_s: float, peak_bytes: float) -> bool:
        """Whether a row is strictly faster than ``time_s`` and needs at most ``peak_bytes``."""
        i = bisect_left(self.times, time_s)  # rows before i are strictly faster
        return i > 0 and self.peaks[i - 1] <= peak_bytes


def decide(
    todo: Sequence[Strategy],
    simulate_one: Callable[[Strategy], Row],
    estimator: Callable[[], Estimator],
    capacity_bytes: float,
    mode: str = "front",
    submit: Callable[[list[Strategy]], Any] | None = None,
    workers: int = 1,
) -> Iterator[Row]:
    """Yield one row per strategy of ``todo``, as each is decided (see the module doc).

    ``simulate_one`` simulates a strategy into its row; ``submit`` (with an executor) gives
    a future of the rows of a batch of strategies instead (``"all"``: :func:`batches`,
    those that share analyses together; the two tiers keep the next strategies in flight,
    one a job, and decide each on the rows before it: the rows are a serial search's,
    :func:`_rolling`)."""
    if mode == "all":
        yield from _all(todo, simulate_one, submit, workers)
        return
    model = estimator()
    est = model.estimate(todo)
    time_margin, memory_margin = starting_margin(model.topology), MEMORY_MARGIN
    known = est.known
    order = np.argsort(np.where(known, est.step_time_s, 0.0), kind="stable")
    front = Front()

    def finish(i: int, row: Row) -> Row:
        nonlocal time_margin, memory_margin, floor_holds, peak_floor_holds
        if known[i]:
            row = replace(
                row,
                estimated_step_time_s=float(est.step_time_s[i]),
                estimated_peak_memory_bytes=float(est.peak_memory_bytes[i]),
            )
            if row.status in ("ok", "over capacity") and row.step_time_s > 0:
                over_t = step_error(est.step_time_s[i], est.busy_s[i], row.step_time_s)
                over_m = est.peak_memory_bytes[i] / max(row.peak_memory_bytes, 1.0) - 1
                time_margin = max(time_margin, 1.5 * over_t)
                memory_margin = max(memory_margin, 1.5 * over_m)
                if floor_holds and row.step_time_s < floor(i):
                    floor_holds = False  # the chain missed something: trust none
                if i in peak_floors and row.peak_memory_bytes < peak_floors[i]:
                    peak_floor_holds = False  # the liveness missed something: trust none
        if row.ok:
            front.add(row.step_time_s, row.peak_memory_bytes)
        return row

    floors: dict[int, float] = {}
    floor_holds = True  # no simulated step has been below its strategy's floor

    def floor(i: int) -> float:
        """Strategy ``i``'s longest chain (:meth:`Estimator.bound_s`), made only for the
        strategies the estimate with its margin leaves and those about to be simulated
        (or sent to a worker ahead), or 0 once a simulation has been below one (then no
        floor is trusted)."""
        if i not in floors:
            floors[i] = model.bound_s(todo[i])
        return floors[i] if floor_holds else 0.0

    peak_floors: dict[int, float] = {}
    peak_floor_holds = True  # no simulated peak has been below its strategy's floor

    def peak_floor(i: int) -> float:
        """Strategy ``i``'s least peak (:meth:`Estimator.peak_floor_bytes`), made only for
        the strategies whose estimate with its margin fits, or 0 once a simulated peak
        has been below one."""
        if i not in peak_floors:
            peak_floors[i] = model.peak_floor_bytes(todo[i])
        return peak_floors[i] if peak_floor_holds else 0.0

    def skipped(i: int) -> str | None:
        """Why strategy ``i`` need not be simulated given the rows so far, or None."""
        if not known[i]:
            return None
        low_t = optimistic_step_s(est.step_time_s[i], est.busy_s[i], time_margin)
        low_m = est.peak_memory_bytes[i] / (1 + memory_margin)
        if low_m > capacity_bytes:
            return (
                f"estimated peak {est.peak_memory_bytes[i] / 2**30:.2f} GiB: over the "
                f"devices' {capacity_bytes / 2**30:.2f} GiB even {memory_margin:.0%} lower"
            )
        why = (
            f"{low_t:.4g} s (its compute {est.busy_s[i]:.4g} s, the rest {time_margin:.0%} shorter)"
        )
        if mode == "fastest" and front.times:
            if front.times[0] >= low_t and front.times[0] < floor(i):
                low_t = floor(i)
                why = f"{low_t:.4g} s (the longest chain of its compute and collectives)"
            if front.times[0] < low_t:
                return (
                    f"a simulated strategy that fits is faster, even with this one's step at {why}"
                )
        if mode == "front" and front.times:
            if not front.beats(low_t, low_m) and front.beats(floor(i), low_m):
                low_t = floor(i)
                why = f"{low_t:.4g} s (the longest chain of its compute and collectives)"
            if front.beats(low_t, low_m):
                return (
                    "a simulated strategy is faster and needs no more memory, even with this "
                    f"one's step at {why} and its peak {memory_margin:.0%} smaller"
                )
        if peak_floor(i) > capacity_bytes:  # (made last: it walks every task)
            return (
                f"at least {peak_floor(i) / 2**30:.2f} GiB live at once (its inputs, and the "
                f"activations and gradients its schedule keeps): over the devices' "
                f"{capacity_bytes / 2**30:.2f} GiB"
            )
        return None

    def left(i: int, why: str) -> Row:
        return Row(
            todo[i],
            "estimated",
            estimated_step_time_s=float(est.step_time_s[i]),
            estimated_peak_memory_bytes=float(est.peak_memory_bytes[i]),
            error=why,
        )

    done: dict[int, Row] = {}  # rows simulated ahead of the strategy being decided
    ranked = order.tolist()
    # the order's key: the estimated step, raised to the strategy's floor where a strategy
    # about to be simulated has a floor above its estimate (the estimate is then known
    # short: a pipeline of uneven stages stalls where the closed form's bubble does not)
    key = np.where(known, est.step_time_s, 0.0).tolist()

    def decided(pos: int) -> Row | None:
        """The row of the strategy at ``ranked[pos]`` if the rows so far decide it without a
        new simulation, None to simulate it. A strategy whose floor is above its key is
        first moved later, to where its floor ranks it (never sent ahead before), and the
        one then at ``pos`` decided instead."""
        while True:
            i = ranked[pos]
            if i in est.refused:  # the transform's own stage cut refuses it: nothing to build
                return Row(todo[i], "error", error=est.refused[i])
            why = skipped(i)
            if why is not None:  # (a row simulated ahead that a serial search skips: dropped)
                done.pop(i, None)
                return left(i, why)
            if not misranked(i):
                return finish(i, done.pop(i)) if i in done else None
            key[i] = floor(i)  # (then no longer misranked)
            del ranked[pos]
            ranked.insert(bisect_right(ranked, key[i], lo=pos, key=key.__getitem__), i)

    def misranked(i: int) -> bool:
        """Whether strategy ``i``'s floor is above its key (its place in the order)."""
        return known[i] and floor(i) > key[i]

    if submit is not None:

        def ahead(j: int) -> bool:  # worth simulating before its turn
            return j not in est.refused and skipped(j) is None and not misranked(j)

        yield from _rolling(ranked, todo, decided, skipped, ahead, done, submit, workers)
        return
    for pos in range(len(ranked)):  # (a move keeps the length)
        row = decided(pos)
        yield row if row is not None else finish(ranked[pos], simulate_one(todo[ranked[pos]]))


def _rolling(
    ranked: list[int],
    todo: Sequence[Strategy],
    decided: Callable[[int], Row | None],
    skipped: Callable[[int], str | None],
    ahead: Callable[[int], bool],
    done: dict[int, Row],
    submit: Callable[[list[Strategy]], Any],
    workers: int,
) -> Iterator[Row]:
    """The two tiers on an executor: the strategies decided in order as a serial search
    decides them, each on the rows before it (``decided(pos)``: the row of
    ``ranked[pos]``, or None to simulate it; it may first move strategies later in
    ``ranked``), while the next ``2 x workers`` that the rows so far leave to simulate
    (``ahead``) are in flight (a job each: a worker keeps the search's shared plans across
    its jobs), so that no worker waits for a wave's slowest strategy. A strategy in flight
    that the rows then skip is cancelled if it has not started, and its row dropped if it
    has (the rows are a serial search's)."""
    window = 2 * workers
    flight: dict[int, Any] = {}  # strategy index -> the future of its row
    pos = 0  # the next strategy to decide
    try:
        while pos < len(ranked):
            row = decided(pos)
            if row is not None:
                yield row
                pos += 1
                continue
            i = ranked[pos]
            for j in [j for j in flight if j != i and skipped(j) is not None]:
                flight.pop(j).cancel()  # no longer needed (dropped if it has run)
            if i not in flight:
                flight[i] = submit([todo[i]])
            for j in ranked[pos + 1 :]:
                if len(flight) >= window:
                    break
                if j not in flight and j not in done and ahead(j):
                    flight[j] = submit([todo[j]])
            (done[i],) = flight.pop(i).result()
            for j in [j for j, f in flight.items() if f.done()]:
                (done[j],) = flight.pop(j).result()
    except KeyboardInterrupt:  # the rows a serial search would have decided so far
        for k in range(pos, len(ranked)):
            row = decided(k)
            if row is None:
                break
            yield row
        raise
    finally:  # interrupted, stopped early by the caller (GeneratorExit), or left skipped
        for future in flight.values():
            if not future.done():
                future.cancel()


def shares(s: Strategy) -> tuple:
    """What decides the analyses a strategy's build shares with others
    (:class:`~ir.search.space.SharedPlans`): the recomputation, the batch pieces, the
    stages, the tensor degree."""
    return (s.recompute, s.dp * s.microbatches, s.pp * s.chunks, s.tp)


def work(s: Strategy) -> int:
    """A strategy's relative cost to build and simulate (to balance an executor's
    batches): a fixed part, a part per pipeline stage and one per task (a microbatch on
    a stage). Measured on the 35-strategy grid of a 16-layer MLP on 16 GPUs (8 ms for
    dp16, 21 ms for pp16 with 2 microbatches, 76 ms with 32): about 70 : 5 : 1."""
    stages = s.pp * s.chunks
    return 70 + 5 * stages + s.microbatches * stages


def batches(items: Sequence[tuple[int, Strategy]], count: int) -> list[list[tuple[int, Strategy]]]:
    """``items`` (index, strategy) in at most ``count`` batches of nearly equal
    :func:`work`, the strategies that share analyses (:func:`shares`) side by side: an
    executor's worker builds a batch with its :class:`~ir.search.space.SharedPlans`.
    Equal work, not equal counts: a batch of 32-microbatch pipelines takes several times
    one of single-stage steps, and the last batch to finish ends the search."""
    ordered = sorted(items, key=lambda item: shares(item[1]))
    weights = [work(s) for _, s in ordered]
    total = sum(weights)
    count = max(1, min(count, len(ordered)))
    out: list[list[tuple[int, Strategy]]] = [[]]
    done = 0
    for item, w in zip(ordered, weights, strict=True):
        # a batch ends where the work so far reaches its share of the total
        if out[-1] and done + w / 2 > total * len(out) / count and len(out) < count:
            out.append([])
        out[-1].append(item)
        done += w
    return out


Batch = tuple[list[int], Any]  # the indices of a batch's strategies, the future of its rows


def _spread(
    items: Sequence[tuple[int, Strategy]],
    submit: Callable[[list[Strategy]], Any],
    count: int,
    finish: Callable[[int, Row], T],
) -> Iterator[T]:
    """The rows of ``items`` simulated on the executor in ``count`` batches, as each batch
    finishes in order; interrupted (while submitting or waiting), the rows of the batches
    that finished, the others cancelled."""
    pending: list[Batch] = []
    try:
        for batch in batches(items, count):
            pending.append(([i for i, _ in batch], submit([s for _, s in batch])))
    except KeyboardInterrupt:
        yield from _finished(pending, finish)
        raise
    yield from _collect(pending, finish)


def _collect(pending: list[Batch], finish: Callable[[int, Row], T]) -> Iterator[T]:
    """The rows of ``pending`` batches in order; interrupted, the unfinished are cancelled."""
    done = 0
    try:
        for indices, future in pending:
            rows = future.result()
            done += 1
            for j, row in zip(indices, rows, strict=True):
                yield finish(j, row)
    except KeyboardInterrupt:
        yield from _finished(pending[done:], finish)
        raise
    finally:  # the caller stopped early (GeneratorExit: on_row or a Cancel raised)
        for _, future in pending[done:]:
            if not future.done():
                future.cancel()


def _finished(pending: list[Batch], finish: Callable[[int, Row], T]) -> Iterator[T]:
    """After an interrupt: the rows of the batches that finished (without waiting); the
    others cancelled."""
    for indices, future in pending:
        if not future.done():
            future.cancel()
            continue
        try:
            rows = future.result()
        except (Exception, KeyboardInterrupt):  # its worker interrupted, or lost
            continue
        for j, row in zip(indices, rows, strict=True):
            yield finish(j, row)


def _all(
    todo: Sequence[Strategy],
    simulate_one: Callable[[Strategy], Row],
    submit: Callable[[list[Strategy]], Any] | None,
    workers: int,
) -> Iterator[Row]:
    if submit is None:
        for s in todo:
            yield simulate_one(s)
        return
    # a few batches per worker: the work stays balanced while each shares its analyses
    yield from _spread(list(enumerate(todo)), submit, 4 * workers, lambda _, row: row)
