"""Reading ops' sharding rules (factor notation, see ``ir/ops/_factors.py``) as strategies.

A *strategy* says, per mesh axis, what an op does along that axis:

* ``("shard", f)``: factor ``f`` is split; operands with ``f`` are ``S(axis)``,
  the others ``R``; results with ``f`` are ``S(axis)``, results without it are
  Partial when ``f`` is a contraction factor (the strategy is invalid otherwise);
* ``("replicate",)``: everything ``R`` on that axis;
* ``("partial", L, op)``: the operands in ``L`` are ``P(op)``, the others
  ``R``, the results ``P(op)`` (the op is linear in ``L``);
* ``("halo", i)``: a sliding-window op split along its window axis ``i`` (of the
  rule's ``halo`` list: height, width), with the boundary rows exchanged between
  neighbours.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..op import Op
from ..registry import TypeContext, get_op
from ..types import TupleType, Type
from ..verify import attributes_key, describe_op
from .errors import PropagationError
from .mesh import Mesh, Partial, Placement, R, Replicate, Shard

Choice = tuple  # ("shard", f[, block]) | ("replicate",) | ("partial", L, op) | ("halo", i)


@dataclass(frozen=True)
class Rule:
    """An op's sharding rule, read from its registry record for given operand types."""

    operands: tuple[tuple[str | None, ...], ...]
    results: tuple[tuple[str | None, ...], ...]
    reduce: Mapping[str, str] = field(default_factory=dict)
    linear: tuple[tuple[int, ...], ...] = ()
    partial_ops: tuple[str, ...] = ("sum", "mean")
    local_attributes: Any = None
    halo: tuple[Mapping[str, Any], ...] | None = None  # one per window axis

    @property
    def factors(self) -> list[str]:
        seen: dict[str, None] = {}
        for names in (*self.operands, *self.results):
            for f in names:
                if f is not None:
                    seen[f] = None
        return list(seen)


def rule_for(op: Op, input_types: Sequence[Type] | None = None) -> Rule:
    """The rule of ``op`` (for its own operand types unless ``input_types`` are given)."""
    opdef = get_op(op.op_type)
    if opdef.sharding_rule is None:
        raise PropagationError(
            f"op {op.op_type} has no sharding rule, so propagation cannot place it; "
            f"attach one in its op family file (ir.registry.attach_rule)\n  in: {describe_op(op)}"
        )
    types = tuple(v.type for v in op.inputs) if input_types is None else tuple(input_types)
    key = None
    if not op.subfunctions:  # a repeated layer asks the same question per layer
        try:
            key = (opdef.name, types, attributes_key(op.attributes))
            found = _RULES.get(key)
        except TypeError:  # an attribute that is not hashable (an array)
            key = found = None
        if found is not None and found[0] is opdef:
            return found[1]
    rule = _read_rule(opdef, op, types)
    if key is not None:
        if len(_RULES) >= 1 << 12:
            _RULES.clear()
        _RULES[key] = (opdef, rule)
    return rule


_RULES: dict[tuple, tuple[Any, Rule]] = {}


def _read_rule(opdef, op: Op, types: tuple[Type, ...]) -> Rule:
    raw = opdef.sharding_rule(
        TypeContext(types, opdef.complete_attributes(op.attributes), op.subfunctions)
    )
    return Rule(
        operands=tuple(tuple(o) for o in raw["operands"]),
        results=tuple(tuple(r) for r in raw["results"]),
        reduce=dict(raw.get("reduce", {})),
        linear=tuple(tuple(ix) for ix in raw.get("linear", ())),
        partial_ops=tuple(raw.get("partial_ops", ("sum", "mean"))),
        local_attributes=raw.get("local_attributes"),
        halo=_halos(raw.get("halo")),
    )


def _halos(raw: Any) -> tuple[Mapping[str, Any], ...] | None:
    """A rule's ``halo``: one window axis (a dict) or several (a list of dicts)."""
    if raw is None:
        return None
    return (raw,) if isinstance(raw, Mapping) else tuple(raw)


def axis_placements(rule: Rule, choice: Choice) -> tuple[list[Placement], list[Placement]] | None:
    """Operand and result placements on one mesh axis under ``choice`` (None: invalid)."""
    kind = choice[0]
    n_in, n_out = len(rule.operands), len(rule.results)
    if kind == "replicate":
        return [R] * n_in, [R] * n_out
    if kind == "partial":
        _, members, op = choice
        ins: list[Placement] = [Partial(op) if i in members else R for i in range(n_in)]
        return ins, [Partial(op)] * n_out
    if kind == "halo":
        assert rule.halo is not None
        h = rule.halo[choice[1]]
        ins = [Shard(h["axis"]) if i == h["operand"] else R for i in range(n_in)]
        return ins, [Shard(h["result_axis"])] * n_out
    f = choice[1]
    block = choice[2] if len(choice) > 2 else None  # ("shard", f, b): fixed blocks of b
    ins = [Shard(names.index(f), block) if f in names else R for names in rule.operands]
    outs: list[Placement] = []
    for names in rule.results:
        if f in names:
            outs.append(Shard(names.index(f), block))
        elif f in rule.reduce:
            outs.append(Partial(rule.reduce[f]))
        else:
            return None
    return ins, outs


