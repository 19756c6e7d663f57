"""The SPMD engine's per-op behaviour, read from the ops' sharding rules.

Every op's registry record carries a sharding rule in factor notation (see
``ir/ops/_factors.py``); ``ir.sharding.rules`` reads it as *choices* for one mesh
axis: split a factor, replicate, or pass Partial values through the operands the
op is linear in. Over the N devices of a group, each choice becomes a
:class:`Candidate`: the state (``R``, ``S(k)``, ``P``) every operand must have and
the states the results then have. The transforms differ only by *policy*:

* :func:`data_rule` (data parallelism): results follow their local shapes; a
  Partial value passes an op only when the op is linear in all its operands.
* :class:`MegatronRule` (horizontal parallelism): an op takes the candidate its
  operands already fit; an undecided weight next to a replicated activation is
  split on the factor that keeps the results split (column split), one next to a
  split activation follows the split (row split: the contraction gives ``P``); an
  optimizer step follows its parameter's layout.

No per-op-name table lives here: a new op gets data and horizontal parallelism
from its sharding rule alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..op import Op
from ..ops.communication import split_sizes
from ..registry import get_op
from ..sharding import mesh
from ..sharding.errors import PropagationError
from ..sharding.facts import ProgramFacts
from ..sharding.rules import Choice, Rule, axis_placements, rule_for
from ..types import TensorType, TupleType, Type
from ..value import Value
from ..verify import attributes_key
from ._rewrite import is_optimizer
from ._spmd import M, P, R, RuleResult, S, Shard

States = Sequence[Shard | None]


@dataclass(frozen=True)
class Candidate:
    """One way to run an op over N devices: the operands' and results' states."""

    choice: Choice
    operands: tuple[Shard, ...]
    results: tuple[Shard, ...]

    def fits(self, states: States) -> bool:
        """The decided operands already have the states this candidate needs, and no
        undecided (lazy) operand would have to be Partial."""
        return all(
            want == s if s is not None else want != P for want, s in zip(self.operands, states)
        )

    def decide(self, states: States) -> dict[int, Shard]:
        return {i: want for i, (want, s) in enumerate(zip(self.operands, states)) if s is None}

    def splits_lazy(self, states: States) -> bool:
        return any(s is None and want.kind == "S" for want, s in zip(self.operands, states))


def _state(p: mesh.Placement) -> Shard:
    if isinstance(p, mesh.Shard):
        return S(p.dim)
    if isinstance(p, mesh.Partial):
        return M if p.op == "max" else P
    return R


def _shape(t: Type) -> tuple[int, ...]:
    if isinstance(t, TupleType):
        return _shape(t.elements[0]) if t.elements else ()
    return t.shape


def _splits_evenly(op: Op, rule: Rule, factor: str, n: int) -> bool:
    """Every axis named ``factor`` splits in the same proportions over ``n`` devices
    (a hidden axis reshaped to heads splits by whole heads)."""
    types = [v.type for v in op.inputs] + [v.type for v in op.outputs]
    sizes = [
        _shape(t)[i]
        for t, names in zip(types, (*rule.operands, *rule.results))
        for i, name in enumerate(names)
        if name == factor
    ]
    base = sizes[0]
    base_parts = split_sizes(base, n)
    return all(
        p * base == q * size for size in sizes[1:] for p, q in zip(split_sizes(size, n), base_parts)
    )


def candidates(op: Op, n: int) -> list[Candidate]:
    """The ways ``op`` can run over ``n`` devices, from its record's sharding rule
    (none for ops without one: they run on whole values). They depend on the op's
    signature only, so a model's repeated layers ask once per signature (memoised by
    value beside ``rule_for``'s rules; read-only lists)."""
    key = None
    if not op.subfunctions:
        try:
            types = tuple(v.type for v in (*op.inputs, *op.outputs))
            key = (op.op_type, types, attributes_key(op.attributes), n)
            found = _CANDIDATES.get(key)
        except TypeError:  # an attribute that is not hashable
            key = found = None
        if found is not None and found[0] is get_op(op.op_type):
            return found[1]
    out = _candidates(op, n)
    if key is not None:
        if len(_CANDIDATES) >= 1 << 12:
            _CANDIDATES.clear()
        _CANDIDATES[key] = (get_op(op.op_type), out)
    return out


_CANDIDATES: dict[tuple, tuple[Any, list[Candidate]]] = {}


