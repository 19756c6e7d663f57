"""Which ops of a program share a node of the logical graph view.

One node per logical op: per-device copies of one op (as a propagated program writes
them) count as one; above ``GraphOptions.max_ops`` items, repeated layers fold into one
node, then runs of items on the same devices (a pipeline stage's forward or backward of
one microbatch). :class:`NodePlan` decides; :mod:`widgets.logical` draws.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ir.function import Function
from ir.op import Op
from ir.registry import OpKind, get_op
from ir.types import DeviceRef, TensorType, TupleType, Type, devices_of

from .collapse import find_repeats
from .ids import op_id, shape_label

if TYPE_CHECKING:
    from .graph import GraphOptions


class NodePlan:
    """The items (future nodes) of ``function``'s logical view, and where each runs.

    ``paths`` are the ops' index paths (:func:`widgets.ids.op_paths`); ``fold`` says,
    once :meth:`items` ran, whether there were more items than ``options.max_ops``.
    """

    def __init__(self, function: Function, paths: dict[Op, str], options: GraphOptions) -> None:
        self.function = function
        self.paths = paths
        self.options = options
        self.fold = False
        self._devices_memo: dict[Op, tuple[DeviceRef, ...]] = {}

    def items(self) -> list[Item]:
        """What gets a node, in program order: each logical op (per-device copies of one
        op, as a propagated program writes them, count as one); above ``max_ops``,
        repeated layers fold, then runs of items on the same devices; a fold or a set of
        copies the user opened shows its members."""
        items = self._units()
        budget = self.options.max_ops
        self.fold = budget is not None and len(items) > budget
        if budget is None or not self.fold:
            return items
        sigs = [item.signature(self.item_devices(item)) for item in items]
        folded: list[Item] = []
        at = 0
        for r in find_repeats(sigs, budget=budget, min_count=3, min_gain=2):
            hidden = items[r.start + r.period : r.start + r.period * r.count]
            folded += items[at : r.start + r.period]
            at = r.start + r.period * r.count
            block = [t for item in items[r.start : r.start + r.period] for t in item.types]
            fold = Item.folding(hidden, f"{r.count - 1} more × ", block)
            folded += hidden if self.group_id(fold) in self.options.expanded else [fold]
        folded += items[at:]
        if len(folded) <= budget:
            return folded
        out: list[Item] = []
        run: list[Item] = []
        last: frozenset | None = None
        for item in [*folded, None]:
            where = None if item is None else frozenset(self.item_devices(item))
            alone = item is not None and item.ops[0].op_type == "SendEach"
            if run and (alone or where != last or item is None):
                fold = Item.folding(run, "")
                keep = len(run) > 1 and self.group_id(fold) not in self.options.expanded
                out += [fold] if keep else run
                run = []
            if item is not None:
                run.append(item)
            last = None if alone else where
        return out

    def _units(self) -> list[Item]:
        """Top-level ops, consecutive per-device copies of one op merged."""
        units: list[Item] = []
        taken: set[DeviceRef] = set()  # where the copies of the last unit write
        for op in self.function.ops:
            devices = {d for v in op.outputs for d in value_devices(v.type)}
            head = units[-1] if units else None
            if (
                head is not None
                and len(devices) == 1
                and _copyable(op)
                and _same_op(head.ops[0], op)
                and not devices & taken
            ):
                head.ops.append(op)
                head.kind = "copies"
                taken |= devices
                continue
            units.append(Item("op", [op], [_type_of(op)]))
            taken = devices
        out: list[Item] = []
        for u in units:
            if u.kind == "copies" and op_id(self.paths[u.ops[0]]) in self.options.expanded:
                out += [Item("op", [op], [op.op_type]) for op in u.ops]
            else:
                out.append(u)
        return out

    def item_devices(self, item: Item) -> tuple[DeviceRef, ...]:
        if item.devices is None:
            item.devices = tuple(dict.fromkeys(d for op in item.ops for d in self.op_devices(op)))
        return item.devices

    def group_id(self, item: Item) -> str:
        """The id of the summary node that folds ``item``."""
        return f"group-{self.paths[item.ops[0]]}-{self.paths[item.ops[-1]]}"

    def op_devices(self, op: Op) -> tuple[DeviceRef, ...]:
        """Where ``op`` runs: the devices it writes (a communication op: also those it
        reads), its own device when it writes none; memoised."""
        known = self._devices_memo.get(op)
        if known is not None:
            return known
        # a compute op runs where it writes (reading its inputs too costs a third of
        # the drawing's time); a communication op spans its sources and destinations
        comm = get_op(op.op_type).kind is OpKind.COMMUNICATION
        values = (*op.inputs, *op.outputs) if comm or not op.outputs else op.outputs
        seen = dict.fromkeys(d for v in values for d in value_devices(v.type))
        if op.device is not None and not seen:
            seen[op.device] = None
        dest = op.attributes.get("to_devices") if op.op_type == "SendEach" else None
        seen.update(dict.fromkeys(dest or ()))
        known = self._devices_memo[op] = tuple(seen) or (None,)
        return known


def value_devices(t: Type) -> tuple[DeviceRef, ...]:
    """:func:`devices_of`, using a tuple of tensors' cached device list (the logical
    program's values are per-device tuples; this walk is most of the drawing's time)."""
    if isinstance(t, TupleType) and t.nesting == 1:
        return t.devices
    return devices_of(t)


@dataclass
class Item:
    """What one node of the logical view stands for: one op, per-device copies of one
    op, or a fold of several items (``types``: one op type per logical op inside)."""

    kind: str  # "op", "copies" or "fold"
    ops: list[Op]
    types: list[str]
    head: str = ""  # a repeat fold's label prefix: "5 more × "
    block: list[str] | None = None  # a repeat fold: the op types of the repeated layer
    devices: tuple[DeviceRef, ...] | None = None  # where its ops run, once known

    @staticmethod
    def folding(items: list[Item], head: str, block: list[str] | None = None) -> Item:
        ops = [op for item in items for op in item.ops]
        return Item("fold", ops, [t for item in items for t in item.types], head, block)

    def signature(self, devices: tuple[DeviceRef, ...]) -> tuple:
        """What must match for two items to be the same step of a repeated layer."""
        op = self.ops[0]
        body = sum(s.num_ops() for s in op.subfunctions)
        return (self.kind, tuple(self.types), len(self.ops), frozenset(devices), body)


def _type_of(op: Op) -> str:
    """What a fold's label calls ``op``: a one-op pmap (a propagated step writes each op
    as one) by its body's op, ``MatMul``, not ``Pmap``."""
    if op.op_type == "Pmap" and len(op.subfunctions[0].ops) == 1:
        return op.subfunctions[0].ops[0].op_type
    return op.op_type


def _copyable(op: Op) -> bool:
    return not op.subfunctions and get_op(op.op_type).kind is not OpKind.COMMUNICATION


def _same_op(a: Op, b: Op) -> bool:
    """``b`` is another device's copy of ``a``: same type, arity and output shapes."""
    return (
        a.op_type == b.op_type
        and len(a.inputs) == len(b.inputs)
        and [_shape(v.type) for v in a.outputs] == [_shape(v.type) for v in b.outputs]
    )


def _shape(t: Type) -> object:
    return (t.shape, t.dtype) if isinstance(t, TensorType) else shape_label(t)
