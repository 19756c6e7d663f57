"""Sharding propagation: from a few annotations to an explicit distributed Function.

1. *Desired layouts*: user annotations are fixed; forward and backward sweeps
   through the ops' sharding rules give every other value a layout (values no
   rule reaches are replicated).
2. *Materialisation*: each input arrives laid out on the mesh; each op
   picks the strategy (per mesh axis: split a factor, replicate, pass a
   Partial through, or a halo exchange) with the smallest predicted time:
   redistributing its operands (``ir.collectives`` on the topology) plus its
   compute divided over the shards; then runs per device. A value that a user
   annotated is redistributed to that layout right away: annotations win.

The result is a steady-state step (``inputs="resident"``, the default): each
input is a per-device tuple already laid out on the mesh (``Function.input_layouts``,
see :mod:`ir.layout`), each output stays on the devices that computed it, with its
layout, and an optimizer's updated state comes back in the layout its input had, so
step N+1 takes step N's outputs. ``ir.distribute`` / ``ir.collect`` lay sequential
values out and back; ``T.setup_program`` is the one-time distribution. With
``inputs="distribute"`` the program is the seeds' teaching form instead: whole
inputs are scattered / broadcast from their device every step and outputs gathered
back to whole tensors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from ..arguments import function_arg, topology_arg
from ..builder import FunctionBuilder
from ..device import Topology
from ..function import Function
from ..layout import with_layouts
from ..op import Op, freeze_attributes
from ..registry import get_op
from ..types import Type
from ..value import Value
from ..verify import describe_op, hashed_key, infer_types
from . import annotations as ann
from . import halo
from .choice import Chooser
from .desired import desired_layouts
from .errors import PropagationError
from .facts import ProgramFacts
from .mesh import Layout, Mesh
from .redistribute import DistValue, plan, step_bytes
from .redistribute_emit import emit
from .rules import Rule, describe
from .spmd import pmap, symmetric_body
from .step_io import StepIO, symmetric


@dataclass(frozen=True)
class InsertedCollective:
    """One redistribution step propagation inserted, and why."""

    value: str
    src: tuple[str, ...]
    dst: tuple[str, ...]
    kind: str
    mesh_axis: int
    size_bytes: int
    time_s: float
    reason: str

    def __str__(self) -> str:
        return (
            f"{self.kind:13s} {self.value}: [{', '.join(self.src)}] -> [{', '.join(self.dst)}] "
            f"on mesh axis {self.mesh_axis}, {self.size_bytes} B, {self.time_s * 1e6:.2f} us; "
            f"{self.reason}"
        )


@dataclass
class PropagationReport:
    """What propagation decided: layouts, per-op strategies and inserted collectives."""

    mesh: Mesh
    layouts: dict[str, tuple[str, ...]] = field(default_factory=dict)
    collectives: list[InsertedCollective] = field(default_factory=list)
    # each op of the original function and its strategy in words, in program order
    op_strategies: list[tuple[Op, str]] = field(default_factory=list)
    _texts: list[tuple[str, str]] = field(
        default_factory=list, init=False, repr=False, compare=False
    )

    @property
    def strategies(self) -> list[tuple[str, str]]:
        """Per op, its text and its strategy in words. Printed on first use: the printer is
        not free, and the click -> simulate loop does not read them."""
        for op, how in self.op_strategies[len(self._texts) :]:
            self._texts.append((describe_op(op), how))
        return list(self._texts)

    @property
    def communication_time_s(self) -> float:
        return sum(c.time_s for c in self.collectives)

    def __str__(self) -> str:
        lines = [f"mesh {list(self.mesh.shape)} on devices {list(self.mesh.devices)}"]
        lines += [f"  {c}" for c in self.collectives] or ["  no collectives inserted"]
        return "\n".join(lines)


def propagate(
    function: Function,
    annotations: Mapping[str, ann.AnnotationLike] | None = None,
    topology: Topology | None = None,
    *,
    mesh: Mesh | None = None,
    inputs: str = "resident",
    facts: ProgramFacts | None = None,
) -> tuple[Function, PropagationReport]:
    """Distribute ``function`` by ``annotations`` (value name -> layout); see the module doc.

    ``inputs``: ``"resident"`` (a steady-state step on laid-out inputs) or
    ``"distribute"`` (whole inputs scattered and outputs gathered every step).
    ``facts``: a :class:`ProgramFacts` of ``function`` kept by a caller that propagates
    it again (each op's rule and signature, mesh-independent, read once); a fresh one
    for this call when None.
    """
    function_arg("propagate", "function", function)
    topology_arg("propagate", "topology", topology)
    facts = ProgramFacts.of("propagate", function, facts)
    if not isinstance(inputs, str) or inputs not in _INPUT_MODES:
        raise PropagationError(
            f"inputs must be one of {', '.join(map(repr, _INPUT_MODES))} ('resident': "
            "each input arrives laid out on the mesh; 'distribute': scattered from its "
            f"device every step), got {inputs!r}"
        )
    fixed, mesh = ann.collect(function, annotations, mesh)
    if topology is None:
        topology = Topology.uniform(max(mesh.devices) + 1)
    ann.devices_in(topology.device_ids, mesh)
    desired = desired_layouts(function, fixed, mesh, facts)
    resident = inputs == "resident"
    return _Materialiser(function, mesh, topology, fixed, desired, resident, facts).run()


_INPUT_MODES = ("resident", "distribute")


# -- phase 2: materialisation -----------------------------------------------------------


class _Materialiser(Chooser, StepIO):
    def __init__(
        self, function, mesh, topology, fixed, desired, resident: bool, facts: ProgramFacts
    ) -> None:
        self.f = function
        self.resident = resident
        self._in_levels: dict[str, tuple[str, ...]] = {}
        self.mesh = mesh
        self.topology = topology
        self.fixed = fixed
        self.desired = desired
        self.b = FunctionBuilder(f"{function.name}_sharded")
        self.dist: dict[Value, DistValue] = {}
        self.views: dict[Value, dict[Layout, DistValue]] = {}
        carried: dict[Value, Value] = {}  # an updated state -> the input it updates
        if resident:
            from ..transforms._emit import carried_inputs  # (transforms import sharding)

            carried = carried_inputs(function)
        self.init_choice(function.ops, carried, facts)  # kept as ``_carried``
        # a gradient -> the updates of carried state that read it, whose operands are
        # redistributed as soon as the last of them is made (the transforms' overlap)
        self._readers: dict[Value, list[Op]] = {}
        for op in self._overlapped:
            for v in op.inputs:
                self._readers.setdefault(v, []).append(op)
        self._early: dict[Op, _Decision] = {}  # updates whose operands are laid out
        self._suffixes = [f"_{d}" for d in mesh.devices]
        self._signatures = facts.signatures()
        self._choices: dict[tuple, _Decision] = {}
        # (input type, layout) -> the op that distributes it: (op type, attributes, types)
        self._distributions: dict[tuple, tuple[str, Mapping, tuple[Type, ...]]] = {}
        # (step, operand type, groups) -> the first op that redistributed so: repeats copy it
        self._redistributions: dict[tuple, Op] = {}
        self.report = PropagationReport(mesh)
        self.device = topology.device(mesh.devices[0])

    def run(self) -> tuple[Function, PropagationReport]:
        for x in self.f.inputs:
            self.dist[x] = self._distribute(x)
        for op in self.f.ops:
            if op.op_type == "ShardAnnotate":
                self.dist[op.outputs[0]] = self.redistribute(
                    self.dist[op.inputs[0]], self.fixed[op.outputs[0]], "user annotation"
                )
                continue
            self._op(op)
            for v in op.outputs:
                for update in self._readers.get(v, ()):
                    if update not in self._early and all(x in self.dist for x in update.inputs):
                        decision = self._early[update] = self._decision(update)
                        self._operands(update, decision)
        if self.resident:
            outs, out_levels = (
                zip(*[self._keep(v, self._carried.get(v)) for v in self.f.outputs])
                if self.f.outputs
                else ((), ())
            )
        else:
            outs = [self._collect(v) for v in self.f.outputs]
        texts: dict[Layout, tuple[str, ...]] = {}  # each layout's texts printed once
        layouts = self.report.layouts
        for v, d in self.dist.items():
            found = texts.get(d.layout)
            if found is None:
                found = texts[d.layout] = tuple(d.layout.texts)
            layouts.setdefault(v.name, found)
        g = self.b.finish(list(outs))
        if self.resident:
            g = with_layouts(g, self._in_levels, list(out_levels))
            if self.mesh.size > 1 and symmetric(g, self.mesh.size):
                g = replace(g, rank_classes=(tuple(self.mesh.devices),))
        return g, self.report

    # -- redistribution --------------------------------------------------------------------

    def redistribute(self, value: DistValue, target: Layout, reason: str) -> DistValue:
        name = value.name
        for step in plan(value.shape, value.layout, target):
            time_s = self._costs.step_time_s(value.type, value.layout, step)
            size = step_bytes(value.type, value.layout, step)
            new = emit(self.b, value, step, self._redistributions)
            if step.kind != "slice":
                self.report.collectives.append(
                    InsertedCollective(
                        name,
                        tuple(value.layout.texts),
                        tuple(new.layout.texts),
                        step.kind,
                        step.axis,
                        size,
                        time_s,
                        reason,
                    )
                )
            value = new
        return value

    # -- ops -------------------------------------------------------------------------------

    def _op(self, op) -> None:
        decision = self._early.pop(op, None)
        self._emit(op, decision if decision is not None else self._decision(op))

    def _decision(self, op) -> _Decision:
        """``op``'s strategy, memoised for ops that ask the same question."""
        key = self._choice_key(op)
        decision = self._choices.get(key) if key is not None else None
        if decision is None:
            rule, strategy, ins, outs = self._choose(op)
            decision = _Decision(
                rule,
                strategy,
                describe(strategy, rule),
                tuple(self._layout_of(ps) for ps in ins),
                tuple(self._layout_of(ps) for ps in outs),
                any(c[0] == "halo" for c in strategy),
            )
            if key is not None:
                self._choices[key] = decision
        return decision

    def _choice_key(self, op) -> tuple | None:
        """What the choice of ``op``'s strategy depends on, or None when it cannot be hashed.

        A layer repeated many times asks the same question per layer: its op's types and
        attributes, the layouts its operands already have and its results' desired layouts.
        """
        signature = self._signatures.get(op)  # op type, types and attributes, as an int
        if signature is None:  # a body, or an attribute that cannot be hashed
            return None
        views = self.views
        return hashed_key(  # hashed once for the look-up and the insertion
            (
                signature,
                tuple(
                    [
                        (self.dist[v].layout, *[w.layout for w in views[v].values()])
                        if v in views
                        else (self.dist[v].layout,)
                        for v in op.inputs
                    ]
                ),
                tuple([self.desired.get(v) for v in op.outputs]),
                op in self._overlapped,  # an update of carried state is costed as such
            )
        )

    def _emit(self, op, decision: _Decision) -> None:
        self.report.op_strategies.append((op, decision.how))
        operands = self._operands(op, decision)
        if decision.halo:
            for x in operands:
                x.locals_in(self.b, self._suffixes)
            expected = self._expected_types(op, decision)
            results = halo.emit(self, op, decision.rule, decision.strategy, operands, expected)
            values = [DistValue(locs, None, None) for locs in zip(*results)]
        elif not op.subfunctions:
            if decision.local_ops is None:  # the first op of this decision: plan the local op
                in_types = list(zip(*[x.local_types for x in operands])) or [()] * self.mesh.size
                decision.local_ops = self._plan_locals(op, decision, in_types)
                decision.body = symmetric_body(op, in_types, decision.local_ops)
            if decision.body is not None:  # every device runs the same op: one Pmap
                wholes = [x.whole_in(self.b) for x in operands]
                names = [v.name for v in op.outputs]
                if decision.pmap is None:
                    new = decision.pmap = pmap(self.b, decision.body, wholes, names)
                else:  # a repeated layer: the same body on operands of the same types
                    new = self.b.add_like(decision.pmap, wholes, names)
                values = [DistValue(None, None, None, whole=y) for y in new.outputs]
            else:
                values = self._emit_rows(op, decision, operands)
        else:
            results = self._emit_checked(op, decision, operands)
            values = [DistValue(locs, None, None) for locs in zip(*results)]
        for v, value, layout in zip(op.outputs, values, decision.out_layouts):
            value.layout, value.type, value.name = layout, v.type, v.name
            if v in self.fixed and value.layout != self.fixed[v]:
                value = self.redistribute(value, self.fixed[v], f"user annotation on {v.name!r}")
            self.dist[v] = value

    def _operands(self, op, decision: _Decision) -> list[DistValue]:
        """``op``'s operands in the layouts ``decision`` runs it on: each value redistributed
        once per layout, then reused."""
        operands = []
        for v, target in zip(op.inputs, decision.in_layouts):
            views = self.views.setdefault(v, {})
            source = views.get(target)
            if source is None:  # redistribute a value once per layout, then reuse it
                source = self.dist[v]
                if views or (source.layout is not target and source.layout != target):
                    source = self._source(v, target)[1]  # (else the one candidate fits)
                if source.layout != target:  # (the printer is not free: only when needed)
                    need = (
                        f"{describe_op(op)} runs as ({decision.how}), "
                        f"needing it as [{', '.join(target.texts)}]"
                    )
                    source = self.redistribute(source, target, need)
                views[target] = source
            operands.append(source)
        return operands

    def _emit_rows(self, op, decision: _Decision, operands: list[DistValue]) -> list[DistValue]:
        """One op per device, with the planned local ops' attributes and result types (the
        same decision means the same local operand types: its key holds their types and
        layouts)."""
        suffixes = self._suffixes  # "_<device>" per device: names as f"{name}_{d}"
        if len(op.outputs) == 1:
            name = op.outputs[0].name
            names = [[name + s] for s in suffixes]
        else:
            names = [[v.name + s for v in op.outputs] for s in suffixes]
        local = [x.locals_in(self.b, suffixes) for x in operands]
        rows = list(zip(*local)) if operands else [()] * len(names)
        results = self.b.add_inferred_rows(op.op_type, rows, decision.local_ops, names)
        return [DistValue(locs, None, None) for locs in zip(*results)]

    def _plan_locals(self, op, decision: _Decision, in_types: list[tuple[Type, ...]]) -> list:
        """Per device, the local op's frozen attributes and result types (its type rule's
        answer for that device's operand types)."""
        opdef = get_op(op.op_type)
        expected = self._expected_types(op, decision)
        local_ops = []
        for i, d in enumerate(self.mesh.devices):
            want = [e[i] for e in expected]
            attrs = self._local_attrs(op, decision.rule, list(in_types[i]), want, d)
            types, full = infer_types(opdef, in_types[i], attrs)
            local_ops.append((freeze_attributes(full), tuple(types)))
        return local_ops

    def _emit_checked(self, op, decision: _Decision, operands: list[DistValue]) -> list[tuple]:
        """The local ops of an op with a body, one per device through the builder's checks
        (such an op's decision is never shared: its key is None)."""
        expected = self._expected_types(op, decision)
        local = [x.locals_in(self.b, self._suffixes) for x in operands]
        results = []
        for i, d in enumerate(self.mesh.devices):
            local_in = [x[i] for x in local]
            want = [e[i] for e in expected]
            attrs = self._local_attrs(op, decision.rule, [x.type for x in local_in], want, d)
            names = [f"{v.name}_{d}" for v in op.outputs]
            results.append(
                self.b.add_op(
                    op.op_type, local_in, attrs, names=names, subfunctions=op.subfunctions
                )
            )
        return [new.outputs for new in results]

    def _expected_types(self, op, decision: _Decision) -> list[list[Type]]:
        """Per result of ``op``, each device's local type under ``decision``."""
        return [
            self._local_types(v.type, lay.placements)
            for v, lay in zip(op.outputs, decision.out_layouts)
        ]


@dataclass
class _Decision:
    """An op's memoised strategy and what emitting it needs (shared by repeated layers)."""

    rule: Rule
    strategy: tuple
    how: str  # the strategy in words, for the report
    in_layouts: tuple[Layout, ...]
    out_layouts: tuple[Layout, ...]
    halo: bool
    # per device, the local op's (frozen attributes, result types): set by the first emission
    local_ops: list[tuple[Mapping, tuple[Type, ...]]] | None = None
    # the Pmap body every device runs, when they all run the same local op (ir.sharding.spmd)
    body: Function | None = None
    # the first Pmap of ``body``: the decision's later ops are added like it (add_like)
    pmap: Op | None = None
