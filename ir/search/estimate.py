"""The search's first tier: a closed-form estimate of every strategy's step time and peak
memory (:class:`Estimator`), fast enough for spaces of millions of points.

Per (degree, rows per microbatch, stages) the per-device times of a microbatch's
forward and backward on each stage come from a :class:`~ir.search.profile.Profile` (the
transform's own analysis, scaled; op times from the device's cost and kernel models,
collectives from the topology's collective model: what the simulator reads). A strategy
then composes them in closed form:

* pipeline: ``sum over ranks of (f + b) + (m - 1) * max over ranks of (f + b)`` (GPipe and
  1F1B share the bubble; interleaving divides it by the chunks), plus two sends per
  stage boundary on the first microbatch's path; a rank's compute is at least its host's
  issue time;
* data parallelism: each rank's gradient all-reduces (ZeRO: reduce-scatters, then the
  updated weights all-gathered) overlap the last microbatch's backward, the rest and the
  optimizer step exposed;
* recomputation replays the forward ops ``T.recompute`` replays, in the backward, and
  keeps their results out of the saved activations;
* memory: weights, their gradient sums and optimizer state (ZeRO splits the state, and
  with stage 2 the gradients), the activations a microbatch saves for its backward times
  the microbatches in flight (1F1B: the ranks after it, at most ``m``; GPipe: ``m``), and
  the largest op's operands.

What it leaves out (link contention between channels, the exact overlap of transfers
with compute, the allocator's order) is what the event simulation adds; the search
simulates every strategy whose estimate can reach the front within :data:`TIME_MARGIN`
and :data:`MEMORY_MARGIN`, the estimator's largest errors against the simulator as
``tests/search/test_estimate.py`` measures them on every strategy of small spaces.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..device import Topology
from ..errors import DistIRError
from ..function import Function
from .profile import Costs, NotEstimableError, Profile, replayed_names
from .space import Strategy

#: The estimator's relative error bounds against the simulator (step time, peak memory),
#: measured on every strategy of the spaces of tests/search/test_estimate.py (largest
#: errors seen there: see that file) with room to spare; the search widens them when a
#: simulated strategy shows a larger error (ir.search.two_tier).
TIME_MARGIN = 0.5
MEMORY_MARGIN = 0.45


@dataclass(frozen=True)
class Estimates:
    """Per strategy (in the order asked): estimated step time, peak bytes of the fullest
    device, mean bubble and exposed communication; ``known`` is False where the estimator
    cannot scale the step (the simulator decides those)."""

    step_time_s: np.ndarray
    peak_memory_bytes: np.ndarray
    bubble: np.ndarray
    exposed_comm_s: np.ndarray
    known: np.ndarray


class Estimator:
    """Closed-form step time and memory of ``t``'s strategies on ``topology``.

    Built once per search: it analyses the step at two microbatch sizes and, for tensor
    parallelism, at two degrees (and with sequence parallelism if the space has it);
    :meth:`estimate` then costs any list of strategies, a group of strategies that share
    a degree, microbatch size and pipeline at a time, with numpy."""

    def __init__(
        self, t: Function, topology: Topology, batch: int, strategies: Sequence[Strategy]
    ) -> None:
        self.t, self.topology, self.batch = t, topology, batch
        self.costs = Costs(topology)
        # two pieces at least: with one, the data plan has no gradient sum (no optimizer
        # steps after it to read the weights from)
        self.pieces = next((k for k in (2, 4, 8) if batch % (2 * k) == 0), None)
        self._profiles: dict[tuple[int, bool], tuple[Profile, int] | None] = {}
        replayed = replayed_names(t) if any(s.recompute for s in strategies) else set()
        self._cache: dict[tuple, Any] = {}
        tps = {s.tp for s in strategies}
        wide = sorted(k for k in tps if k > 1)
        for sp in sorted({s.sequence_parallel and s.tp > 1 for s in strategies}):
            for tp in ([1] if 1 in tps and not sp else []) + wide[:1]:
                self._profile(tp, sp, len(wide) > 1, replayed)

    def _profile(self, tp: int, sp: bool, bigger: bool, replayed: set[str]) -> None:
        key = (min(tp, 2), sp)
        if key in self._profiles or self.pieces is None:
            return
        try:
            base = Profile(self.t, tp, self.pieces, sp)
            base.infer(Profile(self.t, tp, 2 * self.pieces, sp), 0)
            if tp > 1 and bigger:  # if the degree cannot double, the others stay unknown
                with contextlib.suppress(DistIRError):
                    base.infer(Profile(self.t, 2 * tp, self.pieces, sp), 1)
            base.finish(replayed)
            self._profiles[key] = (base, tp)
        except DistIRError:
            self._profiles[key] = None

    def _entry(self, tp: int, sp: bool) -> tuple[Profile, int]:
        entry = self._profiles.get((min(tp, 2), sp and tp > 1))
        if entry is None:
            raise NotEstimableError("no profile of this degree")
        return entry

    def _classes(self, tp: int, rows: int, sp: bool) -> tuple[np.ndarray, ...]:
        """Per record class at (degree, rows): device and host seconds of an op (a
        conversion's collective seconds in ``comm``), bytes kept for the backward, all
        result bytes, the first result's bytes."""
        key = ("classes", tp, rows, sp)
        found = self._cache.get(key)
        if found is None:
            prof, tp_ref = self._entry(tp, sp)
            rows_ratio = rows / (self.batch // prof.pieces)
            split_ratio = tp_ref / tp
            n = len(prof.classes)
            dev, host, comm = np.zeros(n), np.zeros(n), np.zeros(n)
            kept, total, first = np.zeros(n), np.zeros(n), np.zeros(n)
            devices = tuple(range(tp))
            for k, (rec, keep, _) in enumerate(prof.classes):
                shapes = rec.shapes(rows_ratio, split_ratio)
                sizes = [_bytes(x, y) for x, y in zip(shapes, rec.types)]
                if rec.op is None:
                    full = sizes[0] * (tp if rec.kind == "allgather" else 1)
                    comm[k] = self.costs.collective(rec.kind, full, devices)
                    continue
                dev[k], host[k] = self.costs.op(rec.op, shapes, rec.types, rec.n_in)
                outs = sizes[rec.n_in :]
                kept[k] = sum(x for x, keep_it in zip(outs, keep) if keep_it)
                total[k] = sum(outs)  # what the op allocates
                first[k] = outs[0] if outs else 0.0
            found = self._cache[key] = (dev, host, comm, kept, total, first)
        return found

    def _stages(self, tp: int, rows: int, stages: int, sp: bool, recompute: bool) -> tuple:
        """Per stage (rows) and phase (forward, backward): device, host and tensor-parallel
        collective seconds; per stage: kept activation bytes, largest op bytes, the bytes
        its last forward result sends on."""
        key = ("stages", tp, rows, stages, sp, recompute)
        found = self._cache.get(key)
        if found is None:
            prof, _ = self._entry(tp, sp)
            dev, host, comm, kept, total, first = self._classes(tp, rows, sp)
            cls, phase, stage = prof.class_of, prof.phase, prof.stage_of(stages)
            slot = stage * 2 + phase
            again = np.asarray([c[2] for c in prof.classes], dtype=bool)[cls] & recompute
            both = np.concatenate([slot, (stage * 2 + 1)[again]])
            take = np.concatenate([np.arange(len(cls)), np.flatnonzero(again)])

            def per(values: np.ndarray) -> np.ndarray:
                return np.bincount(both, weights=values[cls[take]], minlength=2 * stages).reshape(
                    stages, 2
                )

            conv = (prof.is_conv & (comm[cls] > 0)).astype(np.float64)
            keep = np.where(again, 0.0, kept[cls])
            saved = np.bincount(stage, weights=keep, minlength=stages)
            largest = np.zeros(stages)
            np.maximum.at(largest, stage, total[cls])
            send = np.zeros(stages)
            forward = np.flatnonzero((phase == 0) & ~prof.is_conv)
            send[stage[forward]] = first[cls[forward]]  # the last forward result wins
            found = (per(dev), per(host), per(comm), saved, largest, send, per(conv))
            self._cache[key] = found
        return found

    def _state(self, tp: int, stages: int, sp: bool) -> tuple:
        """Per stage: local weight and optimizer-state bytes, optimizer seconds, the
        seconds adding one microbatch's gradients to the sums; and per stage the local
        gradient sizes, the first finished last."""
        key = ("state", tp, stages, sp)
        found = self._cache.get(key)
        if found is not None:
            return found
        prof, _ = self._entry(tp, sp)
        plan = prof.plan
        assignment = prof.assignment(stages)
        piece_of = {src: p for p, src in plan.source_of.items()}
        weights, state, optimizer, summing = (np.zeros(stages) for _ in range(4))
        optimizer_host, summing_host = np.zeros(stages), np.zeros(stages)
        grads: list[list[float]] = [[] for _ in range(stages)]
        for op in plan.post:
            w = plan.post_keys[op][0]
            p = piece_of.get(w)
            split = plan.hplan.state.get(p) if p is not None else None
            dim = split.dim if split is not None and split.kind == "S" else None
            share = 1.0 / tp if dim is not None else 1.0
            s = assignment.get(op, 0)
            weights[s] += w.type.size_bytes * share
            state[s] += share * sum(v.type.size_bytes for v in op.inputs[2:] if v in self.t.inputs)
            shapes = []
            for v in (*op.inputs, *op.outputs):
                shape = list(v.type.shape)
                if dim is not None and v.type.shape == w.type.shape:
                    shape[dim] = max(1, shape[dim] // tp)
                shapes.append(tuple(shape))
            types = [v.type for v in (*op.inputs, *op.outputs)]
            d, h = self.costs.op(op, shapes, types, len(op.inputs))
            optimizer[s] += d
            optimizer_host[s] += h
            grads[s].append(w.type.size_bytes * share)
            d, h = self.costs.add(w.type.size_bytes * share, w.type.dtype)
            summing[s] += d
            summing_host[s] += h
        found = (weights, state, optimizer, summing, grads, optimizer_host, summing_host)
        self._cache[key] = found
        return found

    def _data(self, tp: int, stages: int, sp: bool, dp: int, zero: int) -> tuple:
        """Per stage: its gradients' reduction among ``dp`` replicas (all-reduces, or
        ZeRO's reduce-scatters), the last one's seconds, and ZeRO's all-gathers after."""
        key = ("data", tp, stages, sp, dp, zero)
        found = self._cache.get(key)
        if found is None:
            grads = self._state(tp, stages, sp)[4]
            group = tuple(range(0, dp * tp, tp))
            total, tail, gather = np.zeros(stages), np.zeros(stages), np.zeros(stages)
            if dp > 1:
                kind = "reducescatter" if zero else "allreduce"
                for s, sizes in enumerate(grads):
                    times = [self.costs.collective(kind, g, group) for g in sizes]
                    total[s] = sum(times)
                    tail[s] = times[0] if times else 0.0
                    if zero:
                        gather[s] = sum(self.costs.collective("allgather", g, group) for g in sizes)
            found = self._cache[key] = (total, tail, gather)
        return found

    # -- strategies -------------------------------------------------------------------------

    def estimate(self, strategies: Sequence[Strategy]) -> Estimates:
        """:class:`Estimates` of ``strategies``."""
        n = len(strategies)
        out = [np.full(n, np.nan) for _ in range(4)]
        groups: dict[tuple, list[int]] = {}
        for i, s in enumerate(strategies):
            pieces = s.dp * s.microbatches
            if self.batch % pieces:
                continue
            sp = s.sequence_parallel and s.tp > 1
            key = (s.tp, self.batch // pieces, s.pp, s.chunks, sp, s.recompute)
            groups.setdefault(key, []).append(i)
        for key, members in groups.items():
            try:
                values = self._group(key, [strategies[i] for i in members])
            except (NotEstimableError, DistIRError, ZeroDivisionError, KeyError):
                continue
            for column, v in zip(out, values):
                column[members] = v
        step, peak, bubble, exposed = out
        return Estimates(step, peak, bubble, exposed, ~np.isnan(step))

    def _group(self, key: tuple, members: list[Strategy]) -> tuple[np.ndarray, ...]:
        """The estimates of strategies that share (degree, rows, pp, chunks, sp, recompute)."""
        tp, rows, pp, v, sp, recompute = key
        stages = pp * v
        dev, host, comm, saved, largest, send, conv = self._stages(tp, rows, stages, sp, recompute)
        weights, state, optimizer, summing, grads, opt_host, sum_host = self._state(tp, stages, sp)
        rank = np.arange(stages) % pp

        def by_rank(values: np.ndarray) -> np.ndarray:
            return np.bincount(rank, weights=values, minlength=pp)

        device = self.costs.device
        issue = device.host_comm_s()  # the host's time to issue one transfer
        host = host + conv * issue
        work = np.maximum(dev, host) + comm  # a stage's compute is at least its host's issue
        f, b = by_rank(work[:, 0]), by_rank(work[:, 1])
        acc, opt = by_rank(summing), by_rank(optimizer)
        # per microbatch, each rank's host issues its ops, transfers and sends (two per
        # boundary it has, each side issuing its part); the gradients' reductions after
        sends_per_rank = 2 * np.minimum(np.arange(pp), 1) + 2 * np.minimum(
            pp - 1 - np.arange(pp), 1
        )
        host_one = by_rank(host.sum(axis=1)) + by_rank(sum_host) + sends_per_rank * v * issue
        n_grads = by_rank(np.asarray([len(g) for g in grads], dtype=np.float64))
        w, st, acts = by_rank(weights), by_rank(state), by_rank(saved) / v
        big = np.zeros(pp)
        np.maximum.at(big, rank, largest)
        busy_one = by_rank(dev.sum(axis=1))
        comm_one = by_rank(comm.sum(axis=1))
        dp = np.asarray([s.dp for s in members], dtype=np.float64)
        m = np.asarray([s.microbatches for s in members], dtype=np.float64)
        zero = np.asarray([s.zero for s in members])
        gpipe = np.asarray([s.schedule == "gpipe" for s in members])
        k = len(members)
        # the pipeline: per microbatch each rank's forward and backward (and the sums)
        b_m = b[None, :] + acc[None, :] * ((m - 1) / m)[:, None]
        cycle = f[None, :] + b_m
        top = cycle.max(axis=1)
        send_s = np.zeros(k)
        if stages > 1:
            for d in np.unique(dp):
                at = dp == d
                send_s[at] = self.costs.collective("send", float(send.max()), (0, int(d) * tp))
        boundaries = 2 * (pp - 1) * send_s  # filling and draining: the ranks' boundaries
        if v > 1:
            pipe = m * top + (pp - 1) * top / v + boundaries
        else:
            pipe = cycle.sum(axis=1) + (m - 1) * top + boundaries
        if device.syncs_after_p2p and pp > 1:
            # each host waits for its device after every send it takes part in: where the
            # hosts are the slower, neighbouring ranks issue in turn (a microbatch costs
            # the slowest pair of neighbours), after the first has crossed them all
            pair = float((host_one[:-1] + host_one[1:]).max())
            pipe = np.maximum(pipe, (m - 1) * pair + host_one.sum())
        # data parallelism, per distinct (dp, zero) of the group
        exposed = np.zeros((k, pp))
        for d, z in {(int(a), int(c)) for a, c in zip(dp, zero)}:
            at = (dp == d) & (zero == z)
            total, tail, gather = (by_rank(x) for x in self._data(tp, stages, sp, d, z))
            exposed[at] = np.maximum(total[None, :] - b_m[at], 0.0) + (tail + gather)[None, :]
        opt_m = opt[None, :] / np.where(zero > 0, dp, 1.0)[:, None]
        reducing = np.where(dp > 1, np.where(zero > 0, 2.0, 1.0), 0.0)[:, None] * n_grads[None, :]
        issued = reducing * issue + by_rank(opt_host)[None, :]  # the host's share of the end
        step = (pipe[:, None] + np.maximum(exposed + opt_m, issued)).max(axis=1)
        # memory per rank: weights, gradient sums, optimizer state, activations in flight
        ranks = np.arange(pp)[None, :]
        flight = np.where(gpipe[:, None], m[:, None], np.minimum(m[:, None], pp - ranks))
        if v > 1:
            flight = np.minimum(m[:, None] * v, (pp - ranks) + (v - 1) * pp)
        st_m = st[None, :] / np.where(zero > 0, dp, 1.0)[:, None]
        g_m = w[None, :] / np.where(zero == 2, dp, 1.0)[:, None]
        # the gradient sums live beside a later microbatch's activations (not with one)
        sums = g_m * (m > 1)[:, None]
        during = w[None, :] + sums + st_m + acts[None, :] * flight + big[None, :]
        # at the optimizer step the updated weights and state beside the old, and the
        # gradient sums (ZeRO: the reduced parts; the weights' parts gathered after)
        parts = np.where(zero > 0, 1.0 / dp, 1.0)[:, None]
        after = 2 * (w[None, :] + st_m) + w[None, :] * parts
        peak = np.maximum(during, after).max(axis=1)
        busy = m[:, None] * busy_one[None, :] + opt_m
        bubble = np.mean(np.maximum(step[:, None] - busy, 0.0), axis=1) / step
        exposed_comm = m * comm_one.mean() + exposed.mean(axis=1)
        return step, peak, bubble, exposed_comm


def _bytes(shape: tuple[int, ...], t: object) -> float:
    n = 1
    for d in shape:
        n *= d
    return float(n * t.dtype.itemsize_bytes)
