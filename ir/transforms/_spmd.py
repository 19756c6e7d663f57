"""The SPMD engine behind data and horizontal parallelism (and their compositions).

Every value of the source program gets a state across the N devices of a group:
``R`` (replicated: each device has all of it), ``S(k)`` (split along axis k,
uneven splits by ``split_sizes``), ``P`` (partial: the value is the sum of
the devices' copies) or ``M`` (partial maxima: their elementwise maximum, as a
row's largest logit over a vocabulary split). A *rule* says, op by op, which state the results have
given the operands' states, or that the op cannot run on these states, in which
case the engine first turns its operands into ``R`` with a collective
(``AllGather`` for ``S``, ``AllReduce`` for ``P``). Inputs may be *lazy*: their
state is left to the rule of their first user (horizontal parallelism decides
whether a weight is split by columns or rows that way). A view of a lazy input
(``Transpose``, ``Cast``, ``Identity``: imported programs transpose torch's
``(out, in)`` Linear weights before every ``MatMul``) is lazy too: it is planned
when its own first user decides its state, which decides the input's through it.

The rules are read from the ops' records (``_rules.py``: one generic reading of
the sharding rules, a policy per transform); ``_emit.py`` turns the plan into a
program like the seeds' (scatters, pmaps, collectives, gathers).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ..builder import FunctionBuilder
from ..function import Function
from ..op import Op
from ..ops.communication import split_sizes
from ..registry import get_op
from ..sharding.errors import PropagationError
from ..sharding.facts import ProgramFacts
from ..sharding.rules import rule_for
from ..types import DeviceVar, TensorType
from ..value import Value
from ._rewrite import TransformError, is_view, localize_op


@dataclass(frozen=True)
class Shard:
    """How a value is laid out over a group: ``R``, ``S`` (split along ``dim``) or ``P``."""

    kind: str
    dim: int = 0

    def __str__(self) -> str:
        if self.kind == "S":
            return f"S({self.dim})"
        return "P(max)" if self.kind == "M" else self.kind


R = Shard("R")
P = Shard("P")
M = Shard("M")  # partial maxima: the value is the elementwise maximum of the copies


def S(dim: int) -> Shard:
    return Shard("S", dim)


@dataclass
class RuleResult:
    """A rule's answer: result states (None: infer from the local shapes), lazy decisions,
    and operand conversions to apply first (operand index -> wanted state)."""

    outputs: list[Shard] | None = None
    decide: dict[int, Shard] = field(default_factory=dict)
    convert: dict[int, Shard] = field(default_factory=dict)


Rule = Callable[[Op, list[Shard | None]], RuleResult | None]


def _lazy_view(op: Op) -> bool:
    """``op`` is a view (``Transpose``, ``Cast``, ``Identity``) whose sharding rule names
    every axis of its result after one of its operand's: a state of the result is a
    state of the operand."""
    if not is_view(op) or len(op.inputs) != 1:
        return False
    try:
        rule = rule_for(op)
    except PropagationError:
        return False
    (xs,), (ys,) = rule.operands, rule.results
    return None not in ys and sorted(ys) == sorted(n for n in xs if n is not None)


def _through_view(view: Op, state: Shard) -> Shard:
    """The state of ``view``'s operand that gives its result ``state``."""
    if state.kind != "S":
        return state
    rule = rule_for(view)
    return S(rule.operands[0].index(rule.results[0][state.dim]))


@dataclass
class Step:
    """One step of a plan: an op on per-device values, or a conversion between states."""

    op: Op | None
    keys: tuple[Value, ...]  # operand keys (op) or (source, result) (conversion)
    src: Shard = R
    dst: Shard = R
    link: Link | None = None  # an outer level's conversion (its result an input here)


@dataclass(frozen=True)
class Link:
    """An input of a level's program that an outer level's conversion makes: from value
    ``src`` of the program, in state ``src_state`` over the outer ``level``'s group, to
    ``dst_state`` there (``ir.transforms._megatron_levels``). Inside this plan the input
    takes ``src``'s state when it is first read, and a step records where it is made."""

    src: Value
    level: str
    src_state: Shard
    dst_state: Shard
    whole: bool = False  # the source's pending sums are reduced here first
    shift: int = 0  # ring attention's step: the block of the rank this many places back