def distinct_ops(facts: ProgramFacts) -> list[Op]:
    """One op of ``facts``' program per signature (type, operand and result types,
    attributes; an op with a body, or an attribute that cannot be hashed, is its own): the
    ops whose candidates can differ."""
    found: dict[Any, Op] = {}
    for op, signature in facts.signatures().items():
        found.setdefault(op if signature is None else signature, op)
    return list(found.values())


def split_signature(ops: Sequence[Op], n: int) -> tuple:
    """The candidates of each of ``ops`` (a program's :func:`distinct_ops`) over ``n``
    devices. A degree enters the SPMD rules only through the candidates (a split is offered
    where every axis of its factor divides alike, :func:`_splits_evenly`): two degrees of
    equal signatures get the same plan decisions (``_spmd.Plan.at_degree``)."""
    return tuple(tuple(candidates(op, n)) for op in ops)


def _candidates(op: Op, n: int) -> list[Candidate]:
    try:
        rule = rule_for(op)
    except PropagationError:
        return []
    choices: list[Choice] = [("shard", f) for f in rule.factors] + [("replicate",)]
    if "sum" in rule.partial_ops:
        choices += [("partial", members, "sum") for members in rule.linear]
    out = []
    for choice in choices:
        placed = axis_placements(rule, choice)
        if placed is None:
            continue
        if choice[0] == "shard" and not _splits_evenly(op, rule, choice[1], n):
            continue
        ins, outs = placed
        out.append(Candidate(choice, tuple(map(_state, ins)), tuple(map(_state, outs))))
    return out


def linear_in_all(c: Candidate, n_operands: int) -> bool:
    """``c`` passes Partial values through an op linear in all of its operands jointly.

    Only then does a Partial stay Partial: an op linear in some operands only (``Mul``
    by a replicated scale, ``LayerNormGrad``'s ``dy``) would turn one pending sum
    into several (one per result) that each need a collective later.
    """
    return c.choice[0] == "partial" and len(c.choice[1]) == n_operands


def data_rule(op: Op, states: list[Shard | None], n: int = 1) -> RuleResult:
    """Data parallelism over ``n`` devices: batch rows are independent, so results take
    their state from their local shapes; Partial operands are all-reduced first unless the
    op's record says it is linear in all of them (or in them alone, the others replicated,
    with one result: ``_sums_through``). A replicated operand that the op's record aligns
    with a split one (a constant of the batch's rows; a broadcast to the batch is built
    split instead, ``data_parallel.batch_broadcasts``) is sliced where it is: no
    communication."""
    partial = {i for i, s in enumerate(states) if s == P}
    if not partial:
        return RuleResult(None, convert=_slices(op, states) if n > 1 else {})
    operands = len(states)
    if len(partial) == operands and any(linear_in_all(c, operands) for c in candidates(op, 2)):
        return RuleResult(None)
    if _sums_through(op, states, partial):
        return RuleResult([P])
    return RuleResult(None, convert=dict.fromkeys(partial, R))


def _sums_through(op: Op, states: States, partial: set[int]) -> bool:
    """``op`` has one result and is linear in its Partial operands, the others replicated
    indices (integers): the sum passes through it, as one sum still (a learned bias's
    gradient gathered into its table by an ``EmbeddingGrad``: Swin's, LeViT's relative
    positions), summed over the replicas once as the weight's gradient after the last
    microbatch. (A float operand beside it, ``Mul`` by a scale, could make several sums of
    one: it is all-reduced first, as ``linear_in_all`` says.)"""
    others = [i for i in range(len(states)) if i not in partial]
    if len(op.outputs) != 1 or any(states[i] != R for i in others):
        return False
    types = [op.inputs[i].type for i in others]
    if any(not isinstance(t, TensorType) or t.dtype.is_float for t in types):
        return False
    members = tuple(sorted(partial))
    return any(c.choice[0] == "partial" and c.choice[1] == members for c in candidates(op, 2))


def _slices(op: Op, states: Sequence[Shard | None]) -> dict[int, Shard]:
    """The replicated operands to slice so that ``op`` runs on its split operands' shards
    (none when a way of running it fits the states as they are, or none fits by slicing)."""
    if is_optimizer(op) or R not in states or not any(s and s.kind == "S" for s in states):
        return {}
    cands = candidates(op, 2)
    if not cands or any(c.fits(states) for c in cands):
        return {}
    for c in cands:
        if c.choice[0] != "shard":
            continue
        convert = {i: want for i, (want, s) in enumerate(zip(c.operands, states)) if s != want}
        if all(states[i] == R and want.kind == "S" for i, want in convert.items()):
            return convert
    return {}


