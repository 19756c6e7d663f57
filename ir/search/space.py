"""The strategy space: 3D degrees, microbatches, schedule and the switches, and what can
be ruled out before a program is built.

A :class:`Strategy` is one point; :func:`strategies` enumerates the space a search
asks for, and :func:`prune` says, without building anything, why a point cannot run
(the batch does not divide, the weights and optimizer state alone exceed a device)
or cannot win (another point of the space runs the same bubble in less memory).
"""

from __future__ import annotations

import itertools
import numbers
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from operator import attrgetter
from typing import Any

import numpy as np

from ..device import Topology
from ..errors import DistIRError
from ..function import Function
from ..transforms._megatron_shared import SharedAnalyses
from ..transforms._rewrite import is_optimizer

SCHEDULES = ("gpipe", "1f1b", "interleaved")


class SearchError(DistIRError):
    """A search that cannot start: a bad space, a model without a batch."""


@dataclass(frozen=True, order=True)
class Strategy:
    """One way to run a training step on ``dp * cp * tp * pp`` devices (see
    ``T.megatron``): ``ep`` expert-parallel ranks among the ``dp`` replicas, ``cp``
    context-parallel ranks per sequence, ``zero`` 0 to 3."""

    dp: int
    tp: int
    pp: int
    microbatches: int = 1
    schedule: str = "1f1b"
    chunks: int = 1
    zero: int = 0
    sequence_parallel: bool = False
    recompute: bool = False
    ep: int = 1
    cp: int = 1

    @property
    def devices(self) -> int:
        return self.dp * self.cp * self.tp * self.pp

    def __str__(self) -> str:
        """``dp4 tp2 pp2 m8 1f1b`` (``ep2`` after dp and ``cp2`` after tp where more
        than 1; then ``v2``, ``zero1``, ``sp``, ``recompute`` if set).

        >>> str(Strategy(2, 4, 2, 8, "interleaved", chunks=2, zero=1))
        'dp2 tp4 pp2 m8 interleaved v2 zero1'
        >>> str(Strategy(8, 2, 1, 1, zero=3, ep=4, cp=2))
        'dp8 ep4 cp2 tp2 pp1 m1 1f1b zero3'
        """
        parts = [f"dp{self.dp}"]
        parts += [f"ep{self.ep}"] if self.ep > 1 else []
        parts += [f"cp{self.cp}"] if self.cp > 1 else []
        parts += [f"tp{self.tp}", f"pp{self.pp}", f"m{self.microbatches}"]
        parts.append(self.schedule)
        if self.chunks > 1:
            parts.append(f"v{self.chunks}")
        if self.zero:
            parts.append(f"zero{self.zero}")
        if self.sequence_parallel:
            parts.append("sp")
        if self.recompute:
            parts.append("recompute")
        return " ".join(parts)

    def build(
        self,
        t: Function,
        topology: Topology | None = None,
        *,
        allow_replication: bool = False,
        shared: SharedPlans | None = None,
        tasks: bool = False,
    ) -> Function:
        """The steady-state step of training step ``t`` under this strategy
        (``allow_replication`` and ``tasks``: as ``T.megatron``'s). ``shared``: one
        search's :class:`SharedPlans` of ``t``: the analyses strategies have in common run
        once (the step is the same without it)."""
        from .. import transforms

        if shared is not None:
            step, analyses = shared.of(t, self.recompute)
        else:
            step = transforms.recompute(t) if self.recompute else t
            analyses = None
        return transforms.megatron(
            step,
            self.dp,
            self.tp,
            self.pp,
            self.microbatches,
            self.schedule,
            chunks=self.chunks,
            zero=self.zero,
            sequence_parallel=self.sequence_parallel,
            ep=self.ep,
            cp=self.cp,
            topology=topology,
            allow_replication=allow_replication,
            shared=analyses,
            tasks=tasks,
        )

    def as_record(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class SharedPlans:
    """The analyses one search's strategies share (made per search request, dropped with
    it): for each recomputation choice, the step program and its
    :class:`~ir.transforms._megatron_shared.SharedAnalyses`. ``lock``: held by a build
    that uses them (the analyses fill in as builds ask; an executor's threads, a thread
    pool's or a dask worker's, build with the same plans)."""

    def __init__(self) -> None:
        self._steps: dict[bool, tuple[Function, SharedAnalyses]] = {}
        self._program: Function | None = None
        self.lock = threading.Lock()

    def of(self, t: Function, recompute: bool) -> tuple[Function, SharedAnalyses]:
        """The step of ``t`` (recomputed or not) and its shared analyses."""
        from .. import transforms

        if self._program is None:
            self._program = t
        elif t is not self._program:
            raise DistIRError("SharedPlans belong to one search's program: make one per search")
        if recompute not in self._steps:
            step = transforms.recompute(t) if recompute else t
            self._steps[recompute] = (step, SharedAnalyses(step))
        return self._steps[recompute]


def divisors(n: int) -> list[int]:
    """The positive divisors of ``n``, ascending.

    >>> divisors(12)
    [1, 2, 3, 4, 6, 12]
    """
    return [d for d in range(1, n + 1) if n % d == 0]


def _choices(name: str, given: Iterable | None, default: Sequence) -> list:
    """The values of one keyword: ``None`` its default, one value, or a list of them
    (numpy integers as ints)."""
    if given is None:
        return list(default)
    given = _plain(given)
    if isinstance(given, (str, bool, numbers.Integral)):
        return [given]
    try:
        out = [_plain(v) for v in given]
    except TypeError:
        raise SearchError(f"{name} must be one value or a list of values, got {given!r}") from None
    if not out:
        raise SearchError(f"{name} lists no value to try")
    return out


def _plain(value: Any) -> Any:
    """A numpy integer or bool as Python's (what a widget or an array hands over)."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    return bool(value) if isinstance(value, np.bool_) else value


def _check_values(what: str, values: list, ok: Callable[[Any], bool]) -> None:
    """A :class:`SearchError` naming the first of ``values`` that is not ``ok``."""
    for v in values:
        if not ok(v):
            raise SearchError(f"{what}, got {v!r}")


def _positive(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, int) and v >= 1


def _stage(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, int) and 0 <= v <= 3


def strategies(
    devices: int,
    batch: int,
    *,
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
) -> list[Strategy]:
    """Every combination the arguments allow on ``devices`` devices (``dp * cp * tp * pp
    == devices``; an ``ep`` that does not divide ``dp`` left out: expert parallelism
    splits the replicas). ``None`` degrees: every divisor. ``microbatches`` ``None``: 1
    without a pipeline, else powers of two from ``pp`` up to the replica's batch."""
    if isinstance(devices, bool) or not isinstance(devices, int) or devices < 1:
        raise SearchError(f"devices must be a positive integer, got {devices!r}")
    for name, given in (("dp", dp), ("tp", tp), ("pp", pp), ("ep", ep), ("cp", cp)):
        _check_values(f"{name} degrees must be positive integers", _choices(name, given, [1]),
                      _positive)  # fmt: skip
    scheds = _choices("schedules", schedules, ())
    unknown = [s for s in scheds if s not in SCHEDULES]
    if unknown:
        raise SearchError(f"unknown schedule(s) {unknown}; choose from {SCHEDULES}")
    vs = _choices("chunks", chunks, ())
    _check_values("microbatches must be positive integers",
                  _choices("microbatches", microbatches, [1]), _positive)  # fmt: skip
    _check_values("chunks must be positive integers", vs, _positive)
    _check_values("zero must be a ZeRO stage: 0, 1, 2 or 3", _choices("zero", zero, ()), _stage)
    for name, given in (("sequence_parallel", sequence_parallel), ("recompute", recompute)):
        _check_values(f"{name} must be True or False", _choices(name, given, ()),
                      lambda b: isinstance(b, bool))  # fmt: skip
    if not any((s == "interleaved") == (v > 1) for s in scheds for v in vs):
        raise SearchError(
            f"schedules {scheds} with chunks {vs} make no strategy: chunks (model chunks per "
            "device) above 1 belong to the 'interleaved' schedule, which needs 2 or more; "
            "ask for schedules=('1f1b', 'interleaved') with chunks=(1, 2), say"
        )
    out = []
    all_degrees = divisors(devices)
    for d, t, p, c, e in itertools.product(
        _choices("dp", dp, all_degrees),
        _choices("tp", tp, all_degrees),
        _choices("pp", pp, all_degrees),
        _choices("cp", cp, ()),
        _choices("ep", ep, ()),
    ):
        if d * c * t * p != devices or d % e:
            continue
        if microbatches is None:
            ms = [1] if p == 1 else _powers_from(p, max(p, batch // d))
        else:
            ms = _choices("microbatches", microbatches, ())
        for m, s, v, z, sp, rc in itertools.product(
            ms,
            scheds,
            _choices("chunks", chunks, ()),
            _choices("zero", zero, ()),
            _choices("sequence_parallel", sequence_parallel, ()),
            _choices("recompute", recompute, ()),
        ):
            if (s == "interleaved") != (v > 1):
                continue  # chunks belong to the interleaved schedule only
            out.append(Strategy(d, t, p, m, s, v, z, sp, rc, e, c))
    # the order of Strategy's comparisons (its fields in order), without a comparison call
    # per pair: a space has up to millions of points
    return sorted(set(out), key=_FIELDS)


_FIELDS = attrgetter(*(f.name for f in fields(Strategy)))  # Strategy's order, as a key


def listed(devices: int, batch: int, given: Iterable[Strategy]) -> list[Strategy]:
    """The strategies of ``given`` (a list a user wrote, rows copied from an earlier
    search) on ``devices`` devices, each checked as :func:`strategies` checks its
    knobs, in the space's order without repeats. A strategy that is no point of any space
    (a degree that is not a positive integer, chunks on a 1F1B schedule, ``dp * cp * tp
    * pp`` other than ``devices``) is a :class:`SearchError` naming it and why."""
    if isinstance(given, (Strategy, str)):
        given = [given]  # type: ignore[list-item]
    try:
        chosen = list(given)
    except TypeError:
        raise SearchError(
            f"strategies must be a list of ir.search.Strategy, got {given!r}"
        ) from None
    if not chosen:
        raise SearchError("strategies lists no strategy to try")
    out = []
    for i, s in enumerate(chosen):
        if not isinstance(s, Strategy):
            raise SearchError(
                f"strategies[{i}] is {s!r}, not an ir.search.Strategy (write "
                "Strategy(dp=4, tp=2, pp=2, microbatches=8), say)"
            )
        knobs = {f.name: _plain(getattr(s, f.name)) for f in fields(Strategy)}
        _one_value(i, s, knobs)
        knobs["schedules"] = knobs.pop("schedule")  # the knob's name: the others are the fields'
        try:
            found = strategies(devices, batch, **knobs)
        except SearchError as e:
            raise SearchError(f"strategies[{i}] ({s}): {e}") from None
        if not found:
            if s.devices != devices:
                why = (
                    f"dp x cp x tp x pp = {s.devices}, but a search runs on all of the "
                    f"topology's {devices} devices"
                )
            else:
                why = f"ep={s.ep} does not divide dp={s.dp} (expert ranks split the replicas)"
            raise SearchError(f"strategies[{i}] ({s}): {why}")
        out += found
    return sorted(set(out), key=_FIELDS)


# what each field of a listed strategy must be (the others: integers)
_KINDS: dict[str, type] = {"schedule": str, "sequence_parallel": bool, "recompute": bool}


def _one_value(i: int, s: Strategy, knobs: dict[str, Any]) -> None:
    """A :class:`SearchError` unless each field of ``strategies[i]`` is one value of its
    kind (a ``None`` or a list there would widen one listed strategy into several)."""
    for name, v in knobs.items():
        kind = _KINDS.get(name, int)
        if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
            raise SearchError(
                f"strategies[{i}] ({s!r}): {name} must be one {kind.__name__}, got {v!r} "
                "(a listed strategy is one point; list each point, or search the knobs)"
            )


def _powers_from(lo: int, hi: int) -> list[int]:
    out, m = [], lo
    while m <= hi:
        out.append(m)
        m *= 2
    return out


@dataclass(frozen=True)
class ModelFacts:
    """What pruning needs to know of a training step: its batch and its state's bytes,
    its experts and sequence length (0 and 1 where it has none)."""

    batch: int
    weight_bytes: int
    optimizer_state_bytes: int  # per weight byte: Adam 2, SGD 0 (as a total, in bytes)
    experts: int = 0
    seq: int = 1
    expert_fraction: float = 0.0  # of the weights (and state): the experts' (E, ...) ones

    @staticmethod
    def of(t: Function, batch: int) -> ModelFacts:
        from ..transforms._rewrite import batch_inputs

        weights: set = set()
        state: set = set()
        for op in t.ops:
            if is_optimizer(op):
                weights.add(op.inputs[0])
                state.update(v for v in op.inputs[2:] if v in t.inputs)
        experts = max(
            (op.attributes["experts"] for op in t.ops if op.op_type == "MoEDispatch"), default=0
        )
        total = sum(v.type.size_bytes for v in weights)
        expert_bytes = sum(
            v.type.size_bytes
            for v in weights
            if experts and v.type.rank == 3 and v.type.shape[0] == experts
        )
        seqs = [v.type.shape[1] for v in batch_inputs(t) if v.type.rank == 2]
        return ModelFacts(
            batch,
            total,
            sum(v.type.size_bytes for v in state),
            experts,
            max(seqs, default=1),
            expert_bytes / total if total else 0.0,
        )

    def state_bytes_per_device(self, s: Strategy) -> float:
        """A lower bound of one device's resident bytes: its weight shard (experts split
        over ``ep``; ZeRO-3: all split over the replicas), the gradient it accumulates and
        its optimizer-state shard (activations come on top)."""
        shard = (1 - self.expert_fraction + self.expert_fraction / s.ep) / (s.tp * s.pp)
        weights = self.weight_bytes * shard / (s.dp if s.zero == 3 else 1)
        grads = self.weight_bytes * shard / (s.dp if s.zero >= 2 else 1)
        state = self.optimizer_state_bytes * shard / (s.dp if s.zero else 1)
        return weights + grads + state

    def degree_problem(self, s: Strategy) -> str | None:
        """Why ``s``'s expert or context degree cannot split this model, or None."""
        if s.ep > 1 and not self.experts:
            return f"ep={s.ep} needs a mixture-of-experts model"
        if s.ep > 1 and self.experts % s.ep:
            return f"ep={s.ep} does not divide the {self.experts} experts"
        if s.cp > 1 and self.seq % (2 * s.cp):
            return (
                f"cp={s.cp} cuts each sequence into 2 x cp = {2 * s.cp} chunks, which "
                f"{self.seq} tokens do not divide into"
            )
        return None


def prune(
    space: Sequence[Strategy],
    facts: ModelFacts,
    capacity_bytes: float,
    tensor_problems: Mapping[int, str | None] | None = None,
) -> dict:
    """Strategy -> why it is not built (the rest are): it cannot run, it would repeat work
    on every tensor rank (``tensor_problems``: tp -> why, from
    ``ir.transforms.megatron.tensor_replication_problem``), or another point of ``space`` is at
    least as fast in no more memory by construction."""
    reasons: dict[Strategy, str] = {}
    present = set(space)
    tensor_problems = tensor_problems or {}
    for s in space:
        rows = s.dp * s.microbatches
        if tensor_problems.get(s.tp):
            reasons[s] = str(tensor_problems[s.tp])
        elif degree := facts.degree_problem(s):
            reasons[s] = degree
        elif facts.batch % rows:
            reasons[s] = (
                f"the batch of {facts.batch} does not split into dp x microbatches = {rows}"
            )
        elif s.schedule == "interleaved" and s.microbatches % s.pp:
            reasons[s] = f"interleaving needs microbatches a multiple of pp={s.pp}"
        elif (need := facts.state_bytes_per_device(s)) > capacity_bytes:
            reasons[s] = (
                f"weights, gradients and optimizer state alone need {need / 2**30:.1f} GiB "
                f"per device, more than its {capacity_bytes / 2**30:.1f} GiB"
            )
        elif s.zero and s.dp == 1 and _replace(s, zero=0) in present:
            reasons[s] = "ZeRO with one replica is the plain step"
        elif s.sequence_parallel and s.tp == 1 and _replace(s, sequence_parallel=False) in present:
            reasons[s] = "sequence parallelism with one tensor rank is the plain step"
        elif s.schedule == "gpipe" and _replace(s, schedule="1f1b") in present:
            reasons[s] = "dominated by 1F1B: the same bubble, fewer microbatches alive"
        elif (
            s.schedule == "interleaved"
            and s.pp == 1
            and _replace(s, schedule="1f1b", chunks=1) in present
        ):
            # Megatron-LM's get_forward_backward_func runs a step of one pipeline rank
            # without a pipeline schedule, whatever its virtual stages
            reasons[s] = (
                "interleaving needs pipeline ranks to interleave: with pp=1 Megatron-LM runs "
                "the step without a pipeline, the 1F1B row's step"
            )
    return reasons


def _replace(s: Strategy, **changes) -> Strategy:
    from dataclasses import replace

    return replace(s, **changes)


__all__ = ["ModelFacts", "SearchError", "Strategy", "divisors", "prune", "strategies"]
