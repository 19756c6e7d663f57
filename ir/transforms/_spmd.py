"""The SPMD engine behind data and horizontal parallelism (and their compositions).

Every value of the source program gets a state across the N devices of a group:
``R`` (replicated: each device has all of it), ``S(k)`` (split along axis k,
uneven splits by ``split_sizes``) or ``P`` (partial: the value is the sum of
the devices' copies). A *rule* says, op by op, which state the results have
given the operands' states, or that the op cannot run on these states, in which
case the engine first turns its operands into ``R`` with a collective
(``AllGather`` for ``S``, ``AllReduce`` for ``P``). Inputs may be *lazy*: their
state is left to the rule of their first user (horizontal parallelism decides
whether a weight is split by columns or rows that way).

The plan becomes a program like the seeds': the inputs are scattered or
broadcast, runs of per-device ops become ``Pmap``s, collectives sit between
them on per-device tuples, and the outputs are gathered (``S``), reduced
(``P``) or kept as replicated tuples (``R``). Devices whose shards have equal
shapes share one pmap; uneven splits give one pmap per shape group.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..builder import FunctionBuilder, rebuild_op
from ..function import Function
from ..op import Op
from ..ops.communication import split_sizes
from ..types import DeviceRef, DeviceVar, TensorType
from ..value import Value
from ._rewrite import TransformError, device_of, localize_op, sub_tuple


@dataclass(frozen=True)
class Shard:
    """How a value is laid out over a group: ``R``, ``S`` (split along ``dim``) or ``P``."""

    kind: str
    dim: int = 0

    def __str__(self) -> str:
        return f"S({self.dim})" if self.kind == "S" else self.kind


R = Shard("R")
P = Shard("P")


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


@dataclass
class Step:
    """One step of a plan: an op on per-device values, or a conversion between states."""

    op: Op | None
    keys: tuple[Value, ...]  # operand keys (op) or (source, result) (conversion)
    src: Shard = R
    dst: Shard = R


class _Local:
    """The per-device program of one shape group, built step by step in a scratch builder."""

    def __init__(self, plan: Plan, rep: int) -> None:
        self.plan, self.rep = plan, rep
        self.b = FunctionBuilder("local")
        self.env: dict[Value, Value] = {}
        self.step_ops: dict[int, Op] = {}
        self.device = DeviceVar(plan.var)

    def local_type(self, t: TensorType, state: Shard) -> TensorType:
        t = t.with_device(self.device)
        if state.kind != "S":
            return t
        shape = list(t.shape)
        shape[state.dim] = split_sizes(shape[state.dim], self.plan.n)[self.rep]
        return t.with_shape(tuple(shape))

    def value(self, key: Value) -> Value:
        if key not in self.env:  # an input, created when its state is known
            self.env[key] = self.b.input(key.name, self.local_type(key.type, self.plan.state[key]))
        return self.env[key]

    def apply(self, index: int, step: Step) -> tuple[Value, ...]:
        if step.op is None:
            src, dst = step.keys
            self.value(src)
            self.env[dst] = self.b.input(dst.name, self.local_type(dst.type, step.dst))
            return (self.env[dst],)
        outs = localize_op(self.b, step.op, [self.value(k) for k in step.keys], self.device)
        self.step_ops[index] = self.b.ops[-1]
        for v, loc in zip(step.op.outputs, outs):
            self.env[v] = loc
        return outs


class Plan:
    """States of every value of ``f`` over ``n`` devices, and the steps that realise them."""

    def __init__(
        self, f: Function, n: int, input_states: dict[Value, Shard | None], rule: Rule, var: str
    ) -> None:
        self.f, self.n, self.var, self.rule = f, n, var, rule
        self.state: dict[Value, Shard | None] = {v: input_states.get(v, R) for v in f.inputs}
        self.prov: dict[Value, frozenset[Value]] = {v: frozenset() for v in f.inputs}
        self.current: dict[Value, Value] = {v: v for v in f.inputs}
        self.converted: dict[tuple[Value, Shard], Value] = {}
        self.steps: list[Step] = []
        self.gathers: list[Value] = []  # activations that had to be all-gathered (S -> R)
        self._local = _Local(self, 0)
        for op in f.ops:
            self._plan_op(op)
        for v in f.inputs:
            if self.state[v] is None:
                self.state[v] = R

    # -- planning ---------------------------------------------------------------------

    def _plan_op(self, op: Op) -> None:
        keys = [self.current[v] for v in op.inputs]
        states = [self.state[k] for k in keys]
        result: RuleResult | None = RuleResult([R] * len(op.outputs))
        if any(s != R for s in states):
            result = self.rule(op, states)
        if result is None:  # first make the activations whole, keeping the weights' layout
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
                origin = shared if shared or s == R else frozenset({keys[i]})
                self._decide(keys[i], s, origin)
        for i, s in result.convert.items():
            keys[i] = self.convert(keys[i], s)
        for k in keys:
            if self.state[k] is None:
                self._decide(k, R, frozenset())
        prov = frozenset().union(*(self.prov[k] for k in keys))
        step = Step(op, tuple(keys))
        outs = self._local.apply(len(self.steps), step)
        self.steps.append(step)
        states_out = result.outputs
        if states_out is None:
            states_out = [self._infer(op, keys, v, loc) for v, loc in zip(op.outputs, outs)]
        for v, s in zip(op.outputs, states_out):
            self.state[v], self.prov[v], self.current[v] = s, prov, v

    def _decide(self, key: Value, state: Shard, prov: frozenset[Value]) -> None:
        self.state[key], self.prov[key] = state, prov

    def _infer(self, op: Op, keys: list[Value], v: Value, local: Value) -> Shard:
        if all(self.state[k] == R for k in keys):
            return R
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
        self.state[new], self.prov[new] = to, self.prov[key] if to != R else frozenset()
        step = Step(None, (key, new), src, to)
        self._local.apply(len(self.steps), step)
        self.steps.append(step)
        self.converted[(key, to)] = new
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


# -- emission ------------------------------------------------------------------------------


def _collective(
    b: FunctionBuilder, xs: Value, src: Shard, dst: Shard, devices: tuple, name: str
) -> Value:
    if dst == R and src.kind == "S":
        return b.call("AllGather", xs, dim=src.dim, name=name)
    if dst == R and src == P:
        return b.call("AllReduce", xs, op="sum", name=name)
    if dst.kind == "S" and src == P:
        return b.call("ReduceScatter", xs, dim=dst.dim, op="sum", name=name)
    if dst.kind == "S" and src.kind == "S":
        shapes = {e.shape for e in xs.type.elements}
        (shape,) = shapes if len(shapes) == 1 else ((),)
        if shape and shape[dst.dim] % len(devices) == 0:
            return b.call("AllToAll", xs, split_dim=dst.dim, concat_dim=src.dim, name=name)
        whole = b.call("Gather", xs, dim=src.dim, to_device=devices[0], name=f"{name}_whole")
        return b.call("Scatter", whole, dim=dst.dim, devices=list(devices), name=name)
    if dst.kind == "S" and src == R:
        first = b.call("TupleGet", xs, index=0, name=f"{name}_0")
        return b.call("Scatter", first, dim=dst.dim, devices=list(devices), name=name)
    raise TransformError(f"no collective turns {src} into {dst}")


def emit(
    plan: Plan,
    devices: Sequence[DeviceRef],
    *,
    replicated: str = "tuple",
    output_device: DeviceRef | str = "same",
    device_map: dict | None = None,
    name: str | None = None,
    inner: Callable[[Function, list[Shard]], Function] | None = None,
) -> Function:
    """The plan as a program with the source's inputs (see the module docstring).

    ``replicated``: ``"tuple"`` returns an ``R`` output as its per-device tuple,
    ``"send"`` sends the first copy to the output device. ``output_device``:
    where gathered outputs go (``"same"``: the source output's device).
    ``inner`` rewrites each pmap body (recursive composition) given the states of
    its inputs.
    """
    f = plan.f
    devices = tuple(devices)
    b = FunctionBuilder(name or f.name)
    outer: dict[Value, Value] = {}
    for v in f.inputs:
        outer[v] = b.input(v.name, v.type)
    for v in f.inputs:
        s = plan.state[v]
        if not any(v in st.keys for st in plan.steps) and v not in f.outputs:
            continue
        if s.kind == "S":
            outer[v] = b.call(
                "Scatter", outer[v], dim=s.dim, devices=list(devices), name=f"{v.name}s"
            )
        else:
            outer[v] = b.call("Broadcast", outer[v], devices=list(devices), name=f"{v.name}s")
    groups = plan.groups()
    locals_ = [plan._local] + [_Local(plan, g[0]) for g in groups[1:]]
    for loc in locals_[1:]:
        for i, step in enumerate(plan.steps):
            loc.apply(i, step)
    order = schedule(plan)
    needed_later = _needed_later(plan, order)
    pos = 0
    while pos < len(order):
        step = plan.steps[order[pos]]
        if step.op is None:
            src, dst = step.keys
            outer[dst] = _collective(b, outer[src], step.src, step.dst, devices, f"{dst.name}s")
            pos += 1
            continue
        end = pos
        while end < len(order) and plan.steps[order[end]].op is not None:
            end += 1
        _emit_segment(
            b,
            plan,
            order[pos:end],
            groups,
            locals_,
            outer,
            needed_later[end],
            devices,
            device_map,
            inner,
        )
        pos = end
    outs = []
    for v in f.outputs:
        key, s = plan.current[v], plan.state[plan.current[v]]
        if s.kind != "R" and (key, R) in plan.converted:  # already whole on every device
            key, s = plan.converted[(key, R)], R
        where = device_of(v.type) if output_device == "same" else output_device
        if s.kind == "S":
            outs.append(b.call("Gather", outer[key], dim=s.dim, to_device=where, name=v.name))
        elif s == P:
            outs.append(b.call("Reduce", outer[key], op="sum", to_device=where, name=v.name))
        elif replicated == "send":
            first = b.call("TupleGet", outer[key], index=0, name=f"{v.name}_0")
            if device_of(first.type) != where:
                first = b.call("Send", first, to_device=where, name=v.name)
            outs.append(first)
        else:
            outs.append(outer[key])
    return b.finish(outs)


def schedule(plan: Plan) -> list[int]:
    """Step indices in emission order: per-device ops as early as they are ready, collectives
    only when no op can run (so that they batch up between pmaps, as in the seeds)."""
    producer: dict[Value, int] = {}
    for i, step in enumerate(plan.steps):
        for v in step.keys[1:] if step.op is None else step.op.outputs:
            producer[v] = i
    deps = [
        {producer[k] for k in (st.keys[:1] if st.op is None else st.keys) if k in producer}
        for st in plan.steps
    ]
    done: set[int] = set()
    order: list[int] = []
    pending = list(range(len(plan.steps)))
    while pending:
        ready = [i for i in pending if deps[i] <= done]
        ops = [i for i in ready if plan.steps[i].op is not None]
        chosen = ops[:1] if ops else ready
        for i in chosen:
            order.append(i)
            done.add(i)
            pending.remove(i)
    return order


def _needed_later(plan: Plan, order: list[int]) -> list[set[Value]]:
    """For each position p in ``order``, the keys that the steps from p on and the outputs read."""
    need = {plan.current[v] for v in plan.f.outputs}
    result: list[set[Value]] = [set() for _ in range(len(order) + 1)]
    result[len(order)] = set(need)
    for p in range(len(order) - 1, -1, -1):
        step = plan.steps[order[p]]
        need |= set(step.keys[:1] if step.op is None else step.keys)
        result[p] = set(need)
    return result


def _emit_segment(
    b: FunctionBuilder,
    plan: Plan,
    indices: list[int],
    groups: list[list[int]],
    locals_: list[_Local],
    outer: dict[Value, Value],
    needed: set[Value],
    devices: tuple,
    device_map: dict | None,
    inner: Callable[[Function, list[Shard]], Function] | None,
) -> None:
    defined: set[Value] = set()
    inputs: list[Value] = []
    for i in indices:
        step = plan.steps[i]
        for k in step.keys:
            if k not in defined and k not in inputs:
                inputs.append(k)
        defined.update(step.op.outputs)
    results = [v for i in indices for v in plan.steps[i].op.outputs if v in needed]
    if not results:
        return
    per_group: list[tuple[Value, ...]] = []
    signatures = {tuple(loc.env[k].type for k in inputs) for loc in locals_}
    if len(signatures) == 1:  # no input is split unevenly: one pmap serves every device
        groups, locals_ = [list(range(plan.n))], locals_[:1]
    for g, loc in zip(groups, locals_):
        body_b = FunctionBuilder(f"{plan.f.name}_body")
        env = {loc.env[k]: body_b.input(k.name, loc.env[k].type) for k in inputs}
        for i in indices:
            op = loc.step_ops[i]
            for x, y in zip(op.outputs, rebuild_op(body_b, op, [env[x] for x in op.inputs])):
                env[x] = y
        body = body_b.finish([env[loc.env[v]] for v in results])
        if inner is not None:
            body = inner(body, [plan.state[k] for k in inputs])
        operands = [sub_tuple(b, outer[k], g, f"{k.name}_g{g[0]}") for k in inputs]
        attrs = {"device_var": plan.var}
        if device_map is not None:
            attrs["device_map"] = device_map
        op = b.add_op(
            "Pmap", operands, attrs, names=[f"{v.name}s" for v in results], subfunctions=[body]
        )
        per_group.append(op.outputs)
    for r, v in enumerate(results):
        if len(groups) == 1:
            outer[v] = per_group[0][r]
            continue
        items: list[Value | None] = [None] * plan.n
        for g, outs in zip(groups, per_group):
            for pos, dev_index in enumerate(g):
                items[dev_index] = b.call(
                    "TupleGet", outs[r], index=pos, name=f"{v.name}_{dev_index}"
                )
        outer[v] = b.call("MakeTuple", *items, name=f"{v.name}s")
