"""Choosing an op's sharding strategy: each strategy's predicted time, the cheapest valid one.

A strategy's time is the redistribution of its operands from the cheapest layout
they already have (``ir.sharding.redistribute``'s plans on the topology), the
redistribution of its results to their desired layouts, a halo exchange where it
has one, and the op's compute divided over its shards. The cheapest strategy whose
local ops type-check on every device wins (ties: the first enumerated).

An optimizer update of resident state (a steady-state step's carried state) is costed
as the step runs it: its gradient's reduction starts where the backward pass makes the
gradient and overlaps the backward that follows, so it is not counted; its results go
back to the layout of the state they update (where ``_keep`` puts them), after the
update, at the end of the step, where nothing overlaps them, so that is counted in
full. With replicated state this weighs a replicated update (all-reduced gradient, the
whole update on every device: DDP, Megatron) against a sharded one (reduce-scattered
gradient, 1/n of the update, the new state all-gathered: ZeRO) by what the simulator
finds: the update's compute saved against the all-gathers it adds to the step's end.

:class:`Chooser` is the part of propagation's materialiser that does this; the
materialiser (``ir.sharding.propagate``) sets the state it reads: ``mesh``,
``topology``, ``desired``, ``dist``, ``views``, ``device`` (whose roofline costs
compute, in each op's dtype) and
the memo tables made by :meth:`Chooser.init_choice`.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping

from ..errors import VerifyError
from ..op import Op
from ..registry import CostContext, get_op
from ..types import Type, compute_dtype
from ..value import Value
from ..verify import describe_op, infer_types
from . import halo
from .annotations import shape_of
from .errors import PropagationError
from .facts import ProgramFacts
from .mesh import Layout, shape_fits
from .redistribute import DistValue, RedistributionCosts, local_types
from .rules import placements_for, strategies


class Chooser:
    """Strategy choice and costing, memoised per propagation (one mesh, one topology)."""

    def init_choice(
        self, ops: Iterable[Op], carried: Mapping[Value, Value], facts: ProgramFacts
    ) -> None:
        """The memo tables; call once the mesh and topology are set. ``carried``: each
        updated state (an optimizer's result the step returns) -> the input it updates;
        ``facts``: the program's rules (read once per program, not per propagation)."""
        self._facts = facts
        self._carried = {v: x for v, x in carried.items() if v is not x}
        # each update of carried state (of ``ops``) -> its gradient operands, whose
        # reductions overlap the backward pass
        self._overlapped: dict[Op, frozenset[Value]] = {}
        for op in ops:
            states = {self._carried[v] for v in op.outputs if v in self._carried}
            if states:
                self._overlapped[op] = frozenset(x for x in op.inputs if x not in states)
        self._plan_times: dict[tuple, float | PropagationError] = {}
        self._costs = RedistributionCosts(self.topology)
        self._layouts: dict[tuple, Layout] = {}
        self._whole_compute_s: dict = {}
        self._local_type_lists: dict[tuple, list[Type]] = {}

    def _plan_time_s(self, t: Type, src: Layout, dst: Layout) -> float:
        key = (t, src, dst)
        if key not in self._plan_times:  # strategies of many ops ask the same question
            try:
                self._plan_times[key] = self._costs.plan_time_s(t, src, dst)
            except PropagationError as e:
                self._plan_times[key] = e
        found = self._plan_times[key]
        if isinstance(found, PropagationError):
            raise found
        return found

    def _source(self, v: Value, target: Layout) -> tuple[float, DistValue]:
        """The cheapest layout ``v`` already has to redistribute from, and its time."""
        best = None
        for have in (self.dist[v], *self.views.get(v, {}).values()):
            t = self._plan_time_s(v.type, have.layout, target)
            if best is None or t < best[0]:
                best = (t, have)
        assert best is not None
        return best

    def _compute_time_s(self, op, shards: int) -> float:
        whole = self._whole_compute_s.get(op)
        if whole is None:  # every strategy of ``op`` asks; only ``shards`` differs
            whole = self._whole_compute_s[op] = self._whole_time_s(op)
        return whole / shards

    def _whole_time_s(self, op) -> float:
        opdef = get_op(op.op_type)
        cost = opdef.cost_rule(
            CostContext(
                tuple(v.type for v in op.inputs), tuple(v.type for v in op.outputs), op.attributes
            )
        )
        types = [v.type for v in (*op.inputs, *op.outputs)]
        # the simulator's own time of the op (Device.op_time_s: its kernel model, or the
        # roofline plus launch), so propagation ranks strategies as the simulation will
        return self.device.op_time_s(
            cost, compute_dtype(types), allow_tf32=self.topology.allow_tf32
        )

    def _cost(self, op, rule, strategy, ins, outs) -> float:
        """The predicted time of ``op`` under ``strategy``: its terms, summed in order."""
        total = 0.0
        for i in range(self._term_count(op, strategy)):
            total += self._term_s(op, rule, strategy, (ins, outs), i)
        return total + self._compute_time_s(op, self._shards(strategy))

    def _term_count(self, op, strategy) -> int:
        halo_term = any(c[0] == "halo" for c in strategy)
        return len(op.inputs) + len(op.outputs) + halo_term

    def _term_s(self, op, rule, strategy, pl, i: int) -> float:
        """Term ``i`` of a strategy's time, compute aside: redistributing operand ``i`` from
        its cheapest current layout (0 for an update's gradient: see the module doc), then
        each result to its desired layout, or an updated state's to its input's (0 where it
        cannot), then the halo exchange. Raises PropagationError for an impossible operand."""
        ins, outs = pl
        if i < len(op.inputs):
            v = op.inputs[i]
            time_s = self._source(v, self._layout_of(ins[i]))[0]  # (raises if impossible)
            overlapped = self._overlapped.get(op)
            return 0.0 if overlapped is not None and v in overlapped else time_s
        j = i - len(op.inputs)
        if j < len(op.outputs):
            v, ps = op.outputs[j], outs[j]
            state = self._carried.get(v)
            if state is not None:  # updated state goes back to its input's layout
                want = self.dist[state].layout
            else:
                want = self._layout_of(self.desired.get(v, ps))
            try:
                return self._plan_time_s(v.type, self._layout_of(ps), want)
            except PropagationError:  # cannot reach its desired layout: no cost counted
                return 0.0
        return halo.exchange_time_s(op, rule, self.mesh, strategy, self.topology)

    def _shards(self, strategy) -> int:
        shards = 1
        for k, c in enumerate(strategy):
            if c[0] in ("shard", "halo"):
                shards *= self.mesh.shape[k]
        return shards

    def _layout_of(self, placements) -> Layout:
        """``Layout(self.mesh, placements)``, one object per placements: layouts key memos."""
        placements = tuple(placements)
        found = self._layouts.get(placements)
        if found is None:
            found = self._layouts[placements] = Layout(self.mesh, placements)
        return found

    def _choose(self, op) -> tuple:
        """The rule of ``op`` and its cheapest locally valid strategy, with its placements.

        The candidates in order of (time, enumeration index), first the cheapest, as if all
        were costed and sorted; but lazily: a candidate's time is a sum of non-negative
        terms (``_term_s``) then its compute, and every partial sum is a lower bound of it
        (rounding is monotone), so a heap of (bound, index) refines the least-bound
        candidate one term at a time and only a candidate whose time is complete is taken.
        Candidates costlier than the winner stop after a term or two.
        """
        rule = self._facts.rule(op)
        current = [self.dist[v].layout.placements for v in op.inputs]
        heap: list[tuple] = []  # (bound or time, index, terms summed or _DONE, strategy, pl)
        for n, strategy in enumerate(strategies(rule, self.mesh, current)):
            pl = placements_for(rule, strategy)
            if pl is None or not self._fits(op, pl):
                continue
            heap.append((0.0, n, 0, strategy, pl))
        heapq.heapify(heap)  # (indices differ: entries never compare further)
        while heap:
            total, n, done, strategy, pl = heapq.heappop(heap)
            if done == _DONE:  # its whole time, and no other candidate can come before it
                if self._locally_valid(op, rule, strategy, *pl):
                    return (rule, strategy, *pl)
                continue
            try:
                if done < self._term_count(op, strategy):
                    total += self._term_s(op, rule, strategy, pl, done)
                    heapq.heappush(heap, (total, n, done + 1, strategy, pl))
                else:
                    total += self._compute_time_s(op, self._shards(strategy))
                    heapq.heappush(heap, (total, n, _DONE, strategy, pl))
            except PropagationError:  # an operand cannot be redistributed so: not a candidate
                continue
        raise PropagationError(
            f"no sharding strategy places {describe_op(op)} on mesh {list(self.mesh.shape)} "
            f"(operands are {[str(Layout(self.mesh, c)) for c in current]})"
        )

    def _fits(self, op, pl) -> bool:
        """Whether every operand and result can hold its placements (``Layout.check``)."""
        ins, outs = pl
        mesh_shape = self.mesh.shape
        for values, placements in ((op.inputs, ins), (op.outputs, outs)):
            for v, ps in zip(values, placements):
                if not shape_fits(shape_of(v), mesh_shape, ps):
                    return False
        return True

    def _local_inputs(self, op, ins) -> list[list[Type]]:
        per_operand = [local_types(v.type, self._layout_of(ps)) for v, ps in zip(op.inputs, ins)]
        return [[t[i] for t in per_operand] for i in range(self.mesh.size)]

    def _locally_valid(self, op, rule, strategy, ins, outs) -> bool:
        if any(c[0] == "halo" for c in strategy):
            return halo.valid(op, rule, self.mesh, strategy, ins, outs)
        expected = [local_types(v.type, self._layout_of(ps)) for v, ps in zip(op.outputs, outs)]
        opdef = get_op(op.op_type)
        for i, local_in in enumerate(self._local_inputs(op, ins)):
            want = [e[i] for e in expected]
            attrs = self._local_attrs(op, rule, local_in, want, self.mesh.devices[i])
            try:
                got, _ = infer_types(opdef, local_in, attrs, op.subfunctions)
            except VerifyError:
                return False
            if [_shapes(t) for t in got] != [_shapes(t) for t in want]:
                return False
        return True

    def _local_attrs(self, op, rule, local_in, local_out, device) -> dict:
        attrs = dict(op.attributes)
        if rule.local_attributes is not None:
            attrs = dict(rule.local_attributes(attrs, local_in, local_out))
        if not op.inputs and "device" in attrs:
            attrs["device"] = device
        return attrs

    def _local_types(self, t: Type, placements) -> list[Type]:
        """``local_types`` memoised: a repeated layer's results ask it the same question."""
        key = (t, tuple(placements))
        found = self._local_type_lists.get(key)
        if found is None:
            found = self._local_type_lists[key] = local_types(t, self._layout_of(placements))
        return found


_DONE = -1  # a heap entry whose time is complete (below every count of terms done)


def _shapes(t: Type):
    return tuple(_shapes(e) for e in t.elements) if hasattr(t, "elements") else t.shape
