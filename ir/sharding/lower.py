"""Ranked lowering (seed 004): one single-device program per rank, deduplicated.

The distributed Function that :func:`ir.sharding.propagate` returns, or any
transform's program after ``unroll_pmap`` (pipelines, nested and 3D
compositions), is a global view: per-device ops, tuple collectives, two-sided
``Send``. Lowering walks it once and gives every rank (device) its own Function:

* the scatter / broadcast / ``Shard`` of an input becomes a rank *input* holding
  only that rank's block (local shapes; a tail block keeps its own shape, or,
  with ``pad=True``, arrives padded to the largest block and is sliced back);
  a per-device tuple input (nested ones too: a 3D step's microbatches) gives
  each rank its elements;
* a per-device op goes to its rank unchanged (values have device ``None``: the
  rank itself); an op that makes a tuple on one device (``Split``) too;
* ``Send(x, to_device=q)`` becomes ``SendTo(peer=q)`` on the sender and
  ``RecvFrom(peer=p)`` on the receiver, with one tag per message; scatters,
  broadcasts, gathers and reductions inside the program become such pairs
  plus local ``Slice``, ``Concat`` or ``Sum`` (``ir.sharding.lower_comm``);
* a tuple collective becomes a ``RankCollective`` on each member, one per group
  of a grouped collective;
* the final ``Gather`` / ``Reduce`` / ``Unshard`` becomes rank *outputs*.

Ranks whose programs differ only in rank parameters (slice offsets, peers,
groups, tags) form one *rank class* sharing one program, as the RFC's
"eliminate redundant ranked IRs" (``ir.sharding.rank_classes``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from ..builder import FunctionBuilder
from ..function import Function
from ..registry import OpKind, get_op
from ..types import TensorType, TupleType, devices_of
from ..value import Value
from ..verify import describe_op
from .errors import LoweringError
from .mesh import Layout, Mesh, P, R, S

_DISTRIBUTE = ("Scatter", "Broadcast", "Shard")
_COLLECT = ("Gather", "Reduce", "Unshard")

# A value's place in the rank programs: (rank, local value) for a tensor, a tuple of
# such places (nested as the value's tuple type) for a per-device tuple.
Rep = Any


@dataclass(frozen=True)
class Binding:
    """How one input (output) of the global program maps to rank inputs (outputs).

    ``layout`` is None when a single rank holds the whole tensor. ``positions``
    maps rank -> index among that rank's inputs (outputs); ``padded`` gives the
    padded block shape per rank when inputs are padded. A per-device tuple
    input or output (a steady-state step's resident state) lists its leaf
    tensors' ``(rank, index)`` in ``elements``, depth first; ``tree`` is the
    tuple's nesting with ``None`` for each leaf (``(None, None)`` for a flat pair).
    ``source`` is the position of the global input (output) it binds: an input that is
    both read whole and scattered, or scattered twice, has several bindings.
    """

    name: str
    layout: Layout | None
    positions: dict[int, int]
    padded: dict[int, tuple[int, ...]] = field(default_factory=dict)
    elements: tuple[tuple[int, int], ...] = ()
    tree: tuple = ()
    source: int = -1  # the global input's (output's) position; -1: unknown

    def flatten(self, value: Any) -> list:
        """The leaves of a per-device tuple ``value``, in the order of ``elements``."""
        return _flatten(self.tree, value, self.name)

    def unflatten(self, leaves: list) -> tuple:
        """The per-device tuple whose leaves are ``leaves`` (the inverse of ``flatten``)."""
        it = iter(leaves)

        def build(tree: tuple) -> tuple:
            return tuple(next(it) if t is None else build(t) for t in tree)

        return build(self.tree or (None,) * len(leaves))


def _flatten(tree: tuple, value: Any, name: str) -> list:
    if not isinstance(value, tuple | list) or len(value) != len(tree):
        raise LoweringError(
            f"input {name!r} must be a tuple of {len(tree)} elements (one per device or "
            f"microbatch), got {type(value).__name__}"
        )
    out: list = []
    for t, x in zip(tree, value):
        out += [x] if t is None else _flatten(t, x, name)
    return out


@dataclass(frozen=True)
class RankedProgram:
    """One program per rank, the unique ones (one per rank class), and how to feed and
    read them.

    ``programs[r]`` is rank ``r``'s own program. Ranks of one class run
    ``unique[dedup[r]]`` with ``parameters[r]`` applied: ``{(op index, attribute):
    value}``, the rank's slice offsets, peers, groups and tags where they differ from
    the class program's (``program_for(r)`` applies them).
    """

    programs: dict[int, Function]
    unique: tuple[Function, ...]
    dedup: dict[int, int]  # rank -> index into unique
    inputs: tuple[Binding, ...]
    outputs: tuple[Binding, ...]
    parameters: dict[int, dict[tuple[int, str], Any]] = field(default_factory=dict)

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(sorted(self.programs))

    @property
    def num_unique(self) -> int:
        return len(self.unique)

    @property
    def classes(self) -> tuple[tuple[int, ...], ...]:
        """The ranks of each unique program, in the order of ``unique``."""
        return tuple(tuple(self.ranks_of(i)) for i in range(len(self.unique)))

    def ranks_of(self, index: int) -> list[int]:
        """The ranks that run unique program ``index``."""
        return [r for r in self.ranks if self.dedup[r] == index]

    def program_for(self, rank: int) -> Function:
        """Rank ``rank``'s program rebuilt from its class program and its parameters."""
        from .rank_classes import instantiate

        return instantiate(self.unique[self.dedup[rank]], self.parameters.get(rank, {}))

    def __str__(self) -> str:
        parts = []
        for i, f in enumerate(self.unique):
            ranks = self.ranks_of(i)
            params = sorted({key for r in ranks for key in self.parameters.get(r, {})})
            note = ""
            if params:
                shown = ", ".join(f"op {k} {a}" for k, a in params)
                note = f" (rank parameters: {shown})"
            parts.append(f"# ranks {ranks}{note}\n{f}")
        return "\n".join(parts)


def lower_to_ranks(function: Function, *, pad: bool = False) -> RankedProgram:
    """Split a distributed Function into deduplicated per-rank programs (module doc).

    Pmaps (a propagated step's symmetric ops, a transform's stage bodies) are unrolled
    into per-device ops first, and tasks written out in their place.
    """
    if any(op.subfunctions for op in function.ops):  # pmaps and tasks
        from ..transforms.unroll import unroll_pmap

        function = unroll_pmap(function)
    return _Lowering(function, pad).run()


def _layout_of(op) -> Layout:
    a = op.attributes
    if op.op_type in ("Shard", "Unshard"):
        return Layout.from_attributes(a)
    if op.op_type in ("Scatter", "Broadcast"):
        devices = tuple(a["devices"])
    else:
        devices = tuple(e.device for e in op.inputs[0].type.elements)
    mesh = Mesh((len(devices),), devices)
    if op.op_type == "Broadcast":
        return Layout(mesh, [R])
    if op.op_type == "Reduce":
        return Layout(mesh, [P(a["op"])])
    return Layout(mesh, [S(a["dim"])])


def _is_single(rep: Rep) -> bool:
    return isinstance(rep, tuple) and len(rep) == 2 and isinstance(rep[1], Value)


def leaves(rep: Rep) -> list[tuple[int, Value]]:
    """The (rank, local value) pairs of a place, depth first."""
    if _is_single(rep):
        return [rep]
    return [leaf for e in rep for leaf in leaves(e)]


def _tree(rep: Rep) -> tuple:
    return tuple(None if _is_single(e) else _tree(e) for e in rep)


def _distinct_devices(op) -> bool:
    devices = [e.device for e in op.inputs[0].type.elements if isinstance(e, TensorType)]
    return len(devices) == len(op.inputs[0].type.elements) == len(set(devices))


class _Lowering:
    def __init__(self, function: Function, pad: bool) -> None:
        self.f = function
        self.pad = pad
        self.builders: dict[int, FunctionBuilder] = {}
        self.rep: dict[Value, Rep] = {}  # global value -> its place
        self.inputs: list[Binding] = []
        self.outputs: list[Binding] = []
        self.tag = 0
        self.source = {v: i for i, v in enumerate(function.inputs)}

    def rank(self, r) -> FunctionBuilder:
        if not isinstance(r, int):
            raise LoweringError(f"device {r!r} is not a concrete rank; bind device variables first")
        if r not in self.builders:
            self.builders[r] = FunctionBuilder(f"{self.f.name}_rank{r}")
        return self.builders[r]

    def next_tag(self) -> int:
        self.tag += 1
        return self.tag

    def run(self) -> RankedProgram:
        from .rank_classes import classes

        inputs = set(self.f.inputs)
        for x in self.f.inputs:
            users = self.f.consumers[x]
            if not users or any(op.op_type not in _DISTRIBUTE for op in users):
                self._whole_input(x)
        out_slots: dict[int, list[Value]] = {}
        for op in self.f.ops:
            if op.op_type in _DISTRIBUTE and op.inputs[0] in inputs:
                self._distributed_input(op)
            elif self._collected_output(op):
                continue  # handled with the outputs
            else:
                self._op(op)
        for v in self.f.outputs:
            self._output(v, out_slots)
        programs = {r: b.finish(out_slots.get(r, [])) for r, b in sorted(self.builders.items())}
        unique, dedup, parameters = classes(programs)
        # in the order of the global inputs (stable: one input's bindings keep their order)
        bindings = sorted(self.inputs, key=lambda b: b.source)
        outputs = [replace(b, source=i) for i, b in enumerate(self.outputs)]
        return RankedProgram(programs, unique, dedup, tuple(bindings), tuple(outputs), parameters)

    def _collected_output(self, op) -> bool:
        """A final Gather / Reduce / Unshard over distinct ranks: read back as rank outputs."""
        outputs = set(self.f.outputs)
        return (
            op.op_type in _COLLECT
            and all(v in outputs and not self.f.consumers[v] for v in op.outputs)
            and (op.op_type == "Unshard" or _distinct_devices(op))
        )

    # -- inputs and outputs --------------------------------------------------------------

    def _whole_input(self, x: Value) -> None:
        if isinstance(x.type, TupleType):
            self._tuple_input(x)
            return
        b = self.rank(x.type.device)
        pos = len(b._inputs)
        self.rep[x] = (x.type.device, b.input(x.name, x.type.with_device(None)))
        self.inputs.append(Binding(x.name, None, {x.type.device: pos}, source=self.source[x]))

    def _tuple_input(self, x: Value) -> None:
        """A per-device tuple input: each leaf is an input of the rank that holds it."""
        elements: list[tuple[int, int]] = []

        def place(t) -> Rep:
            if isinstance(t, TupleType):
                return tuple(place(e) for e in t.elements)
            b = self.rank(t.device)
            elements.append((t.device, len(b._inputs)))
            return (t.device, b.input(x.name, t.with_device(None)))

        rep = place(x.type)
        self.rep[x] = rep
        self.inputs.append(
            Binding(
                x.name, None, {}, elements=tuple(elements), tree=_tree(rep), source=self.source[x]
            )
        )

    def _distributed_input(self, op) -> None:
        x = op.inputs[0]
        layout = _layout_of(op)
        (xs,) = op.outputs
        reps, positions, padded = [], {}, {}
        big = tuple(max(e.shape[i] for e in xs.type.elements) for i in range(x.type.rank))
        for e in xs.type.elements:
            b = self.rank(e.device)
            positions[e.device] = len(b._inputs)
            shape = big if self.pad else e.shape
            padded[e.device] = shape
            v = b.input(x.name, TensorType(shape, e.dtype, None))
            for axis, (have, want) in enumerate(zip(shape, e.shape)):
                if have != want:
                    v = b.call("Slice", v, axis=axis, start=0, end=want, name=f"{x.name}_tail")
            reps.append((e.device, v))
        self.rep[xs] = tuple(reps)
        self.inputs.append(
            Binding(x.name, layout, positions, padded if self.pad else {}, source=self.source[x])
        )

    def _output(self, v: Value, slots: dict[int, list[Value]]) -> None:
        op = self.f.producers.get(v)
        if op is not None and self._collected_output(op) and op.inputs[0] in self.rep:
            layout = _layout_of(op)
            positions = {}
            for r, local in self.rep[op.inputs[0]]:
                positions[r] = len(slots.setdefault(r, []))
                slots[r].append(local)
            self.outputs.append(Binding(v.name, layout, positions))
            return
        rep = self.local(v)
        if _is_single(rep):
            r, local = rep
            self.outputs.append(Binding(v.name, None, {r: len(slots.setdefault(r, []))}))
            slots[r].append(local)
            return
        elements = []
        for r, local in leaves(rep):
            elements.append((r, len(slots.setdefault(r, []))))
            slots[r].append(local)
        self.outputs.append(Binding(v.name, None, {}, elements=tuple(elements), tree=_tree(rep)))

    # -- ops -------------------------------------------------------------------------------

    def local(self, v: Value) -> Rep:
        rep = self.rep.get(v)
        if rep is None:
            raise LoweringError(f"value {v.name!r} has no rank (it is used before it is placed)")
        return rep

    def single(self, v: Value, op) -> tuple[int, Value]:
        rep = self.local(v)
        if not _is_single(rep):
            raise LoweringError(f"{describe_op(op)}: {v.name!r} must be one tensor on one rank")
        return rep

    def _op(self, op) -> None:
        t = op.op_type
        if t == "TupleGet":
            self.rep[op.outputs[0]] = self.local(op.inputs[0])[op.attributes["index"]]
        elif t == "MakeTuple":
            self.rep[op.outputs[0]] = tuple(self.local(v) for v in op.inputs)
        elif (rule := get_op(t).lower_rule) is not None:  # ir.sharding.lower_comm's
            rule(self, op)
        elif op.subfunctions or get_op(t).kind is OpKind.COMMUNICATION:
            raise LoweringError(
                f"cannot lower {describe_op(op)}: expected per-device ops, tuple collectives, "
                "sends, scatters, broadcasts, gathers and reductions (unroll pmaps first)"
            )
        else:
            self._compute(op)

    def _compute(self, op) -> None:
        r = op.device
        if r is None:  # an op that makes a tuple on one device (a microbatch Split)
            found = {d for v in (*op.inputs, *op.outputs) for d in devices_of(v.type)}
            if len(found) != 1:
                raise LoweringError(
                    f"cannot lower {describe_op(op)}: a compute op must run on one device, "
                    f"its values are on {sorted(map(str, found))}"
                )
            (r,) = found
        b = self.rank(r)
        ins = [self._on_rank(v, r, op) for v in op.inputs]
        attrs = dict(op.attributes)
        if "device" in attrs:
            attrs["device"] = None
        new = b.add_op(
            op.op_type, ins, attrs, names=[v.name for v in op.outputs], subfunctions=op.subfunctions
        )
        for v, nv in zip(op.outputs, new.outputs):
            self.rep[v] = self._unpacked(b, r, nv)

    def _on_rank(self, v: Value, r: int, op, rep: Rep = None) -> Value:
        """``v`` (or its element ``rep``) as one local value on rank ``r`` (a tuple rebuilt
        with ``MakeTuple``); a part on another rank is an error naming both ranks."""
        rep = self.local(v) if rep is None else rep
        if _is_single(rep):
            if rep[0] != r:
                raise LoweringError(
                    f"{describe_op(op)} on rank {r} reads {v.name!r} (or an element of it) "
                    f"on rank {rep[0]}"
                )
            return rep[1]
        parts = [self._on_rank(v, r, op, e) for e in rep]
        return self.rank(r).call("MakeTuple", *parts, name=f"{v.name}_local")

    def _unpacked(self, b: FunctionBuilder, r: int, local: Value) -> Rep:
        """A local tuple as a tuple of places (``TupleGet`` per element), a tensor as is."""
        if not isinstance(local.type, TupleType):
            return (r, local)
        names = [f"{local.name}_{i}" for i in range(len(local.type.elements))]
        return tuple(self._unpacked(b, r, e) for e in b.unpack(local, names))
