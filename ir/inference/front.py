"""The latency/throughput front of serving strategies, with an SLA filter.

Each strategy of the topology's GPUs (:func:`ir.inference.strategies`) decodes batches of
several sizes; each (strategy, batch) is one point: its TPOT (a user's latency per
token) and its decode throughput per GPU (the operator's cost). A point is on the front
when no other is both faster per token and more productive per GPU; the SLA keeps the
points whose TPOT is within it (``sla_tpot_s``, 50 ms by default: about 20 tokens per
second per user, faster than people read). :meth:`ServingFront.best` is the most
productive strategy within the SLA. Strategies the model does not fit, or whose weights
leave no room for a cache, are listed in ``refused`` with the reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from ..device import Topology
from ..function import Function
from .metrics import RequestMix, ServingMetrics, serving_metrics, simulated_prefill
from .steps import ServingError
from .strategies import ServingStrategy, check_strategy, strategies

SLA_TPOT_S = 0.05


@dataclass
class ServingFront:
    """Every simulated (strategy, batch) point, the strategies refused and why."""

    points: list[ServingMetrics]
    refused: dict[str, str] = field(default_factory=dict)
    sla_tpot_s: float = SLA_TPOT_S

    def pareto(self, points: Iterable[ServingMetrics] | None = None) -> list[ServingMetrics]:
        """The points no other beats on both TPOT and tokens per second per GPU, fastest
        TPOT first."""
        pts = sorted(
            self.points if points is None else points,
            key=lambda m: (m.tpot_s, -m.tokens_per_s_per_gpu),
        )
        front: list[ServingMetrics] = []
        for m in pts:
            if not front or m.tokens_per_s_per_gpu > front[-1].tokens_per_s_per_gpu:
                front.append(m)
        return front

    def within_sla(self) -> list[ServingMetrics]:
        return [m for m in self.points if m.tpot_s <= self.sla_tpot_s]

    def best(self) -> ServingMetrics | None:
        """The most tokens per second per GPU within the SLA (None: no point meets it)."""
        ok = self.within_sla()
        return max(ok, key=lambda m: m.tokens_per_s_per_gpu) if ok else None

    def table(self, points: Sequence[ServingMetrics] | None = None) -> str:
        """A plain-text table of ``points`` (default: the front)."""
        rows = self.pareto() if points is None else list(points)
        lines = [
            f"{'strategy':<14}{'batch':>6}{'TTFT ms':>10}{'TPOT ms':>10}"
            f"{'tok/s/GPU':>11}{'max batch':>11}  SLA"
        ]
        for m in rows:
            ok = "yes" if m.tpot_s <= self.sla_tpot_s else "no"
            lines.append(
                f"{m.strategy.label:<14}{m.mix.batch:>6}{m.ttft_s * 1e3:>10.1f}"
                f"{m.tpot_s * 1e3:>10.2f}{m.tokens_per_s_per_gpu:>11.1f}{m.max_batch():>11}  {ok}"
            )
        return "\n".join(lines)


def _batches(strategy: ServingStrategy, most: int, wanted: Sequence[int] | None) -> list[int]:
    step = strategy.pp  # a pipelined decode splits its batch into pp microbatches
    if wanted is None:
        wanted = [4**k for k in range(12) if 4**k <= most] + [most]
    out = sorted({b - b % step for b in wanted if step <= b <= most})
    return out


def serving_front(
    forward: Function,
    topology: Topology,
    mix: RequestMix | None = None,
    *,
    candidates: Iterable[ServingStrategy] | None = None,
    batches: Sequence[int] | None = None,
    sla_tpot_s: float = SLA_TPOT_S,
    progress: bool = False,
    **options,
) -> ServingFront:
    """Simulate every strategy of ``topology``'s GPUs (or ``candidates``) at several decode
    batches (``batches``; default: powers of 4 up to the largest that fits, and that one)
    for ``mix``'s prompts and outputs. ``options`` go to :func:`serving_metrics`
    (``cuda_graphs``, ``memory_fraction``, ``block_tokens``)."""
    from tqdm.auto import tqdm

    mix = mix or RequestMix()
    if not sla_tpot_s > 0:
        raise ServingError(f"sla_tpot_s must be a positive number of seconds, got {sla_tpot_s!r}")
    todo = (
        list(candidates)
        if candidates is not None
        else list(strategies(forward, len(topology.devices)))
    )
    front = ServingFront([], {}, sla_tpot_s)
    for s in tqdm(todo, desc="serving strategies", disable=not progress):
        try:
            check_strategy(forward, s)
            first = replace(mix, batch=s.pp)  # the smallest pipelined batch: one per stage
            prefill = simulated_prefill(forward, topology, s, first)
            probe = serving_metrics(forward, topology, s, first, prefill=prefill, **options)
        except ServingError as e:
            front.refused[s.label] = str(e)
            continue
        for b in _batches(s, probe.max_batch(), batches):
            if b == first.batch:
                front.points.append(probe)
                continue
            at = replace(mix, batch=b)
            front.points.append(
                serving_metrics(forward, topology, s, at, prefill=prefill, **options)
            )
    return front


def fitting_strategies(
    forward: Function, topology: Topology, mix: RequestMix, **options
) -> list[ServingMetrics]:
    """Each strategy of ``topology``'s GPUs that holds ``mix.batch`` sequences of its final
    context, simulated at that batch; a :class:`ServingError` naming the largest batch any
    strategy holds, and by how much ``mix.batch`` exceeds it, when none does."""
    fits: list[ServingMetrics] = []
    largest: tuple[int, str] = (0, "")
    reasons: dict[str, str] = {}
    for s in strategies(forward, len(topology.devices)):
        try:
            m = serving_metrics(forward, topology, s, mix, **options)
        except ServingError as e:
            reasons[s.label] = str(e)
            continue
        largest = max(largest, (m.max_batch(), s.label))
        if m.fits:
            fits.append(m)
    if not fits:
        if largest[0]:
            raise ServingError(
                f"a batch of {mix.batch} sequences of {mix.final_context} positions fits no "
                f"strategy of {len(topology.devices)} GPUs of {topology.name}: the largest is "
                f"{largest[0]} ({largest[1]}), {mix.batch - largest[0]} short; serve fewer "
                "sequences per replica, shorter contexts, or on more GPUs"
            )
        shown = "; ".join(f"{k}: {v}" for k, v in list(reasons.items())[:3])
        raise ServingError(
            f"no strategy of {len(topology.devices)} GPUs of {topology.name} serves the "
            f"model at all ({shown})"
        )
    return fits
