"""The levels between :func:`ir.transforms.megatron`'s data plan and its tensor plan:
context parallelism (``cp``: the sequence split over a group) and expert parallelism
(``ep``: a mixture of experts' experts split over a group of replicas).

Each level is an SPMD plan (``_spmd.Plan``) of the program one device of the level
before runs, over the level's group: its states say how a value is laid out over the
group (``R``, ``S(k)``, ``P``), its conversions are the level's collectives (for
``ep``, the all-to-all that sends each token to its expert's rank and back). The
level's *local* program, the one each member runs, is what the next level plans; a
conversion of this level becomes an input of it (a :class:`~ir.transforms._spmd.Link`):
the next level gives the input its source's state where it is first read and records
the step there, so that the 3D step's tasks run every level's collectives in program
order between the tensor level's (``_megatron_plan.MegatronPlan``).

Expert parallelism follows Megatron-Core (expert parallelism inside data parallelism):
an ``ep`` group is ``ep`` data-parallel replicas with the same tensor rank; each holds
``E / ep`` of every MoE layer's experts (weights ``S(0)`` over the group) and its own
tokens. The plan of the level is over the group's microbatch (``ep`` replicas' rows):
the batch is split over the group (``S(0)``), and an expert product, whose weight is
split by experts, takes its buffer split by experts too: an all-to-all from the buffer
split by places (``S(1)``: each member's tokens) to ``S(0)`` (each member's experts),
and back before the combine, forward and backward alike.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import partial

from ..builder import FunctionBuilder
from ..function import Function
from ..op import Op
from ..registry import get_op
from ..sharding.errors import PropagationError
from ..sharding.rules import rule_for
from ..types import TensorType
from ..value import Value
from ._rewrite import TransformError, is_optimizer, is_view
from ._rules import Candidate, candidates, data_rule
from ._spmd import Link, P, R, RuleResult, S, Shard
from ._spmd import Plan as _Plan


@dataclass
class Level:
    """A level's local program: ``function`` (inputs: the planned program's, in order,
    then one per conversion of this level), ``value_of`` (a value of the planned program
    -> its value here), ``links`` (every input made by a conversion, this level's and the
    outer ones', keyed by the input here) and each output's state over the group."""

    name: str
    n: int
    function: Function
    value_of: dict[Value, Value]
    links: dict[Value, Link]
    out_states: list[Shard]
    origin: dict[Op, Op]  # each op here -> the op of the planned program it runs


Finish = Callable[[int, Value, Shard], "Shard | None"]


def plan_level(
    f: Function,
    n: int,
    name: str,
    input_states: Mapping[Value, Shard],
    rule,
    links: Mapping[Value, Link],
    var: str,
    finish: Finish | None = None,
    after: Callable[[_Plan, Op], None] | None = None,
) -> Level:
    """Plan ``f`` over a group of ``n`` (the level ``name``) and rebuild its local program.
    ``finish(i, output, state)``: the state output ``i`` must end in (None: as it is);
    ``after(plan, op)``: called once each op is planned (to convert its results)."""
    plan = _HookedPlan(f, n, dict(input_states), rule, var, links, after=after)
    ends = [plan.current[v] for v in f.outputs]
    if finish is not None:
        for i, v in enumerate(f.outputs):
            want = finish(i, v, plan.state[ends[i]] or R)
            if want is not None:
                ends[i] = plan.convert(ends[i], want)
    local = plan.local
    b = FunctionBuilder(f.name)
    value_of: dict[Value, Value] = {}
    for v in f.inputs:
        value_of[v] = b.input(v.name, local.value(v).type)
    new_links: dict[Value, Link] = {}
    origin: dict[Op, Op] = {}
    env: dict[Value, Value] = {local.env[v]: value_of[v] for v in f.inputs}
    for i, st in enumerate(plan.steps):
        if st.op is not None:
            op = local.step_ops[i]
            made = b.add_like(op, [env[x] for x in op.inputs], [v.name for v in op.outputs])
            origin[made] = st.op
            for x, y in zip(op.outputs, made.outputs):
                env[x] = y
            for v, y in zip(st.op.outputs, made.outputs):
                value_of[v] = y
            continue
        src, dst = st.keys
        if st.link is not None:  # an outer level's conversion: its input here
            new_links[value_of[dst]] = replace(st.link, src=env[local.env[src]])
            continue
        x = b.input(dst.name, local.env[dst].type)
        env[local.env[dst]] = x
        value_of[dst] = x
        # an expert group's all-to-all moves whole buffers (see StageEmission)
        new_links[x] = Link(env[local.env[src]], name, st.src, st.dst, whole=name == "ep")
    outs = [env[local.env[k]] for k in ends]
    states = [plan.state[k] or R for k in ends]
    for v, k in zip(f.outputs, ends):
        value_of.setdefault(v, env[local.env[k]])
    return Level(name, n, b.finish(outs), value_of, new_links, states, origin)


class _HookedPlan(_Plan):
    """An SPMD plan that calls ``after(plan, op)`` once each op is planned."""

    def __init__(self, *args, after: Callable[[_Plan, Op], None] | None = None) -> None:
        self._after = after
        super().__init__(*args)

    def _plan_op(self, op: Op) -> None:
        super()._plan_op(op)
        if self._after is not None:
            self._after(self, op)


# -- expert parallelism ----------------------------------------------------------------------


def expert_weights(f: Function, links: Mapping[Value, Link]) -> tuple[list[Value], int]:
    """The inputs of ``f`` an expert computation reads (``(E, ...)`` weights between an op
    making the experts' buffer and the ops reading its places back: their records'
    ``extra["expert_buffer"]``, ``"made"`` or ``"read"``), and ``E``; ``([], 0)`` for a
    model without experts. A weight may be read through a view that keeps the expert
    axis first (an imported model's experts, stored ``(E, out, in)`` as torch's
    ``Linear`` stores a weight, read transposed)."""
    inputs = set(f.inputs)
    derived: set[Value] = set()
    experts = 0
    found: dict[Value, None] = {}
    made_from = {dst: link.src for dst, link in links.items()}
    view_of: dict[Value, Value] = {}  # a weight's view (its expert axis first) -> the weight
    for op in f.ops:
        buffer = get_op(op.op_type).extra.get("expert_buffer")
        if buffer == "made":
            experts = max(experts, op.outputs[0].type.shape[0])  # type: ignore[union-attr]
            derived.update(op.outputs)
            continue
        reads = [made_from.get(v, v) for v in op.inputs]
        if not any(v in derived for v in reads):
            source = view_of.get(op.inputs[0], op.inputs[0]) if op.inputs else None
            if source in inputs and _keeps_first_axis(op):
                view_of[op.outputs[0]] = source
            continue
        if buffer == "read":
            continue
        derived.update(op.outputs)
        for v in op.inputs:
            v = view_of.get(v, v)
            if v in inputs and v not in made_from and v not in derived:
                t = v.type
                if isinstance(t, TensorType) and t.rank >= 3 and t.shape[0] == experts:
                    found[v] = None
    for dst, src in made_from.items():  # a buffer another level made whole is derived too
        if src in derived:
            derived.add(dst)
    return list(found), experts


def _keeps_first_axis(op: Op) -> bool:
    """``op`` is a view of its one operand (its record's ``extra["view"]``) whose sharding
    rule carries the first axis through: a transpose that keeps it first, a cast."""
    if len(op.inputs) != 1 or len(op.outputs) != 1 or not is_view(op):
        return False
    try:
        rule = rule_for(op)
    except PropagationError:
        return False
    first = rule.operands[0][:1]
    return first != (None,) and first == rule.results[0][:1]


def _optimizer_rule(op, st: list[Shard | None]) -> RuleResult:
    """An optimizer step inside a level (a one-piece step: no data-parallel level after
    it) runs where its parameter is: its other operands are brought to that state."""
    target = st[0] or R
    results = [target] * len(op.outputs)
    return RuleResult(results, convert={i: target for i, s in enumerate(st) if (s or R) != target})


class ExpertRule:
    """The expert level's policy: data parallelism over the group's rows, except where an
    op's operands are split along different factors (an expert product whose weight is
    split by experts and whose buffer is split by each member's places): then the way of
    running it that keeps the weights' split and fits the most split operands wins, and
    the others are converted to it (``S(a) -> S(b)``: an all-to-all)."""

    def __init__(self, n: int, weights: set[Value]) -> None:
        self.n, self.weights = n, weights

    def __call__(self, op, st: list[Shard | None]):
        if is_optimizer(op):
            return _optimizer_rule(op, st)
        split = {i: s for i, s in enumerate(st) if s is not None and s.kind == "S"}
        if len(split) < 2 or P in st:
            return data_rule(op, st, self.n)
        shards = [c for c in candidates(op, self.n) if c.choice[0] == "shard"]
        if any(all(c.operands[i] == s for i, s in split.items()) for c in shards):
            return data_rule(op, st, self.n)
        best = _best(op, shards, split, self.weights)
        if best is None:
            return None
        convert = {i: best.operands[i] for i, s in enumerate(st) if s != best.operands[i]}
        return RuleResult(list(best.results), convert=convert)


def _best(op, shards: list[Candidate], split: dict[int, Shard], weights: set[Value]):
    """The candidate that keeps every split weight's state and fits the most split
    operands (ties: the record's order), converting the rest from one split to another."""
    best, score = None, -1
    for c in shards:
        if any(op.inputs[i] in weights and c.operands[i] != s for i, s in split.items()):
            continue
        if any(c.operands[i].kind != "S" for i in split):
            continue  # only all-to-alls: never gather a split buffer whole
        fit = sum(c.operands[i] == s for i, s in split.items())
        if fit > score:
            best, score = c, fit
    return best


def expert_level(
    f: Function,
    ep: int,
    batch: set[Value],
    links: Mapping[Value, Link],
    var: str,
    finish: Finish | None = None,
) -> Level:
    """The expert level of ``f`` (the program of one expert group's microbatch; ``batch``:
    its inputs split over the group by rows)."""
    weights, experts = expert_weights(f, links)
    if not weights:
        raise TransformError(
            f"expert level: ep={ep} needs a mixture-of-experts model (experts split over the "
            f"group), but {f.name} has no MoEDispatch; use ep=1 or a model built with experts="
        )
    if experts % ep:
        raise TransformError(
            f"expert level: ep={ep} does not divide the {experts} experts (each rank holds "
            f"E / ep of every MoE layer's experts); choose ep dividing {experts}"
        )
    states: dict[Value, Shard] = {v: S(0) for v in batch}
    states.update({w: S(0) for w in weights})
    rule = ExpertRule(ep, set(weights))
    level = plan_level(f, ep, "ep", states, rule, links, var, finish)
    level.experts = [level.value_of[w] for w in weights]  # type: ignore[attr-defined]
    return level


def sequence_rule(n: int):
    """Context parallelism's policy: data parallelism over the sequence, an op whose
    operands cannot stay split (the keys and values of an attention, a sequence's
    routing) taking them whole."""
    return partial(_sequence_rule, n=n)


def _sequence_rule(op, st: list[Shard | None], n: int):
    if is_optimizer(op):
        return _optimizer_rule(op, st)
    split = {i: s for i, s in enumerate(st) if s is not None and s.kind == "S"}
    if P in st and split and not is_optimizer(op):
        # a pending sum beside split operands: reduce-scattered into their split (a key
        # projection's gradient from an attention's keys, summed over the group's queries)
        for c in candidates(op, n):
            if c.choice[0] != "shard" or any(c.operands[i] != s for i, s in split.items()):
                continue
            if all(c.operands[i].kind == "S" for i, s in enumerate(st) if s == P):
                convert = {i: c.operands[i] for i, s in enumerate(st) if s == P}
                convert.update(_slices_of(c, st))
                return RuleResult(list(c.results), convert=convert)
    if not split or P in st or is_optimizer(op):
        return data_rule(op, st, n)
    shards = [c for c in candidates(op, n)]
    if any(
        c.choice[0] == "shard" and all(c.operands[i] == s for i, s in split.items()) for c in shards
    ):
        return data_rule(op, st, n)
    best, score = None, -1
    for c in shards:
        if c.choice[0] == "partial":
            continue
        if any(c.operands[i] not in (s, R) for i, s in split.items()):
            continue  # only gathers at this level (the sequence is zigzag-ordered)
        fit = sum(c.operands[i] == s for i, s in split.items())
        if fit > score:
            best, score = c, fit
    if best is None:
        return None
    convert = {i: best.operands[i] for i, s in enumerate(st) if (s or R) != best.operands[i]}
    return RuleResult(list(best.results), convert=convert)


def _slices_of(c: Candidate, st: list[Shard | None]) -> dict[int, Shard]:
    """The replicated operands ``c`` takes split: sliced where they are."""
    return {i: w for i, (w, s) in enumerate(zip(c.operands, st)) if s in (R, None) and w != R}


__all__ = ["ExpertRule", "Level", "expert_level", "expert_weights", "plan_level", "sequence_rule"]