class LocalProgram:
    """The per-device program of one shape group, built step by step in a scratch builder."""

    def __init__(self, plan: Plan, rep: int) -> None:
        # what it reads of the plan, not the plan: the plan holds its first local program,
        # and a cycle would leave both (and every value and step they hold) to the cyclic GC
        self.n, self.state, self.born, self.rep = plan.n, plan.state, plan.born, rep
        self.b = FunctionBuilder("local")
        self.env: dict[Value, Value] = {}
        self.step_ops: dict[int, Op] = {}
        self.device = DeviceVar(plan.var)
        # (op signature, op name, local operand types) -> the first local op so made: a
        # repeated layer's op is added like it (FunctionBuilder.add_like), typed once
        self._first: dict[tuple, Op] = {}
        self._signatures = plan.facts.signatures()  # computed once per plan

    def local_type(self, t: TensorType, state: Shard) -> TensorType:
        t = t.with_device(self.device)
        if state.kind != "S":
            return t
        shape = list(t.shape)
        shape[state.dim] = split_sizes(shape[state.dim], self.n)[self.rep]
        return t.with_shape(tuple(shape))

    def value(self, key: Value) -> Value:
        if key not in self.env:  # an input, created when its state is known
            self.env[key] = self.b.input(key.name, self.local_type(key.type, self.state[key]))
        return self.env[key]

    def apply(self, index: int, step: Step) -> tuple[Value, ...]:
        if step.op is None:
            src, dst = step.keys
            self.value(src)
            self.env[dst] = self.b.input(dst.name, self.local_type(dst.type, step.dst))
            return (self.env[dst],)
        op, inputs = step.op, [self.value(k) for k in step.keys]
        if op in self.born:  # results split though the operands are whole
            states = [self.born[op]] * len(op.outputs)
            types = [self.local_type(v.type, s) for v, s in zip(op.outputs, states)]
            outs = localize_op(self.b, op, inputs, self.device, results=types)
            self.step_ops[index] = self.b.ops[-1]
            self.env.update(zip(op.outputs, outs))
            return outs
        signature = self._signatures.get(op)
        key = None
        if signature is not None:
            key = (signature, op.name, tuple([x.type for x in inputs]))
            first = self._first.get(key)
            if first is not None:
                new = self.b.add_like(first, inputs, [v.name for v in op.outputs])
                self.step_ops[index] = new
                for v, loc in zip(op.outputs, new.outputs):
                    self.env[v] = loc
                return new.outputs
        outs = localize_op(self.b, op, inputs, self.device)
        self.step_ops[index] = self.b.ops[-1]
        if key is not None:
            self._first[key] = self.step_ops[index]
        for v, loc in zip(op.outputs, outs):
            self.env[v] = loc
        return outs