class MegatronRule:
    """Horizontal parallelism over ``n`` devices; the weights in ``forced`` stay whole."""

    def __init__(
        self,
        n: int,
        forced: frozenset[Value],
        cache: dict[Op, list[Candidate]] | None = None,
    ) -> None:
        self.n, self.forced = n, forced
        # The candidates of each op, shared by the replanning rounds.
        self._cache = {} if cache is None else cache

    def candidates(self, op: Op) -> list[Candidate]:
        found = self._cache.get(op)
        if found is None:
            found = self._cache[op] = candidates(op, self.n)
        return found

    def __call__(self, op: Op, st: list[Shard | None]) -> RuleResult | None:
        cands = self.candidates(op)
        if is_optimizer(op):
            return self._follow_parameter(cands, st)
        index = get_op(op.op_type).extra.get("index_operands", ())
        if any(st[i] == R for i in index):
            found = self._split_by_index(op, cands, st, index)
            if found is not None:
                return found
        fits = [
            c
            for c in cands
            if c.fits(st) and (c.choice[0] != "partial" or linear_in_all(c, len(st)))
        ]
        if all(s in (R, None) for s in st):
            # Nothing is split yet: a lazy weight beside a replicated activation may start a
            # split (column split) if every result stays split and it is not kept whole.
            lazy = {v for v, s in zip(op.inputs, st) if s is None}
            for c in fits:
                starts = c.splits_lazy(st) and any(s == R for s in st)
                if starts and not lazy & self.forced and all(r.kind == "S" for r in c.results):
                    return RuleResult(list(c.results), c.decide(st))
            fits = [c for c in fits if not c.splits_lazy(st)]
        if not fits:
            return None
        # Decided operands leave at most one factor that fits; with lazy operands beside a
        # split one, the record's factor order decides (the split follows the activation).
        c = fits[0]
        return RuleResult(list(c.results), c.decide(st))

    def _split_by_index(
        self, op: Op, cands: list[Candidate], st: list[Shard | None], index: Sequence[int]
    ) -> RuleResult | None:
        """An op with index operands (the vocabulary ids of a table's rows or of the logits'
        classes, ``ir/ops/vocabulary.py``) runs on the factor that splits them where its
        other operands allow it: the replicated ids are sliced (``KeepShard``: nothing
        moves), an undecided weight takes the split (a vocabulary-parallel embedding) and
        pending sums or maxima it needs whole are reduced first."""
        for c in cands:
            if c.choice[0] != "shard" or any(
                c.operands[i].kind != "S" or st[i] != R for i in index
            ):
                continue
            convert: dict[int, Shard] = {i: c.operands[i] for i in index}
            fits = True
            for i, (want, s) in enumerate(zip(c.operands, st)):
                if i in convert or s == want:
                    continue
                if s is None:
                    fits = want != P and (want == R or op.inputs[i] not in self.forced)
                elif want == R and s in (P, M):
                    convert[i] = R
                else:
                    fits = False
                if not fits:
                    break
            if fits:
                return RuleResult(list(c.results), c.decide(st), convert)
        return None

    def _follow_parameter(
        self, cands: list[Candidate], st: list[Shard | None]
    ) -> RuleResult | None:
        """An optimizer step runs where its parameter (operand 0) lives: state operands
        follow it, the gradient is converted to it (``P`` -> ``S``: a reduce-scatter)."""
        target = st[0] or R
        for c in cands:
            if c.operands[0] == target:
                convert = {
                    i: want
                    for i, (want, s) in enumerate(zip(c.operands, st))
                    if s is not None and s != want
                }
                return RuleResult(list(c.results), c.decide(st), convert)
        return None