def axis_choices(rule: Rule, current: Sequence[Placement | None], axis_size: int) -> list[Choice]:
    """Every choice worth trying on one mesh axis, given operands' current placements there."""
    choices: list[Choice] = [("shard", f) for f in rule.factors] + [("replicate",)]
    for i, p in enumerate(current):  # an operand in fixed blocks: its factor in those blocks
        if isinstance(p, Shard) and p.block is not None and i < len(rule.operands):
            names = rule.operands[i]
            f = names[p.dim] if -len(names) <= p.dim < len(names) else None
            if f is not None and ("shard", f, p.block) not in choices:
                choices.append(("shard", f, p.block))
    partial_ops = {p.op for p in current if isinstance(p, Partial)}
    for members in rule.linear:
        for op in sorted(partial_ops & set(rule.partial_ops)):
            choices.append(("partial", members, op))
    if rule.halo is not None and axis_size > 1:
        choices += [("halo", i) for i in range(len(rule.halo))]
    return choices


def strategies(
    rule: Rule, mesh: Mesh, current: Sequence[Sequence[Placement] | None]
) -> list[tuple[Choice, ...]]:
    """Joint choices over all mesh axes (one halo axis at most)."""
    per_axis = []
    for k in range(mesh.ndim):
        here = [c[k] if c is not None else None for c in current]
        per_axis.append(axis_choices(rule, here, mesh.shape[k]))
    out = []
    for combo in itertools.product(*per_axis):
        if sum(1 for c in combo if c[0] == "halo") > 1:
            continue
        out.append(combo)
    return out


def placements_for(
    rule: Rule, strategy: Sequence[Choice]
) -> tuple[tuple[tuple[Placement, ...], ...], tuple[tuple[Placement, ...], ...]] | None:
    """Per operand and per result, the placement tuple (one per mesh axis) of ``strategy``.

    Memoised on the rule (rules are kept per op signature and per Function, so the
    strategies of a new mesh ask again what earlier meshes asked); the answer is read-only.
    """
    return _memoised(rule, "_placements", tuple(strategy), _placements_for)


def _memoised(rule: Rule, table: str, key: Any, compute: Callable[[Rule, Any], Any]) -> Any:
    """``compute(rule, key)``, remembered in a table beside the rule's fields (not part
    of its value); keys that cannot be hashed are computed each time."""
    memo = rule.__dict__.get(table)
    if memo is None:
        memo = {}
        object.__setattr__(rule, table, memo)
    try:
        found = memo.get(key, _MISSING)
    except TypeError:
        return compute(rule, key)
    if found is _MISSING:
        found = memo[key] = compute(rule, key)
    return found


_MISSING = object()


def _axis_placements(rule: Rule, choice: Choice):
    # ``axis_placements`` memoised beside ``placements_for``'s answers (read-only lists):
    # the strategies of a several-axis mesh combine the same few choices per axis.
    return _memoised(rule, "_axis", choice, axis_placements)


def _placements_for(rule: Rule, strategy: tuple[Choice, ...]):
    per_axis = [_axis_placements(rule, c) for c in strategy]
    if any(p is None for p in per_axis):
        return None
    ins = tuple([tuple([p[0][i] for p in per_axis]) for i in range(len(rule.operands))])  # type: ignore[index]
    outs = tuple([tuple([p[1][j] for p in per_axis]) for j in range(len(rule.results))])  # type: ignore[index]
    return ins, outs


def describe(strategy: Sequence[Choice], rule: Rule) -> str:
    parts = []
    for k, c in enumerate(strategy):
        if c[0] == "shard":
            parts.append(f"axis {k}: split {c[1]}")
        elif c[0] == "partial":
            parts.append(f"axis {k}: partial {c[2]} through operands {list(c[1])}")
        elif c[0] == "halo":
            axis = rule.halo[c[1]]["axis"]  # type: ignore[index]
            parts.append(f"axis {k}: halo exchange along tensor axis {axis}")
        else:
            parts.append(f"axis {k}: replicate")
    return "; ".join(parts)


def element_rank(t: Type) -> int:
    if isinstance(t, TupleType):
        return element_rank(t.elements[0]) if t.elements else 0
    return t.rank


def is_replicated(ps: Sequence[Placement]) -> bool:
    return all(isinstance(p, Replicate) for p in ps)
