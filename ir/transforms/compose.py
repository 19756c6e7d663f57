"""Compositions of data (D), horizontal (H) and pipeline (P) parallelism (seed 003).

Sequential: the first weights run one style, the rest another, with a
redistribution between them: ``data_then_horizontal`` (D then H: the
activation is all-gathered, then the next weight is split by columns and the
output gathered along them) and ``horizontal_then_data`` (H then D: the
column-split activation is re-split by rows with an all-to-all, then the rest
runs data-parallel).

Recursive: one style's pmap bodies are parallelised by another over sub-devices
``d.0, d.1, ...`` resolved by the outer pmap's ``device_map`` (seed 002):
``nested(f, ("dp", 2), ("hp", 2))`` is D over H, and so on for H over D, D over
P and H over P. A body the inner style cannot split (an optimizer-only update
body under H, for instance) stays as it is. These are the seeds' teaching
forms; ``parallelize`` is the 3D step real systems run (``megatron.py`` and its
``_megatron_*.py`` parts).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..function import Function
from ..limits import MAX_DEVICES
from ..op import Op
from ..types import DeviceRef, DeviceVar
from ..value import Value
from ..verify import verify
from ._emit import emit
from ._rewrite import (
    TransformError,
    batch_inputs,
    batch_size,
    check_common,
    check_degree,
    check_devices,
)
from ._rules import MegatronRule
from ._spmd import P, R, RuleResult, S, Shard
from ._spmd import Plan as _Plan
from .data_parallel import data_parallel
from .horizontal import horizontal_parallel, horizontal_plan_checked
from .pipeline import pipeline_parallel, stage_assignment
from .stage_cut import weights as _weights

KINDS = ("dp", "hp", "pp")
_VARS = ("d", "e", "g")


# -- sequential ---------------------------------------------------------------------------


def _split_weights(f: Function, split_at: int | None) -> tuple[list[Value], list[Value]]:
    weights = _weights(f)
    if len(weights) < 2:
        raise TransformError(f"{f.name} needs at least two weights to switch styles between")
    if split_at is not None and (isinstance(split_at, bool) or not isinstance(split_at, int)):
        raise TransformError(f"split_at must be an integer or None, got {split_at!r}")
    k = len(weights) // 2 if split_at is None else split_at
    if not 1 <= k < len(weights):
        raise TransformError(f"split_at must be in 1..{len(weights) - 1}, got {split_at!r}")
    return weights[:k], weights[k:]


def _sequential(
    f: Function,
    degree: int,
    devices: Sequence[DeviceRef] | None,
    topology: Any,
    states: dict[Value, Shard | None],
    rule: Callable[[Op, list[Shard | None]], RuleResult | None],
    inputs: str,
) -> Function:
    devices = check_devices(devices, degree, topology)
    for v, s in states.items():
        if s.kind == "S" and v.type.shape[s.dim] < degree:
            raise TransformError(
                f"degree {degree} is larger than dim {s.dim} of {v.name!r} ({v.type.shape})"
            )
    plan = _Plan(f, degree, states, rule, "d")
    return verify(emit(plan, devices, inputs=inputs))


def data_then_horizontal(
    f: Function,
    degree: int,
    devices: Sequence[DeviceRef] | None = None,
    *,
    split_at: int | None = None,
    topology: Any = None,
    inputs: str = "resident",
) -> Function:
    """The first ``split_at`` weights (default half) data-parallel, the rest split by columns."""
    check_common("data_then_horizontal", f, topology)
    first, rest = _split_weights(f, split_at)
    states: dict[Value, Shard | None] = {v: S(0) for v in batch_inputs(f)}
    states.update({w: R for w in first})
    states.update({w: S(1) if w.type.rank == 2 else R for w in rest})
    hp = MegatronRule(degree, frozenset())
    return _sequential(f, degree, devices, topology, states, hp, inputs)


def horizontal_then_data(
    f: Function,
    degree: int,
    devices: Sequence[DeviceRef] | None = None,
    *,
    split_at: int | None = None,
    topology: Any = None,
    inputs: str = "resident",
) -> Function:
    """The first ``split_at`` weights (default half) split by columns, the rest data-parallel."""
    check_common("horizontal_then_data", f, topology)
    first, rest = _split_weights(f, split_at)
    batch = batch_inputs(f)
    if batch:  # the data-parallel half splits the batch rows after the all-to-all
        check_degree("degree", degree, batch_size(f, batch), "batch size")
    states: dict[Value, Shard | None] = {w: S(1) if w.type.rank == 2 else R for w in first}
    states.update({w: R for w in rest})
    rows = set(rest)
    hp = MegatronRule(degree, frozenset())

    def rule(op: Op, st: list[Shard | None]) -> RuleResult | None:
        result = hp(op, st)
        if result is not None:
            return result
        # An activation split on a factor the op contracts with a data-parallel weight
        # would need that weight split by rows: turn the activation into batch rows
        # instead (all-to-all) and run data-parallel.
        for c in hp.candidates(op):
            contracts_rows = any(
                v in rows and want.kind == "S" for v, want in zip(op.inputs, c.operands)
            )
            if not (contracts_rows and P in c.results):
                continue
            moved = {
                i: S(0)
                for i, (v, s, want) in enumerate(zip(op.inputs, st, c.operands))
                if v not in rows and s == want and s.kind == "S" and s.dim != 0
            }
            retry = hp(op, [moved.get(i, s) for i, s in enumerate(st)]) if moved else None
            if retry is not None:
                retry.convert.update(moved)
                return retry
        return None

    return _sequential(f, degree, devices, topology, states, rule, inputs)


# -- recursive ----------------------------------------------------------------------------


def _mesh_id(index: Sequence[int], sizes: Sequence[int]) -> int:
    out = 0
    for i, n in zip(index, sizes):
        out = out * n + i
    return out


def _prefixes(sizes: Sequence[int], depth: int) -> list[tuple[int, ...]]:
    out: list[tuple[int, ...]] = [()]
    for n in sizes[:depth]:
        out = [(*p, i) for p in out for i in range(n)]
    return out


def _rep(prefix: tuple[int, ...], sizes: Sequence[int]) -> int:
    return _mesh_id(prefix + (0,) * (len(sizes) - len(prefix)), sizes)


def nested(
    f: Function,
    *levels: tuple[str, int],
    microbatches: int = 1,
    schedule: str = "gpipe",
    topology: Any = None,
) -> Function:
    """``f`` parallelised by ``levels`` from the outside in, e.g. ``("dp", 2), ("hp", 2)``.

    ``pp`` may only be the innermost level. Devices form a mesh numbered from 0.
    """
    check_common("nested", f, topology)
    for i, level in enumerate(levels):
        if not isinstance(level, tuple) or len(level) != 2:
            raise TransformError(
                f"nested: level {i} must be a pair (kind, degree) such as ('dp', 2), got {level!r}"
            )
    for kind, n in levels:
        if not isinstance(kind, str) or kind not in KINDS:
            raise TransformError(f"unknown parallelism {kind!r} (one of {KINDS})")
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise TransformError(f"the {kind} degree must be a positive integer, got {n!r}")
    if any(kind == "pp" for kind, _ in levels[:-1]):
        raise TransformError("pipeline parallelism must be the innermost level")
    sizes = [n for _, n in levels]
    if _prod(sizes) > MAX_DEVICES:
        raise TransformError(
            f"nested: the levels {list(levels)} make {_prod(sizes)} devices, more than the "
            f"limit of {MAX_DEVICES} (ir.limits.MAX_DEVICES)"
        )
    if topology is not None:
        check_devices(range(_prod(sizes)), _prod(sizes), topology, what="number of devices")
    _check_levels(f, dict(levels), microbatches, schedule)
    return _level(f, list(levels), sizes, 0, microbatches, schedule)


def _check_levels(f: Function, degree: dict[str, int], microbatches: int, schedule: str) -> None:
    """Check the degrees against ``f`` up front: inner levels leave alone a body they cannot
    split, which must not hide a bad parameter."""
    rows = batch_size(f, batch_inputs(f)) if batch_inputs(f) else 0
    if "dp" in degree:
        check_degree("data-parallel degree", degree["dp"], rows, "batch size")
    if "hp" in degree:
        horizontal_plan_checked(f, degree["hp"])
    if "pp" in degree:
        stage_assignment(f, degree["pp"])
        if isinstance(microbatches, bool) or not isinstance(microbatches, int) or microbatches < 1:
            raise TransformError(f"microbatches must be a positive integer, got {microbatches!r}")
        per_replica = rows // degree.get("dp", 1)
        check_degree("number of microbatches", microbatches, per_replica, "rows per replica")
        if not isinstance(schedule, str) or schedule not in ("gpipe", "1f1b"):
            raise TransformError(f"schedule must be 'gpipe' or '1f1b' here, got {schedule!r}")


def _prod(sizes: Sequence[int]) -> int:
    out = 1
    for n in sizes:
        out *= n
    return out


def _level(
    f: Function,
    levels: list[tuple[str, int]],
    sizes: list[int],
    depth: int,
    microbatches: int,
    schedule: str,
) -> Function:
    kind, n = levels[depth]
    last = depth == len(levels) - 1
    var = _VARS[depth]
    if depth == 0:
        devices: list[DeviceRef] = [_rep((i,), sizes) for i in range(n)]
        where: dict[str, Any] = {}
    else:
        up = _VARS[depth - 1]  # sub-device 0 is the outer device itself (see the device map)
        devices = [DeviceVar(up)] + [DeviceVar(up, (k,)) for k in range(1, n)]
        where = {"replicated": "send", "output_device": DeviceVar(_VARS[depth - 1])}
    if kind == "pp":
        out = where.get("output_device")
        return pipeline_parallel(
            f, n, microbatches, schedule, devices, output_device=out, resident=False
        )
    device_map = None
    inner: Callable[[Function, list], Function] | None = None
    if not last:
        device_map = {
            _rep(p, sizes): [_rep((*p, k), sizes) for k in range(sizes[depth + 1])]
            for p in _prefixes(sizes, depth + 1)
        }

        def inner(body: Function, states: list) -> Function:
            try:
                return _level(body, levels, sizes, depth + 1, microbatches, schedule)
            except TransformError:
                return body

    transform = data_parallel if kind == "dp" else horizontal_parallel
    # The seed-003 teaching form: every level distributes its inputs itself.
    return transform(
        f, n, devices, inputs="distribute", var=var, device_map=device_map, inner=inner, **where
    )


def parallelize(
    f: Function,
    dp: int = 1,
    hp: int = 1,
    pp: int = 1,
    microbatches: int = 1,
    schedule: str = "1f1b",
    *,
    chunks: int = 1,
    zero: int = 0,
    sequence_parallel: bool = False,
    topology: Any = None,
    allow_replication: bool = False,
    **megatron_options: Any,
) -> Function:
    """The D x H x P step as Megatron-LM runs it: :func:`ir.transforms.megatron` with
    ``tp=hp`` (a steady-state step on ``dp * hp * pp`` devices; the seed-003 nested
    compositions are :func:`nested`); ``megatron_options`` (``vocab_parallel``,
    ``distributed_optimizer``, ``recompute``, ...) go to it."""
    from .megatron import megatron

    check_common("parallelize", f, topology)
    return megatron(
        f,
        dp,
        hp,
        pp,
        microbatches,
        schedule,
        chunks=chunks,
        zero=zero,
        sequence_parallel=sequence_parallel,
        topology=topology,
        allow_replication=allow_replication,
        **megatron_options,
    )


__all__ = [
    "data_then_horizontal",
    "horizontal_then_data",
    "nested",
    "parallelize",
]