class Plan:
    """States of every value of ``f`` over ``n`` devices, and the steps that realise them."""

    def __init__(
        self,
        f: Function,
        n: int,
        input_states: dict[Value, Shard | None],
        rule: Rule,
        var: str,
        links: Mapping[Value, Link] | None = None,
        born: Mapping[Op, Shard] | None = None,
        facts: ProgramFacts | None = None,
    ) -> None:
        self.f, self.n, self.var, self.rule = f, n, var, rule
        self.links = dict(links or {})  # outer levels' conversion results: made when read
        # ops whose replicated operands broadcast to a split result: each device builds its
        # own part (a class token broadcast to the batch, built per shard as torch would)
        self.born: Mapping[Op, Shard] = born or {}
        # the op signatures every shape group's program reads (``facts``: of f, if made)
        self.facts = ProgramFacts.of("Plan", f, facts)
        self.state: dict[Value, Shard | None] = {v: input_states.get(v, R) for v in f.inputs}
        self.prov: dict[Value, frozenset[Value]] = {v: frozenset() for v in f.inputs}
        self.current: dict[Value, Value] = {v: v for v in f.inputs}
        self.converted: dict[tuple[Value, Shard], Value] = {}
        self.steps: list[Step] = []
        self.gathers: list[Value] = []  # activations that had to be all-gathered (S -> R)
        self.pending: dict[Value, Op] = {}  # lazy views of lazy inputs, planned when decided
        self.shaped = False  # a result's state was read from local shapes (_infer)
        self.local = LocalProgram(self, 0)
        for op in f.ops:
            lazy = len(op.inputs) == 1 and self.state[self.current[op.inputs[0]]] is None
            if lazy and _lazy_view(op):
                out = op.outputs[0]
                self.pending[out] = op
                self.state[out], self.prov[out], self.current[out] = None, frozenset(), out
                continue
            self._plan_op(op)
        for v in list(self.links):  # returned without being read
            self._made_by_link(v)
        for v in list(self.pending):  # views nothing reads
            self._decide(v, R, frozenset())
        for v in f.inputs:
            if self.state[v] is None:
                self.state[v] = R

    # -- planning ---------------------------------------------------------------------

    def _made_by_link(self, key: Value) -> None:
        """Input ``key`` made by an outer level's conversion of a value of this program:
        it has that value's state here, from the step that records where it is made."""
        link = self.links.pop(key)
        if link.src in self.links:  # made by another outer conversion: that one first
            self._made_by_link(link.src)
        src = self.current[link.src]
        if self.state[src] is None:
            self._decide(src, R, frozenset())
        if link.whole and self.state[src] in (P, M):
            src = self.convert(src, R)
        self.state[key], self.prov[key] = self.state[src], self.prov[src]
        self.steps.append(Step(None, (src, key), self.state[src], self.state[src], link))

    def _plan_op(self, op: Op) -> None:
        if self.links:
            for v in op.inputs:
                if v in self.links:
                    self._made_by_link(v)
        keys = [self.current[v] for v in op.inputs]
        states = [self.state[k] for k in keys]
        result: RuleResult | None = RuleResult([R] * len(op.outputs))
        if op in self.born and all(s in (R, None) for s in states):
            result = RuleResult([self.born[op]] * len(op.outputs))
        # an op with index operands may run on a slice of its ids though all is replicated
        elif any(s != R for s in states) or get_op(op.op_type).extra.get("index_operands"):
            result = self.rule(op, states)
        if result is None and M in states:  # no op passes a partial maximum: reduce it first
            keys = [self.convert(k, R) if s == M else k for k, s in zip(keys, states)]
            states = [self.state[k] for k in keys]
            result = RuleResult([R] * len(op.outputs))
            if any(s != R for s in states):
                result = self.rule(op, states)
        if result is None and P in states:  # first reduce pending sums, keeping the splits
            summed = [self.convert(k, R) if s == P else k for k, s in zip(keys, states)]
            retry = self.rule(op, [self.state[k] for k in summed])
            if retry is not None:
                keys, result = summed, retry
        if result is None:  # then make the activations whole, keeping the weights' layout
            inputs = set(self.f.inputs)
            whole = [
                self.convert(k, R) if k not in inputs and s not in (R, None) else k
                for k, s in zip(keys, states)
            ]
            if whole != keys:
                retry = self.rule(op, [self.state[k] for k in whole])
                if retry is not None:
                    keys, result = whole, retry
        if result is None:  # the op runs on whole values only
            for i, k in enumerate(keys):
                if states[i] is None:
                    self._decide(k, R, frozenset())
            keys = [self.convert(k, R) for k in keys]
            result = RuleResult([R] * len(op.outputs))
        shared = frozenset().union(*(self.prov[k] for k in keys if self.state[k] not in (R, None)))
        for i, s in result.decide.items():
            if self.state[keys[i]] is None:
                # a weight kept whole owes its state to no split; one split starts its own
                origin = frozenset() if s == R else shared or frozenset({keys[i]})
                self._decide(keys[i], s, origin)
        for i, s in result.convert.items():
            keys[i] = self.convert(keys[i], s)
        for k in keys:
            if self.state[k] is None:
                self._decide(k, R, frozenset())
        prov = frozenset().union(*(self.prov[k] for k in keys))
        step = Step(op, tuple(keys))
        outs = self.local.apply(len(self.steps), step)
        self.steps.append(step)
        states_out = result.outputs
        if states_out is None:
            states_out = [self._infer(op, keys, v, loc) for v, loc in zip(op.outputs, outs)]
        for v, s in zip(op.outputs, states_out):
            self.state[v], self.prov[v], self.current[v] = s, prov, v

    def _decide(self, key: Value, state: Shard, prov: frozenset[Value]) -> None:
        view = self.pending.pop(key, None)
        if view is not None:  # decide the viewed input, then plan the view itself
            self._decide(self.current[view.inputs[0]], _through_view(view, state), prov)
            self._plan_op(view)
            if self.state[key] != state:
                raise TransformError(
                    f"internal: the view {view.op_type} gave {key.name!r} the state "
                    f"{self.state[key]}, not {state}"
                )
        self.state[key], self.prov[key] = state, prov

    def _infer(self, op: Op, keys: list[Value], v: Value, local: Value) -> Shard:
        if all(self.state[k] == R for k in keys):
            return R
        self.shaped = True  # the decision depends on n: at_degree refuses this plan
        g, loc = v.type, local.type
        if not isinstance(g, TensorType):
            raise TransformError(f"cannot lay out the tuple result {v.name!r} of {op.op_type}")
        differ = [i for i, (a, b) in enumerate(zip(g.shape, loc.shape)) if a != b]
        if differ:
            return S(differ[0])
        # On one device whole, split and partial coincide; keep tensors "split" so that no
        # op waits for a sum.
        return S(0) if self.n == 1 and g.rank else P

    def convert(self, key: Value, to: Shard) -> Value:
        """The key of ``key``'s value in state ``to`` (adding a conversion step once)."""
        src = self.state[key]
        if src == to:
            return key
        if (key, to) in self.converted:
            return self.converted[(key, to)]
        if src is not None and src.kind == "S" and to == R:
            self.gathers.append(key)
        new = Value(f"{key.name}_{to.kind.lower()}", key.type)
        # a sum made whole (or scattered: sequence parallelism, ZeRO) no longer depends on
        # which weights were split to make it
        fresh = to == R or src in (P, M)
        self.state[new], self.prov[new] = to, frozenset() if fresh else self.prov[key]
        step = Step(None, (key, new), src, to)
        self.local.apply(len(self.steps), step)
        self.steps.append(step)
        self.converted[(key, to)] = new
        return new

    def at_degree(self, n: int) -> Plan:
        """This plan's decisions over ``n`` devices: a new plan with the same states and
        steps and its own local program, made again at ``n`` (converting values in it
        leaves this one as it is). It is the plan of ``n`` where the rule decides alike
        there: a degree enters the rules only through the ways each op can run
        (``_rules.split_signature``), never here, where a decision read from local shapes
        (``shaped``) would depend on it."""
        if self.shaped:
            raise TransformError(
                "internal: a plan with states read from local shapes holds for its degree only"
            )
        new = object.__new__(Plan)
        new.f, new.n, new.var, new.rule = self.f, n, self.var, self.rule
        new.links, new.born, new.facts = dict(self.links), self.born, self.facts
        new.state, new.prov = dict(self.state), dict(self.prov)
        new.current, new.converted = dict(self.current), dict(self.converted)
        new.steps, new.gathers = list(self.steps), list(self.gathers)
        new.pending, new.shaped = dict(self.pending), False
        new.local = LocalProgram(new, 0)
        for i, step in enumerate(new.steps):
            if step.link is None:  # (an outer level's conversion makes an input here)
                new.local.apply(i, step)
        return new

    # -- shape groups -----------------------------------------------------------------

    def groups(self) -> list[list[int]]:
        """Device indices whose shards have equal shapes, the group of index 0 first."""
        # Only values split from whole ones (inputs, conversions) set shard sizes; what the
        # ops derive from them follows.
        made = set(self.f.inputs) | set(self.converted.values())
        sources = [
            k.type.shape[s.dim] for k, s in self.state.items() if s and s.kind == "S" and k in made
        ]

        def signature(i: int) -> tuple[int, ...]:
            return tuple(split_sizes(n, self.n)[i] for n in sources)

        found: dict[tuple[int, ...], list[int]] = {}
        for i in range(self.n):
            found.setdefault(signature(i), []).append(i)
        return list(found.values())
