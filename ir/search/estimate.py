"""The search's first tier: a closed-form estimate of every strategy's step time and peak
memory (:class:`Estimator`), fast enough for spaces of millions of points.

Per (degree, rows per microbatch, stages) the per-device times of a microbatch's
forward and backward on each stage come from a :class:`~ir.search.profile.Profile` (the
transform's own analysis, scaled; op times from the device's cost and kernel models,
collectives from the topology's collective model: what the simulator reads). A strategy
then composes them in closed form:

* pipeline: ``sum over ranks of c + (m - 1) * max over ranks of c``, ``c`` a rank's
  forward and backward of a microbatch (GPipe and 1F1B share the bubble; interleaving
  gives ``m * max c + (pp - 1) * max c / v``, Narayanan et al. 2021); a rank's compute is
  at least its host's issue time; where the hosts synchronise after transfers,
  ``c`` includes the exchanges with the neighbouring ranks (each a send's time and the
  host's restart: after each task, or for the interleaved steady state after each
  forward-backward pair, ``v`` a microbatch, as ``ir.transforms.pipeline.run_exchanges``
  places them), else the sends of the first microbatch's path;
* data parallelism: each rank's gradient all-reduces (ZeRO: reduce-scatters, then the
  updated weights all-gathered) overlap the last microbatch's backward, the rest and the
  optimizer step exposed; ZeRO-2 reduce-scatters every microbatch's gradients as they
  are made, and the sum waits for them (``T.megatron``): behind every backward but the
  first; a host slower than its device issues the reductions within the last backward,
  which the ranks before it wait for;
* recomputation replays the forward ops ``T.recompute`` replays, in the backward, and
  keeps their results out of the saved activations;
* memory: weights, their gradient sums and optimizer state (ZeRO splits the state, and
  with stage 2 the gradients), the activations a microbatch saves for its backward times
  the microbatches in flight (1F1B: the ranks after it, at most ``m``; GPipe: ``m``;
  where no forward follows the first backward, the sums meet one microbatch fewer), what
  the step returns of every microbatch (a model's logits: live to the step's end, ``m``
  of them), and the largest op's results. Ops only the tensor-split step has (a
  vocabulary-parallel embedding and loss) are scaled from their own analyses at twice
  the pieces and twice the degree, as the degree-1 step's are.

What it leaves out (link contention between channels, the exact overlap of transfers
with compute, the allocator's order) is what the event simulation adds; the search
simulates every strategy whose estimate can reach the front within :data:`TIME_MARGIN`
and :data:`MEMORY_MARGIN`, the estimator's largest errors against the simulator as
``tests/search/test_estimate.py`` measures them on every strategy of small spaces.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..device import Topology
from ..errors import DistIRError
from ..function import Function
from .profile import Costs, NotEstimableError, Profile, RefusedError, replayed_names
from .space import SharedPlans, Strategy

#: The estimator's relative error bounds against the simulator, measured on every strategy
#: of the spaces of tests/search/test_estimate.py (largest errors seen there: see that
#: file) with room to spare; the search widens them when a simulated strategy shows a
#: larger error (ir.search.tiers). The step time's applies to what the estimate adds to
#: the busiest device's compute (:func:`optimistic_step_s`), the peak memory's to the
#: whole peak.
TIME_MARGIN = 0.75
MEMORY_MARGIN = 0.15
#: The step time's margin on a roofline topology (``ideal=True`` presets and the ``cpu``
#: preset: no kernel or collective model): there the estimate of interleaved and
#: tensor-split pipelines has been seen up to 2.45 times the simulation's part above the
#: compute (a review's 1,682 random strategies on such presets: 49 above
#: :data:`TIME_MARGIN`, most interleaved with pp > 1), against 1.003 at most on the
#: efficiency-model presets (2,076 strategies).
ROOFLINE_TIME_MARGIN = 3.0
#: :meth:`Estimator.bound_s` takes this much off its longest path: the estimator scales
#: each op's shapes from its analyses where the simulator costs the built program's
#: (the busiest device's compute agrees to 1e-3 in tests/search/test_estimate.py).
BOUND_SLACK = 1e-3
_NEVER = float("-inf")


def time_margin(topology: Topology) -> float:
    """The step time's margin the search starts from on ``topology``
    (:data:`TIME_MARGIN`, or :data:`ROOFLINE_TIME_MARGIN` where the estimator is known to
    be further off)."""
    return ROOFLINE_TIME_MARGIN if topology.ideal else TIME_MARGIN


def optimistic_step_s(step_s: Any, busy_s: Any, margin: float) -> Any:
    """The shortest step an estimate allows: its busiest device's compute (the ops' own
    times, which the estimator takes from the simulator's models: no step is shorter),
    and the rest (bubble, exposed communication, exchanges, the host) ``margin`` lower.
    Per term rather than one ratio: a step of long kernels keeps a narrow range, one of
    host-bound small ops, whose composition the closed form knows least, a wide one."""
    return busy_s + (step_s - busy_s) / (1 + margin)


def step_error(step_s: Any, busy_s: Any, simulated_s: Any) -> Any:
    """How far an estimate's part above its compute exceeds the simulation's (the margin
    :func:`optimistic_step_s` needs to stay at or below the simulated step)."""
    return (step_s - busy_s) / np.maximum(simulated_s - busy_s, 1e-12 * simulated_s) - 1


@dataclass(frozen=True)
class Estimates:
    """Per strategy (in the order asked): estimated step time, peak bytes of the fullest
    device, mean bubble and exposed communication, the busiest device's compute seconds
    (``busy_s``: the ops' own times, which the step cannot be shorter than); ``known`` is
    False where the estimator cannot scale the step (the simulator decides those)."""

    step_time_s: np.ndarray
    peak_memory_bytes: np.ndarray
    bubble: np.ndarray
    exposed_comm_s: np.ndarray
    busy_s: np.ndarray
    known: np.ndarray
    refused: dict[int, str] = field(default_factory=dict)  # index -> the stage cut's refusal


def analysed_pieces(batch: int) -> int | None:
    """The number of batch pieces the estimator analyses a step of ``batch`` rows at (None:
    the batch has no such number): two at least, since with one the data plan has no
    gradient sum (no optimizer steps after it to read the weights from)."""
    return next((k for k in range(2, 9) if batch % k == 0), None)


class Estimator:
    """Closed-form step time and memory of ``t``'s strategies on ``topology``.

    Built once per search: it analyses the step at one microbatch size (its data level
    says which dimensions follow the batch) without tensor parallelism and at the space's
    smallest tensor-parallel degree (which dimensions the degree splits; with sequence
    parallelism too if the space has it); :meth:`estimate` then costs any list of
    strategies, a group of strategies that share a degree, microbatch size and pipeline at
    a time, with numpy. What it costs is kept: per (degree, rows) each distinct op once, per stage
    count each op's stage once. ``shared``: the search request's :class:`SharedPlans` of
    ``t``, whose analyses (made by the pruning, reused by the builds) its own start from;
    the estimates are the same without it."""

    def __init__(
        self,
        t: Function,
        topology: Topology,
        batch: int,
        strategies: Sequence[Strategy],
        shared: SharedPlans | None = None,
    ) -> None:
        self.t, self.topology, self.batch = t, topology, batch
        # the search's analyses of t (its forms, stage cuts, data plans, pieces and tensor
        # plans), which its pruning made and its builds reuse
        self.shared = shared.of(t, False)[1] if shared is not None else None
        self.costs = Costs(topology)
        self.pieces = analysed_pieces(batch)
        self._profiles: dict[tuple[int, bool], tuple[Profile, int] | None] = {}
        self._cache: dict[tuple, Any] = {}
        self._members: dict[tuple, tuple] = {}
        if self.pieces is None:
            return
        replayed = set()
        if any(s.recompute for s in strategies):  # (the builds' recomputed step, if shared)
            replayed = replayed_names(t, shared.of(t, True)[0] if shared is not None else None)
        try:
            base = Profile(t, 1, self.pieces, shared=self.shared)
        except DistIRError:
            return
        base.finish(replayed)
        self._profiles[(1, False)] = (base, 1)
        wide = sorted({s.tp for s in strategies if s.tp > 1})
        for sp in sorted({s.sequence_parallel for s in strategies if s.tp > 1}):
            for tp in wide:  # the smallest degree the step takes
                try:
                    prof = Profile(t, tp, self.pieces, sp, self.shared)
                except DistIRError:
                    continue
                alone = prof.split_from(base)
                if alone:  # ops only the split step has: their own rows and degree
                    self._infer_alone(prof, alone, tp, wide, sp)
                prof.finish(replayed)
                prof.share(base)
                self._profiles[(2, sp)] = (prof, tp)
                break

    def _infer_alone(
        self, prof: Profile, alone: set[str], tp: int, wide: list[int], sp: bool
    ) -> None:
        """Find the split dimensions of the records ``prof`` has and the degree-1 step has
        not (a vocabulary-parallel embedding and loss) by comparing the step at twice the
        degree, where the space has degrees above ``tp`` (their batch dimensions, like
        every record's, are the data level's)."""
        if max(wide) > tp:
            with contextlib.suppress(DistIRError):
                prof.infer_split(Profile(self.t, 2 * tp, self.pieces, sp, self.shared), alone)

    def _entry(self, tp: int, sp: bool) -> tuple[Profile, int]:
        entry = self._profiles.get((min(tp, 2), sp and tp > 1))
        if entry is None:
            raise NotEstimableError("no profile of this degree")
        return entry

    def _cached(self, key: tuple, make: Any) -> Any:
        found = self._cache.get(key)
        if found is None:
            found = self._cache[key] = make()
        return found

    def _classes(self, tp: int, rows: int, sp: bool) -> tuple[np.ndarray, ...]:
        """Per record class at (degree, rows): device and host seconds of an op (a
        conversion's collective seconds in ``comm``), bytes kept for the backward, result
        bytes, the first result's bytes, bytes the step returns (live to its end)."""

        def make() -> tuple[np.ndarray, ...]:
            prof, tp_ref = self._entry(tp, sp)
            rows_ratio = rows / (self.batch // prof.pieces)
            split_ratio = tp_ref / tp
            n = len(prof.classes)
            dev, host, comm = np.zeros(n), np.zeros(n), np.zeros(n)
            kept, total, first, held = np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n)
            devices = tuple(range(tp))
            sized = self._sizes(tp, rows, sp)
            for k, (rec, keep, _) in enumerate(prof.classes):
                if rec.op is None:
                    full = sized[k][0] * (tp if rec.kind == "allgather" else 1)
                    comm[k] = self.costs.collective(rec.kind, full, devices)
                    continue
                shapes = rec.shapes(rows_ratio, split_ratio)
                dev[k], host[k] = self.costs.op(rec.op, shapes, rec.types, rec.n_in)
                outs = sized[k]
                returned = prof.returned[k]
                held[k] = sum(x for x, out in zip(outs, returned) if out)
                # kept for the backward, less what the step returns (live anyway)
                kept[k] = sum(x for x, k_, r in zip(outs, keep, returned) if k_ and not r)
                total[k] = sum(outs) - held[k]  # what the op allocates for a while
                first[k] = outs[0] if outs else 0.0
            return dev, host, comm, kept, total, first, held

        return self._cached(("classes", tp, rows, sp), make)

    def _records(self, tp: int, rows: int, sp: bool, recompute: bool) -> tuple[np.ndarray, ...]:
        """Per record: device and collective seconds, and whether the backward replays it
        (what the longest chains and the kept bytes walk record by record)."""

        def make() -> tuple[np.ndarray, ...]:
            prof, _ = self._entry(tp, sp)
            dev, _, comm, *_ = self._classes(tp, rows, sp)
            cls = prof.class_of
            return dev[cls], comm[cls], prof.again[cls] & recompute

        return self._cached(("records", tp, rows, sp, recompute), make)

    def _stages(self, tp: int, rows: int, stages: int, sp: bool, recompute: bool) -> tuple:
        """Per stage (rows) and phase (forward, backward): device, host and tensor-parallel
        collective seconds and transfers; per stage: kept activation bytes, largest op
        bytes, the bytes its last forward result sends on; transfers; the bytes each
        microbatch leaves returned (live to the step's end)."""

        def make() -> tuple:
            prof, _ = self._entry(tp, sp)
            dev, host, comm, kept, total, first, held = self._classes(tp, rows, sp)
            count, last = prof.counts(stages)  # (2 stages, classes): records per class
            both = count[0::2] + count[1::2]  # per stage, either phase
            again = prof.again & recompute  # (forward classes) replayed in the backward
            conv = (prof.class_is_conv & (comm > 0)).astype(np.float64)

            def per(values: np.ndarray) -> np.ndarray:
                out = (count @ values).reshape(stages, 2)
                out[:, 1] += count[0::2] @ np.where(again, values, 0.0)
                return out

            saved = both @ np.where(again, 0.0, kept)
            largest = np.where(both > 0, total, 0.0).max(axis=1, initial=0.0)
            send = np.where(last >= 0, first[last], 0.0)  # its last forward result's bytes
            returned = both @ held
            return per(dev), per(host), per(comm), saved, largest, send, per(conv), returned

        return self._cached(("stages", tp, rows, stages, sp, recompute), make)

    def _weights(self, tp: int, sp: bool) -> tuple[np.ndarray, ...]:
        """Per optimizer step (weight): local weight and state bytes, optimizer and
        gradient-sum device and host seconds, and its stage among any stage count."""

        def make() -> tuple[np.ndarray, ...]:
            prof, _ = self._entry(tp, sp)
            plan = prof.plan
            piece_of = {src: p for p, src in plan.source_of.items()}
            # the step's own inputs by name: the plan's ops read its analysed copy's values
            inputs = {v.name for v in self.t.inputs}
            rows = []
            for op in plan.post:
                w = plan.post_keys[op][0]
                dim = _split_dim(plan, piece_of, w)
                share = 1.0 / tp if dim is not None else 1.0
                local = w.type.size_bytes * share
                state = share * sum(v.type.size_bytes for v in op.inputs[2:] if v.name in inputs)
                shapes = []
                for v in (*op.inputs, *op.outputs):
                    shape = list(v.type.shape)
                    if dim is not None and v.type.shape == w.type.shape:
                        shape[dim] = max(1, shape[dim] // tp)
                    shapes.append(tuple(shape))
                types = [v.type for v in (*op.inputs, *op.outputs)]
                opt = self.costs.op(op, shapes, types, len(op.inputs))
                add = self.costs.add(local, w.type.dtype)
                rows.append((local, state, opt[0], opt[1], add[0], add[1]))
            columns = list(zip(*rows)) or [()] * 6  # a step without optimizer steps: none
            return tuple(np.asarray(c, dtype=np.float64) for c in columns)

        return self._cached(("weights", tp, sp), make)

    def _gathers(self, tp: int, stages: int, sp: bool, dp: int) -> np.ndarray:
        """Per stage: the seconds of ZeRO's all-gathers of its updated weights among ``dp``
        replicas, of the weights ``T.megatron`` splits (a dimension ``dp`` divides, other
        than the one tensor parallelism splits; none for a step with experts, whose
        weights split otherwise)."""

        def make() -> np.ndarray:
            plan = self._entry(tp, sp)[0].plan
            where = self._state(tp, stages, sp)[-2]
            if dp == 1 or not len(where) or getattr(plan, "experts", None):
                return np.zeros(stages)
            piece_of = {src: p for p, src in plan.source_of.items()}
            split = []  # (not along the tensor plan's split: _megatron_plan's ZeRO axes)
            for op in plan.post:
                w = plan.post_keys[op][0]
                dim = _split_dim(plan, piece_of, w)
                split.append(any(n % dp == 0 for d, n in enumerate(w.type.shape) if d != dim))
            gather = self._per_weight(tp, sp, dp, 1)[1] * np.asarray(split, dtype=np.float64)
            return np.bincount(where, weights=gather, minlength=stages)

        return self._cached(("gathers", tp, stages, sp, dp), make)

    def _state(self, tp: int, stages: int, sp: bool) -> tuple:
        """Per stage: weight and state bytes, optimizer seconds, the seconds adding one
        microbatch's gradients to the sums, gradients, optimizer and sum host seconds, each
        optimizer step's stage, the largest weight's bytes."""

        def make() -> tuple:
            prof, _ = self._entry(tp, sp)
            weights, state, opt, opt_host, add, add_host = self._weights(tp, sp)
            assignment = prof.assignment(stages)
            where = np.asarray([assignment.get(op, 0) for op in prof.plan.post], dtype=np.int64)

            def per(values: np.ndarray) -> np.ndarray:
                return np.bincount(where, weights=values, minlength=stages)

            count = np.bincount(where, minlength=stages).astype(np.float64)
            largest = np.zeros(stages)
            np.maximum.at(largest, where, weights)
            return (
                per(weights),
                per(state),
                per(opt),
                per(add),
                count,
                per(opt_host),
                per(add_host),
                where,
                largest,
            )

        return self._cached(("state", tp, stages, sp), make)

    def _per_weight(self, tp: int, sp: bool, dp: int, zero: int) -> tuple[np.ndarray, ...]:
        """Per optimizer step (weight): the seconds of its gradient's reduction among
        ``dp`` replicas (an all-reduce, or ZeRO's reduce-scatter) and of ZeRO's all-gather
        of its update (0 without ZeRO)."""

        def make() -> tuple[np.ndarray, np.ndarray]:
            # each distinct size once (a model's layers repeat a few weight shapes)
            sizes, of = np.unique(self._weights(tp, sp)[0], return_inverse=True)
            group = tuple(range(0, dp * tp, tp))
            kind = "reducescatter" if zero else "allreduce"
            reduce = np.asarray([self.costs.collective(kind, g, group) for g in sizes.tolist()])
            gather = np.zeros(len(sizes))
            if zero:
                gather = np.asarray(
                    [self.costs.collective("allgather", g, group) for g in sizes.tolist()]
                )
            return reduce[of], gather[of]

        return self._cached(("per weight", tp, sp, dp, bool(zero)), make)

    def _data(self, tp: int, stages: int, sp: bool, dp: int, zero: int) -> tuple:
        """Per stage: its gradients' reduction among ``dp`` replicas (all-reduces, or
        ZeRO's reduce-scatters), the largest one's seconds (the last is not hidden), and
        ZeRO's all-gathers after the optimizer step."""

        def make() -> tuple:
            where = self._state(tp, stages, sp)[-2]
            if dp == 1 or not len(where):
                return np.zeros(stages), np.zeros(stages), np.zeros(stages)
            reduce, gather = self._per_weight(tp, sp, dp, zero)
            tail = np.zeros(stages)
            np.maximum.at(tail, where, reduce)
            total = np.bincount(where, weights=reduce, minlength=stages)
            return total, tail, np.bincount(where, weights=gather, minlength=stages)

        return self._cached(("data", tp, stages, sp, dp, zero), make)

    # -- strategies -------------------------------------------------------------------------

    def estimate(self, strategies: Sequence[Strategy]) -> Estimates:
        """:class:`Estimates` of ``strategies`` (NaN where not estimable)."""
        n = len(strategies)
        out = [np.full(n, np.nan) for _ in range(5)]
        buckets: dict[tuple[int, int], list[int]] = {}
        for i, s in enumerate(strategies):  # by pipeline shape: one numpy pass each
            if s.ep > 1 or s.cp > 1 or s.zero == 3:
                continue  # no closed form here for experts, contexts or ZeRO-3: simulated
            if self.batch % (s.dp * s.microbatches) == 0:
                buckets.setdefault((s.pp, s.chunks), []).append(i)
        cache, member = self._members, self._member
        refused: dict[int, str] = {}
        for (pp, v), members in buckets.items():
            rows, keep = [], []
            for i in members:
                s = strategies[i]
                sp = s.sequence_parallel and s.tp > 1
                key = (s.tp, self.batch // (s.dp * s.microbatches), pp, v, sp, s.recompute,
                       s.dp, s.zero)  # fmt: skip
                found = cache.get(key)
                if found is None:
                    try:
                        found = member(*key)
                    except RefusedError as e:
                        found = str(e)
                    except (NotEstimableError, DistIRError, ZeroDivisionError, KeyError):
                        found = ()
                    cache[key] = found
                if found.__class__ is str:
                    refused[i] = found
                elif found:
                    rows.append((*found, s.dp, s.microbatches, s.zero, s.schedule == "gpipe"))
                    keep.append(i)
            if rows:
                for column, values in zip(out, self._bucket(pp, v, rows)):
                    column[keep] = values
        step, peak, bubble, exposed, busy = out
        return Estimates(step, peak, bubble, exposed, busy, ~np.isnan(step), refused)

    def _member(
        self, tp: int, rows: int, pp: int, v: int, sp: bool, rc: bool, dp: int, zero: int
    ) -> tuple:
        """The per-rank figures of the strategies of one degree, rows, pipeline shape,
        switches and data-parallel degree (the schedule and microbatches aside)."""
        ranked = self._ranked(tp, rows, pp, v, sp, rc)
        return (
            ranked,
            self._ranked_data(tp, pp, v, sp, dp, zero),
            self._send(tp, rows, pp, v, sp, rc, dp),
        )

    def _ranked(self, tp: int, rows: int, pp: int, v: int, sp: bool, recompute: bool):
        """Per pipeline rank (columns): forward and backward seconds of a microbatch, the
        gradient sums', optimizer, weight and state bytes, kept activation bytes, largest
        op bytes, the transfers it takes part in per microbatch, gradients, compute and
        collective seconds per microbatch, the optimizer's host seconds, the bytes a
        microbatch leaves returned to the step's end (rows, in that order); then the
        largest op's bytes, the largest weight's, and whether its host is slower than its
        device."""

        def make() -> np.ndarray:
            stages = pp * v
            dev, host, comm, saved, largest, _, conv, returned = self._stages(
                tp, rows, stages, sp, recompute
            )
            weights, state, optimizer, summing, count, opt_host, sum_host, _, grad = self._state(
                tp, stages, sp
            )
            issue = self.costs.device.host_comm_s()  # the host's time to issue one transfer
            host = host + conv * issue
            # a stage's time: its device's ops and the collectives between them, or its
            # host's issue where that is longer (the host runs ahead of the device through
            # the collectives, as the simulator's does, so the two overlap: the device
            # waits for the host only where the host is the slower of the two)
            work = np.maximum(dev + comm, host)
            # the transfers a stage takes part in per microbatch: its input in and its
            # result out, its gradient in and out (none before the first, after the last)
            stage = np.arange(stages)
            sends = 2.0 * np.minimum(stage, 1) + 2.0 * np.minimum(stages - 1 - stage, 1)
            per_stage = np.stack(
                [
                    work[:, 0],
                    work[:, 1],
                    summing,
                    optimizer,
                    weights,
                    state,
                    saved / v,
                    sends,
                    count,
                    dev.sum(axis=1),
                    comm.sum(axis=1),
                    opt_host,
                    returned,
                ]
            )
            ranked = per_stage.reshape(len(per_stage), v, pp).sum(axis=1)  # stage s: rank s % pp
            big = largest.reshape(v, pp).max(axis=0)
            grad_big = grad.reshape(v, pp).max(axis=0)
            bound = (host.sum(axis=1) + sum_host).reshape(v, pp).sum(axis=0) > ranked[9]
            return np.vstack([ranked, big[None, :], grad_big[None, :], bound[None, :]])

        return self._cached(("ranked", tp, rows, pp, v, sp, recompute), make)

    def _ranked_data(self, tp: int, pp: int, v: int, sp: bool, dp: int, zero: int):
        def make() -> np.ndarray:
            total, tail, gather = self._data(tp, pp * v, sp, dp, zero)
            return np.stack([x.reshape(v, pp).sum(axis=0) for x in (total, tail, gather)])

        return self._cached(("ranked data", tp, pp, v, sp, dp, zero), make)

    # -- a floor no simulation goes below ---------------------------------------------------

    def bound_s(self, s: Strategy) -> float:
        """A step time the simulation of ``s`` cannot beat (0.0 where not estimable).

        Unlike the estimate, which composes a schedule, this is a longest path: each
        device's compute stream runs its ops one at a time in program order, and an op
        waits for its inputs, so every microbatch's forward or backward on a stage takes
        at least the longest chain, in its own records' order, from its first compute op
        to its last (:meth:`_chains`: the ops' times and the tensor-parallel collectives
        the chain waits for, from the cost and collective models the simulator reads;
        a backward between the first microbatch's and the last's also adds its gradients
        to their sums, :meth:`_sums`). A rank's stream holds ``m`` of each of its
        stages' tasks, the gradient sums and the optimizer step; before its first task
        the first microbatch's forward crosses the stages before it (the fill), and
        after its last the last backward crosses them back (the drain); each gradient's
        data-parallel reduction starts no sooner than the last backward makes it
        (:func:`_scheduled`). The hosts, contention and everything else the simulator
        adds only make the step longer. The two-tier
        search uses it beside the margin-widened estimate (``ir.search.tiers``): where
        the tensor-parallel collectives are much of the step, the estimate's margin
        allows steps the chain rules out."""
        if s.ep > 1 or s.cp > 1 or s.zero == 3 or self.batch % (s.dp * s.microbatches):
            return 0.0
        sp = s.sequence_parallel and s.tp > 1
        rows, pp, v, m = self.batch // (s.dp * s.microbatches), s.pp, s.chunks, s.microbatches
        try:
            chains = self._chains(s.tp, rows, pp * v, sp, s.recompute)
            ranked = self._ranked(s.tp, rows, pp, v, sp, s.recompute)
        except (NotEstimableError, DistIRError, ZeroDivisionError, KeyError):
            return 0.0
        span_f, span_b, out_f, out_b, on_f, on_b, _, end_b = chains[:8]
        # a microbatch between the first and the last adds its gradients to their sums in
        # the bodies that make them (the last ends a body at each gradient, so that its
        # reduction starts: its sums are left out, as ZeRO-2's, which come after those)
        summing = chains[10:14] if s.zero < 2 and m > 2 else None
        send, syncs = np.zeros((2, pp * v)), False
        if pp > 1:  # every stage's neighbours on other ranks (``dp tp`` devices on)
            pair = (0, s.dp * s.tp)
            send = np.vectorize(lambda x: self.costs.collective("send", x, pair))(chains[8:10])
            syncs = self.costs.device.syncs_after_p2p
        acc = ranked[2] / (s.dp if s.zero == 2 and m > 1 else 1)
        opt = ranked[3] / (s.dp if s.zero else 1)
        jobs, gathers = None, None
        if s.dp > 1:  # the gradients' reductions; ZeRO's all-gathers after the optimizer
            try:
                # each gradient's reduction, released when the last backward makes it
                where = self._state(s.tp, pp * v, sp)[-2]
                steps = self._weights(s.tp, sp)[2] / (s.dp if s.zero else 1)
                reduce = self._per_weight(s.tp, sp, s.dp, s.zero)[0]
                jobs = (where, chains[14], reduce, steps)
                if s.zero:
                    gathers = self._gathers(s.tp, pp * v, sp, s.dp).reshape(v, pp).sum(axis=0)
            except (NotEstimableError, DistIRError, ZeroDivisionError, KeyError):
                return 0.0
        middle = span_b if summing is None else summing[0]
        tasks = m * span_f + min(m, 2) * span_b + max(m - 2, 0) * middle
        spans = tasks.reshape(v, pp).sum(axis=0)  # stage c pp + r: rank r
        # the compute alone, every gradient sum counted (on the chains or beside them)
        busy = m * ranked[9] + (m - 1) * acc
        best = _scheduled(
            s.schedule, pp, v, m, chains[:8], opt, send, syncs, jobs, gathers, summing
        )
        if gathers is not None:
            opt = np.maximum(opt, gathers)  # (after every task, one at a time)
        for r in range(pp):
            # the first microbatch's forward through chunk 0's stages before rank r
            fill = out_f[0] + float(on_f[1:r].sum()) if r else 0.0
            best = max(best, fill + max(spans[r], busy[r]) + opt[r])
            if r:  # its last backward (chunk 0's) back through them
                last = spans[r] - span_b[r] + out_b[r]
                best = max(best, fill + last + float(on_b[1:r].sum()) + end_b[0])
        return float(best) * (1 - BOUND_SLACK)

    def peak_floor_bytes(self, s: Strategy) -> float:
        """Bytes the simulation of ``s`` holds at least at once on its fullest device (0.0
        where not estimable): the search skips a strategy whose floor is over the
        devices, where the estimate less its margin is not.

        Unlike the estimate's peak, only what the simulator's liveness (``ir.sim.memory``)
        must hold at once, walked in each rank's task order (``T.megatron``'s, as
        :func:`_scheduled`): the step's inputs (weights, optimizer state: ZeRO's share)
        all step; after each task, the values a forward made that a backward on the same
        stage reads (:meth:`_kept_here`: not what recomputation replays) until that
        backward, what the step returns from then on, and from a stage's first backward
        its gradients (their sum, ZeRO-2's reduced part) until the optimizer step; at the
        end the step's results beside its inputs. No op's temporaries, no transfer
        buffers, nothing a stage receives: the simulation only adds to it."""
        if s.ep > 1 or s.cp > 1 or s.zero == 3 or self.batch % (s.dp * s.microbatches):
            return 0.0
        from ..transforms.pipeline import device_groups

        sp = s.sequence_parallel and s.tp > 1
        rows, pp, v, m = self.batch // (s.dp * s.microbatches), s.pp, s.chunks, s.microbatches
        try:
            kept, held_f, held_b = self._kept_here(s.tp, rows, pp * v, sp, s.recompute)
            weights, state = self._state(s.tp, pp * v, sp)[:2]
        except (NotEstimableError, DistIRError, ZeroDivisionError, KeyError):
            return 0.0
        state = state / (s.dp if s.zero else 1)
        grads = weights / (s.dp if s.zero == 2 else 1)
        best = 0.0
        for r in range(pp):
            own = np.arange(v) * pp + r  # rank r's stages
            base = float(weights[own].sum() + state[own].sum())
            live, top, summed = base, base, set()
            for group in device_groups(s.schedule, r, pp, v, m, True):
                for st, _, phase in group:
                    if phase == "F":
                        live += kept[st] + held_f[st]
                    else:
                        live += held_b[st] - kept[st]
                        if st not in summed:
                            summed.add(st)
                            live += grads[st]
                    top = max(top, live)
            returned = float(held_f[own].sum() + held_b[own].sum())
            best = max(best, top, 2 * base + m * returned)
        return best * (1 - BOUND_SLACK)

    def _kept_here(self, tp: int, rows: int, stages: int, sp: bool, recompute: bool) -> tuple:
        """Per stage: the bytes of one microbatch's forward results that a backward on the
        same stage reads (kept on its devices until then; not replayed by recomputation,
        not returned; with sequence parallelism the token slices the backward gathers
        again, where the op reading the gathered value is on their stage), and the bytes
        the step returns from a microbatch's forward and from its backward."""

        def make() -> tuple:
            prof, _ = self._entry(tp, sp)
            again = self._records(tp, rows, sp, recompute)[2]
            sizes = self._sizes(tp, rows, sp)
            records, phase, stage = prof.records, prof.phase, prof.stage_of(stages)
            back: dict[str, set[int]] = {}  # name -> the stages whose backward reads it
            forward: dict[str, set[int]] = {}  # name -> the stages whose forward ops read it
            for i, rec in enumerate(records):
                if rec.op is not None:
                    into = back if phase[i] else forward
                    for n in rec.reads:
                        into.setdefault(n, set()).add(int(stage[i]))
            for i, rec in enumerate(records):  # the token slices gathered again
                if rec.op is None and not phase[i] and rec.reads[0] in prof.regathered:
                    for st in forward.get(rec.converted or "", ()):
                        back.setdefault(rec.reads[0], set()).add(st)
            kept, held_f, held_b = np.zeros(stages), np.zeros(stages), np.zeros(stages)
            for i, rec in enumerate(records):
                if rec.op is None:
                    continue
                k, st = prof.class_of[i], int(stage[i])
                for w, size, out in zip(rec.writes, sizes[k], prof.returned[k]):
                    if out:
                        (held_b if phase[i] else held_f)[st] += size
                    elif not phase[i] and not again[i] and st in back.get(w, ()):
                        kept[st] += size
            return kept, held_f, held_b

        return self._cached(("kept here", tp, rows, stages, sp, recompute), make)

    def _sizes(self, tp: int, rows: int, sp: bool) -> list[list[float]]:
        """Per record class at (degree, rows): its results' bytes (a conversion's: the
        tensor it converts)."""

        def make() -> list[list[float]]:
            prof, tp_ref = self._entry(tp, sp)
            rows_ratio, split_ratio = rows / (self.batch // prof.pieces), tp_ref / tp
            out = []
            for rec, _, _ in prof.classes:
                shapes = rec.shapes(rows_ratio, split_ratio)
                sizes = [_bytes(x, y) for x, y in zip(shapes, rec.types)]
                out.append(sizes if rec.op is None else sizes[rec.n_in :])
            return out

        return self._cached(("sizes", tp, rows, sp), make)

    def _chains(self, tp: int, rows: int, stages: int, sp: bool, recompute: bool) -> tuple:
        """Per stage, the longest chains of one microbatch's forward and backward (a
        recomputed backward replays its forward first), each walked in record order with
        the device's compute one op at a time: from the first compute op to the last
        (``span``) and to the first value the next stage reads (``out``: the activation,
        the backward's gradient); and from that value's arrival from the neighbour to the
        first value its own next reads (``on``) and to its last op (``end``): rows span,
        out, on and end, each forward then backward; then the least bytes of what arrives
        from the neighbour, forward then backward; then the backward's span, out, on and
        end again as a microbatch runs it that adds its gradients to their sums (all but
        the first; see :meth:`_sums`); and per optimizer step, how long after its
        stage's backward starts its gradient is made at the earliest."""

        def make() -> tuple:
            prof, _ = self._entry(tp, sp)
            dev, comm, again = self._records(tp, rows, sp, recompute)
            records, phase, stage = prof.records, prof.phase, prof.stage_of(stages)
            conv = prof.is_conv
            made: dict[tuple[str, int], int] = {}  # (name, phase) -> its stage
            read: dict[tuple[int, int], set[str]] = {}  # (stage, phase) -> names read
            tasks: list[list[int]] = [[] for _ in range(2 * stages)]
            for i, rec in enumerate(records):
                key = (int(stage[i]), int(phase[i]))
                tasks[2 * key[0] + key[1]].append(i)
                read.setdefault(key, set()).update(rec.reads)
                for w in (*rec.writes, rec.converted):
                    made.setdefault((w, key[1]), key[0])
            own = [tasks[2 * st + 1] for st in range(stages)]  # the backward's own records
            for st in range(stages):  # a recomputed backward replays its forward first
                tasks[2 * st + 1] = [i for i in tasks[2 * st] if again[i]] + own[st]
            sizes = self._sizes(tp, rows, sp)
            size = {
                w: x
                for i, rec in enumerate(records)
                if rec.op is not None
                for w, x in zip(rec.writes, sizes[prof.class_of[i]])
            }
            sums = self._sums(tp, sp)
            out = np.zeros((14, stages))
            made_at: dict[str, tuple[int, float]] = {}  # a backward's values: stage, from its start
            for st in range(stages):
                for ph, step in ((0, -1), (1, 1)):  # the neighbour it receives from
                    task = tasks[2 * st + ph]
                    arrive = {n for n in read.get((st, ph), ()) if made.get((n, ph)) == st + step}
                    # the least bytes of what arrives (0 if any is not an op's result)
                    out[8 + ph, st] = min((size.get(n, 0.0) for n in arrive), default=0.0)
                    sent = {n for n in read.get((st - step, ph), ()) if made.get((n, ph)) == st}
                    # rows of span, out, on, end; the backward again with the gradient sums
                    ways = [((ph, 2 + ph, 4 + ph, 6 + ph), None)]
                    if ph:
                        ways.append(((10, 11, 12, 13), sums))
                    for (span, first, on, end), add in ways:
                        out[span, st], ready = _walk(task, records, conv, dev, comm, 0.0, (), add)
                        out[first, st] = _first(ready, sent)
                        if ph and add is None:  # (the replays run layer by layer: none)
                            if len(own[st]) < len(task):
                                ready = _walk(own[st], records, conv, dev, comm, 0.0, ())[1]
                            made_at.update((n, (st, x)) for n, x in ready.items())
                        if arrive:
                            last, ready = _walk(task, records, conv, dev, comm, _NEVER, arrive, add)
                            out[on, st] = _first(ready, sent)
                            out[end, st] = max(last, 0.0)
            # each optimizer step's gradient: made no sooner after its backward starts (0
            # where another stage makes it: a weight two stages read, tied)
            grads = [op.inputs[1].name for op in prof.plan.post]
            where = self._state(tp, stages, sp)[-2]
            offsets = [
                max(made_at[g][1], 0.0) if g in made_at and made_at[g][0] == at else 0.0
                for g, at in zip(grads, where.tolist(), strict=True)
            ]
            return (*out, np.asarray(offsets))

        return self._cached(("chains", tp, rows, stages, sp, recompute), make)

    def _sums(self, tp: int, sp: bool) -> np.ndarray:
        """Per record: the seconds of adding a microbatch's gradients that it makes to
        their sums, where ``T.megatron`` adds them in the pmap body of the run that makes
        them (``_walk``): a weight's final gradient that a backward op makes and nothing
        else reads (not a partial gradient summed or converted first, such as a layer
        norm's under sequence parallelism: its sum comes later, and is left out, which
        only shortens the chain)."""

        def make() -> np.ndarray:
            prof, _ = self._entry(tp, sp)
            records, phase = prof.records, prof.phase
            read = {n for rec in records for n in rec.reads}
            writer: dict[str, int] = {}
            for i, rec in enumerate(records):
                if phase[i] == 1 and not prof.is_conv[i]:
                    for w in rec.writes:
                        writer.setdefault(w, i)
            add = self._weights(tp, sp)[4]
            sums = np.zeros(len(records))
            for k, op in enumerate(prof.plan.post):
                g = op.inputs[1].name  # (an optimizer's operand 1: the gradient)
                if g in writer and g not in read:
                    sums[writer[g]] += add[k]
            return sums

        return self._cached(("sums", tp, sp), make)

    def _send(self, tp: int, rows: int, pp: int, v: int, sp: bool, rc: bool, dp: int) -> float:
        """Seconds of one activation crossing a stage boundary (to the next stage's devices)."""
        if pp * v == 1:
            return 0.0

        def make() -> float:
            send = self._stages(tp, rows, pp * v, sp, rc)[5]
            return self.costs.collective("send", float(send.max()), (0, dp * tp))

        return self._cached(("send", tp, rows, pp, v, sp, rc, dp), make)

    def _exchanges(
        self, pp: int, v: int, m: np.ndarray, sends: np.ndarray, send: np.ndarray
    ) -> np.ndarray:
        """Per strategy and rank, the seconds a microbatch spends in the exchanges with the
        neighbouring ranks where the hosts synchronise after transfers (Megatron-LM's
        ``batch_isend_irecv``, then ``torch.cuda.synchronize``): an exchange holds both
        sides until its transfers are done (one send's time: they run together), then the
        host issues the next task's first op. Exchanges come between tasks
        (``ir.transforms.pipeline.device_groups``): after every task, with two transfers
        (``sends / 2`` a microbatch), but for the interleaved steady state, one after each
        forward-backward pair (``v`` a microbatch); its ``2 (pp - rank - 1) + (v - 1) pp``
        warm-up forwards and as many backwards exchange alone."""
        col = (slice(None), None)
        if v > 1:
            rank = np.arange(pp)[None, :]
            warm = np.minimum(2 * (pp - rank - 1) + (v - 1) * pp, (v * m)[col])
            count = v + warm / m[col]
        else:
            count = sends / 2
        return count * (send[col] + self.costs.device.host_comm_s())

    def _bucket(self, pp: int, v: int, members: list[tuple]) -> tuple[np.ndarray, ...]:
        """The estimates of strategies of one pipeline shape (``pp`` ranks, ``v`` chunks)."""
        ranked = np.stack([x[0] for x in members])  # (k, quantity, rank)
        data = np.stack([x[1] for x in members])
        send = np.asarray([x[2] for x in members])
        dp = np.asarray([x[3] for x in members], dtype=np.float64)
        m = np.asarray([x[4] for x in members], dtype=np.float64)
        zero = np.asarray([x[5] for x in members])
        gpipe = np.asarray([x[6] for x in members])
        f, b, acc, opt, w, st, acts, sends, n_grads, busy_one, comm_one, opt_host, held = (
            ranked[:, i, :] for i in range(13)
        )
        big, grad_big, host_bound = ranked[:, 13, :], ranked[:, 14, :], ranked[:, 15, :]
        total, tail, gather = data[:, 0, :], data[:, 1, :], data[:, 2, :]
        device = self.costs.device
        col = (slice(None), None)
        # ZeRO-2 with microbatches: each microbatch's gradients reduce-scattered as made
        # (ir.transforms.megatron), its sum waiting for them: behind every backward but the
        # first microbatch's, the reductions at the end done already
        scattered = (zero == 2) & (m > 1)
        acc = acc / np.where(scattered, dp, 1.0)[col]  # ZeRO-2 sums each microbatch's part
        issue = device.host_comm_s()
        per_mb = np.where(scattered[col], total + host_bound * n_grads * issue, 0.0)
        # the pipeline: per microbatch each rank's forward and backward (and the sums)
        b_m = b + (acc + per_mb) * ((m - 1) / m)[col]
        cycle = f + b_m
        boundaries = 2 * (pp - 1) * send  # filling and draining: the ranks' boundaries
        if device.syncs_after_p2p and pp > 1:  # the exchanges hold the ranks (their sends)
            cycle = cycle + self._exchanges(pp, v, m, sends, send)
            boundaries = 0.0
        top = cycle.max(axis=1)
        if v > 1:
            # 1F1B's fill and drain (each rank's cycle once, the slowest the rest) with
            # chunks 1/v of a cycle: m top + (pp - 1) top / v where the ranks are alike,
            # and a last rank with the loss no longer counted at every rank's fill
            pipe = cycle.sum(axis=1) / v + (m - 1 / v) * top + boundaries
        else:
            pipe = cycle.sum(axis=1) + (m - 1) * top + boundaries
        # data parallelism: reductions behind the last microbatch's backward (with its
        # gradient sums): exposed, what they outlast it by, at least the last one (and
        # ZeRO's all-gathers), then the optimizer step
        last = b + np.where(m > 1, 1.0, 0.0)[col] * acc
        exposed = np.where(scattered[col], gather, np.maximum(total - last, tail) + gather)
        opt_m = opt / np.where(zero > 0, dp, 1.0)[col]
        reducing = np.where(dp > 1, np.where(zero > 0, 2.0, 1.0), 0.0)[col] * n_grads
        reducing = np.where(scattered[col], n_grads, reducing)  # ZeRO-2: the all-gathers
        # a host slower than its device issues its reductions within the last backward,
        # which the ranks before it wait for (the drain); a faster one while it runs
        pipe = pipe + (reducing * issue * host_bound).sum(axis=1)
        issued = reducing * issue * (1 - host_bound) + opt_host  # the host's share of the end
        # each weight's optimizer step runs once its reduction is done, in the order the
        # reductions finish: behind the exposed reductions only the last one's (at most
        # the largest weight's share of the optimizer's time)
        opt_tail = opt_m * np.divide(grad_big, w, out=np.zeros_like(w), where=w > 0)
        end = np.where(exposed > 0, np.maximum(exposed + opt_tail, opt_m), opt_m)
        step = (pipe[col] + np.maximum(end, issued)).max(axis=1)
        # memory per rank: weights, gradient sums, optimizer state, activations in flight
        ranks = np.arange(pp)[None, :]
        flight = np.where(gpipe[col], m[col], np.minimum(m[col], pp - ranks))
        if v > 1:
            # Megatron-LM's interleaved 1F1B (ir.transforms.pipeline): 2 (pp - rank - 1)
            # + (v - 1) pp warm-up chunk forwards, then one more before the first backward
            flight = np.minimum(m[col] * v, 2 * (pp - ranks - 1) + (v - 1) * pp + 1)
        st_m = st / np.where(zero > 0, dp, 1.0)[col]
        g_m = w / np.where(zero == 2, dp, 1.0)[col]
        # the gradient sums beside the activations in flight, and what the step returns of
        # each microbatch (its logits), kept to its end. After the warm-up each backward
        # is followed by a forward (the flight stays full) until the forwards run out
        # (GPipe: at once); a chunk's sums exist from its first backward on, the chunks'
        # first backwards ``pp`` apart from the last chunk back (Megatron-LM's order,
        # ir.transforms.pipeline): the peak is the warm-up's or the moment the c-th
        # chunk's sums appear, whichever holds more
        held_m = held * m[col]
        sums = g_m * (m > 1)[col]
        steady = m[col] * v - flight  # backwards followed by a forward
        in_flight = acts * flight
        for c in range(1, v + 1):
            k = (c - 1) * pp + 1  # backwards done when the c-th chunk's sums appear
            left = np.maximum(flight - np.maximum(k - steady, 0), 0)
            in_flight = np.maximum(in_flight, sums * (c / v) + acts * left)
        during = w + st_m + in_flight + big + held_m
        # at the optimizer step the updated weights and state beside the old (the step's
        # inputs and results, both live to its end) and, as each weight's update frees
        # its gradient sum, at the last update the largest one (ZeRO: its reduced part)
        after = 2 * (w + st_m) + grad_big * np.where(zero > 0, 1.0 / dp, 1.0)[col] + held_m
        peak = np.maximum(during, after).max(axis=1)
        busy = m[col] * busy_one + (m - 1)[col] * acc + opt_m  # the ops and the sums
        bubble = np.mean(np.maximum(step[col] - busy, 0.0), axis=1) / step
        exposed_comm = m * comm_one.mean(axis=1) + exposed.mean(axis=1)
        return step, peak, bubble, exposed_comm, busy.max(axis=1)


def _split_dim(plan: Any, piece_of: dict, w: Any) -> int | None:
    """The dimension of weight ``w`` (an input of the analysed step) that the tensor plan
    splits, or None."""
    p = piece_of.get(w)
    split = plan.hplan.state.get(p) if p is not None else None
    return split.dim if split is not None and split.kind == "S" else None


def _scheduled(
    schedule: str,
    pp: int,
    v: int,
    m: int,
    chains: tuple,
    opt: np.ndarray,
    send: np.ndarray | None = None,
    syncs: bool = False,
    jobs: tuple | None = None,
    gathers: np.ndarray | None = None,
    summing: tuple | None = None,
) -> float:
    """The pipeline's tasks in each rank's order (``T.megatron``'s, from
    ``ir.transforms.pipeline.device_groups``), each at least its chains long
    (:meth:`Estimator._chains`): a task starts when its rank's previous one has ended,
    its last compute op ends at least ``span`` after its start and ``end`` after its input
    arrives, and the value the next stage reads is made at least ``out`` after its start
    and ``on`` after that arrival. ``send[phase, stage]``: the least seconds of a transfer
    into ``stage`` in that phase (forward, backward; none: transfers take no time): an
    input arrives that long after it is made; where the hosts synchronise after
    transfers (``syncs``), a rank's next group of tasks also starts no sooner than the
    transfers out of its last group end (``ir.transforms.pipeline.run_exchanges``: an
    exchange between groups). The last task's end and its rank's optimizer step; 0.0
    for a schedule whose tasks cannot all be placed. ``jobs``: the data-parallel
    reductions of the gradients, as arrays (each one's stage, how long after its
    stage's last backward starts its gradient is made at the earliest, the reduction's
    seconds, its optimizer step's seconds): each released when its gradient is made, one
    at a time on its rank's one communicator (its replicas' group), and the rank's step
    ends no sooner than one optimizer step after the last is done (each step reads its
    reduced gradient); ``gathers[rank]``: ZeRO's all-gathers of the updated weights on
    it, after those reductions and after the rank's last task and an optimizer step (the
    optimizer steps follow every task). ``summing``: the backward's span, out, on and
    end for the microbatches between the first and the last (those add their gradients
    to the sums on their chains)."""
    from ..transforms.pipeline import device_groups

    span_f, span_b, out_f, out_b, on_f, on_b, end_f, end_b = chains
    stages = pp * v
    if send is None:
        send = np.zeros((2, stages))
    made: dict[tuple[int, int, str], float] = {}  # task -> its value for the next made
    order, last = [], []  # each rank's tasks, and whether each ends its group
    for d in range(pp):
        groups = device_groups(schedule, d, pp, v, m, True)
        order.append([task for group in groups for task in group])
        last.append([i == len(group) - 1 for group in groups for i in range(len(group))])

    def received(task: tuple[int, int, str]) -> tuple | None:
        """The neighbour's task whose value ``task`` receives, and the transfer's seconds."""
        st, mb, phase = task
        if phase == "F":
            return ((st - 1, mb, "F"), send[0, st]) if st else None
        return ((st + 1, mb, "B"), send[1, st]) if st < stages - 1 else None

    # where the hosts synchronise after transfers, a group starts once every transfer into
    # it is done (the exchange before it carries them all, and returns once all are):
    # per rank and task, those of the group it opens (None for a task within a group)
    opens: list[list[list | None]] = []
    for d in range(pp if syncs else 0):
        opens.append([])
        for i in range(len(order[d])):
            if i and not last[d][i - 1]:
                opens[d].append(None)
                continue
            group = order[d][i : last[d].index(True, i) + 1]
            opens[d].append([x for x in map(received, group) if x is not None])
    at, free, left = [0] * pp, [0.0] * pp, sum(map(len, order))
    held = [0.0] * pp  # a synchronising host's wait for its group's transfers out
    began: dict[int, float] = {}  # stage -> when its last backward starts
    while left:
        moved = False
        for d in range(pp):
            tasks = order[d]
            while at[d] < len(tasks):
                st, mb, phase = tasks[at[d]]
                gate = free[d]
                if syncs and opens[d][at[d]]:
                    arrivals = [made.get(x) for x, _ in opens[d][at[d]]]
                    if None in arrivals:
                        break  # a transfer into its group is from a task still to place
                    for arrival, (_, delay) in zip(arrivals, opens[d][at[d]], strict=True):
                        gate = max(gate, arrival + delay)
                if phase == "F":
                    span, out, on, end = span_f[st], out_f[st], on_f[st], end_f[st]
                    into = st + 1 < stages and send[0, st + 1]  # its result's transfer
                else:  # the last stage's backward starts from its own forward (its rank's)
                    if summing is not None and 0 < mb < m - 1:
                        span, out, on, end = (x[st] for x in summing)
                    else:
                        span, out, on, end = span_b[st], out_b[st], on_b[st], end_b[st]
                    into = st > 0 and send[1, st - 1]
                start = gate
                finish, value = start + span, start + out
                got = received(tasks[at[d]])
                if got is not None:
                    arrival = made.get(got[0])
                    if arrival is None:
                        break  # its input is another rank's still to place
                    arrival += got[1]
                    finish, value = max(finish, arrival + end), max(value, arrival + on)
                    if syncs:  # received in the exchange before its group, then waited for
                        finish, value = max(finish, arrival + span), max(value, arrival + out)
                made[(st, mb, phase)] = value
                if phase == "B":
                    began[st] = start  # (its last backward's, once all are placed)
                free[d] = finish
                if syncs and into:
                    held[d] = max(held[d], value + into)
                if last[d][at[d]]:  # the exchange: the host waits for its transfers
                    free[d] = max(free[d], held[d])
                at[d] += 1
                left -= 1
                moved = True
        if not moved:
            return 0.0
    ends = []
    for d in range(pp):
        end = free[d] + opt[d]
        if jobs is not None:
            stage, made_s, seconds, steps = jobs
            mine = stage % pp == d
            if mine.any():
                at_s = np.asarray([began.get(st, 0.0) for st in stage[mine].tolist()])
                done = _released(at_s + made_s[mine], seconds[mine])
                least = float(steps[mine].min())
                end = max(end, done + least)
                if gathers is not None:
                    end = max(end, max(free[d] + least, done) + gathers[d])
        ends.append(end)
    return float(max(ends))


def _released(at_s: np.ndarray, seconds: np.ndarray) -> float:
    """When jobs released at ``at_s`` and run one at a time on one channel (in any order)
    are done at the earliest: no sooner than any release plus everything released at or
    after it."""
    if not len(at_s):
        return 0.0
    order = np.argsort(-at_s, kind="stable")
    return float(np.max(at_s[order] + np.cumsum(seconds[order])))


def _walk(
    task: list[int],
    records: list,
    conv: np.ndarray,
    dev: np.ndarray,
    comm: np.ndarray,
    start: float,
    arrived: set[str] | tuple,
    sums: np.ndarray | None = None,
) -> tuple[float, dict[str, float]]:
    """One task's records in order, the compute one op at a time from ``start``, a
    collective after its operand, the values ``arrived`` ready at 0 and every other input
    from outside the task at any time before (``-inf``): the last compute op's end, and
    when each value is ready. ``sums[i]``: the seconds of the gradient sums that follow
    record ``i``'s in its run (``T.megatron`` adds a microbatch's gradients to their sums
    at the end of the pmap body that makes them: a run of compute records, which a
    conversion ends), on the same stream after the run's last op. (The transform also
    ends a body where sequence parallelism gathers a forward value again, which is no
    record: a sum walked later than it runs crosses no wait here, since the walk waits
    only at conversions and arrivals, and a gradient is made after its stage's arrival
    is read; so the walk's end is the same and its values no later.)"""
    ready = dict.fromkeys(arrived, 0.0)
    free = start
    pending = 0.0  # the sums the run so far has made
    for i in task:
        rec = records[i]
        t = max([ready.get(n, _NEVER) for n in rec.reads], default=_NEVER)
        if conv[i]:  # a collective: the converted value once its operand is
            ready[rec.converted] = t + comm[i]
            free, pending = free + pending, 0.0  # (the run before it ends with its sums)
            continue
        free = max(free, t) + dev[i]
        for w in rec.writes:
            ready[w] = free
        if sums is not None:
            pending += sums[i]
    return free + pending, ready


def _first(ready: dict[str, float], names: set[str]) -> float:
    """The first of ``names`` ready (0.0 if none is, or none is known)."""
    times = [ready[n] for n in names if n in ready]
    return max(min(times), 0.0) if times else 0.0


def _bytes(shape: tuple[int, ...], t: object) -> float:
    n = 1
    for d in shape:
        n *= d
    return float(n * t.dtype.itemsize_bytes)