class SequenceParallelRule:
    """Megatron sequence parallelism (Korthikanti et al. 2022) over a horizontal rule.

    Between tensor-parallel regions, the ops that work token by token (residual adds,
    layer norms, their gradients) run on a slice of the tokens each: where such an op
    meets a partial sum (a row-parallel MatMul's result), the sum is reduce-scattered
    along the token axis instead of all-reduced, and a replicated activation beside it
    is sliced (``KeepShard``: no communication). An op that splits a weight (a
    column-parallel MatMul) first all-gathers its token-split activation. Activations
    are the values whose leading axes are ``lead`` (the per-device batch input's
    shape: ``(batch,)`` for an MLP, ``(batch, seq)`` for a transformer); the token axis
    is the last of them.
    """

    def __init__(self, inner: MegatronRule, params: frozenset[Value], lead: tuple[int, ...]):
        self.inner, self.params, self.lead = inner, params, lead
        self.axis = len(lead) - 1
        self.token_split: set[Value] = set()  # values this rule left split along tokens

    def is_activation(self, v: Value) -> bool:
        shape = _shape(v.type)
        return len(shape) > len(self.lead) and tuple(shape[: len(self.lead)]) == self.lead

    def splits_weight(self, op: Op) -> bool:
        """Some way of running ``op`` splits one of its weights: a tensor-parallel op."""
        return any(
            want.kind == "S" and v in self.params
            for c in self.inner.candidates(op)
            for v, want in zip(op.inputs, c.operands)
        )

    def __call__(self, op: Op, st: list[Shard | None]) -> RuleResult | None:
        result = self._rule(op, st)
        if result is not None and result.outputs is not None:
            # an activation split along the tokens is a token slice, whichever rule made it
            # (a router's gates and their gradients, made from token slices op by op)
            token = S(self.axis)
            self.token_split.update(
                v
                for v, r in zip(op.outputs, result.outputs)
                if r == token and self.is_activation(v)
            )
        return result

    def _rule(self, op: Op, st: list[Shard | None]) -> RuleResult | None:
        if is_optimizer(op):
            return self.inner(op, st)
        token = S(self.axis)
        # (an operand the engine has already gathered comes back in state R)
        tokens = [v in self.token_split and s == token for v, s in zip(op.inputs, st)]
        partial = [s == P for s in st]
        # partial sums an op is linear in (an Add of two) stay partial: one reduce-scatter
        # later; a dropout of one is reduce-scattered first, as Megatron-LM does
        linear = any(linear_in_all(c, len(st)) for c in self.inner.candidates(op))
        passes = all(partial) and linear
        if not any(tokens) and (
            passes or not any(p and self.is_activation(v) for p, v in zip(partial, op.inputs))
        ):
            return self.inner(op, st)
        if not any(tokens):
            # a partial sum (the vocabulary-parallel embedding's) added to a weight indexed
            # by position: reduce-scattered, the weight's rows of the slice's tokens taken
            found = self._on_tokens(op, st, token, sliced_weight=True)
            if found is not None:
                return found
        if self.splits_weight(op) or get_op(op.op_type).extra.get("whole_tokens"):
            # a tensor-parallel op reads whole activations: gather the token slices first
            if not any(tokens):
                return self.inner(op, st)
            whole = [R if is_token else s for is_token, s in zip(tokens, st)]
            result = self.inner(op, whole)
            if result is not None:
                gather = {i: R for i, is_token in enumerate(tokens) if is_token}
                result.convert = {**gather, **result.convert}
            return result
        found = self._on_tokens(op, st, token, sliced_weight=False)
        if found is not None:
            return found
        return None if any(tokens) else self.inner(op, st)

    def _on_tokens(
        self, op: Op, st: list[Shard | None], token: Shard, sliced_weight: bool
    ) -> RuleResult | None:
        """``op`` on token slices: its activations split along the tokens (partial sums
        reduce-scattered, replicated ones sliced), anything else whole, or (a position
        embedding added to the tokens, with ``sliced_weight`` only) sliced along the
        tokens where it is replicated."""
        for c in self.inner.candidates(op):
            wanted_ok = all(
                want == token
                if self.is_activation(v)
                else want == R or (sliced_weight and want.kind == "S" and s in (R, None))
                for v, want, s in zip(op.inputs, c.operands, st)
            )
            if not wanted_ok or any(s is None and want == P for want, s in zip(c.operands, st)):
                continue
            if sliced_weight and all(
                self.is_activation(v) or want == R for v, want in zip(op.inputs, c.operands)
            ):
                continue
            decide = {i: R for i, s in enumerate(st) if s is None}  # undecided: stays whole
            convert = {
                i: want for i, (want, s) in enumerate(zip(c.operands, st)) if (s or R) != want
            }
            self.token_split.update(
                v for v, r in zip(op.outputs, c.results) if r == token and self.is_activation(v)
            )
            return RuleResult(list(c.results), decide, convert)
        return None


__all__ = [
    "Candidate",
    "MegatronRule",
    "SequenceParallelRule",
    "candidates",
    "data_rule",
    "distinct_ops",
    "linear_in_all",
    "split_signature",
]
