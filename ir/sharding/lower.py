"""Ranked lowering (seed 004): one single-device program per rank, deduplicated.

The distributed Function that :func:`ir.sharding.propagate` returns is a global
view: per-device ops, tuple collectives, two-sided ``Send``. Lowering walks it
once and gives every rank (device) its own Function:

* the scatter / broadcast / ``Shard`` of an input becomes a rank *input* holding
  only that rank's block (local shapes; a tail block keeps its own shape, or,
  with ``pad=True``, arrives padded to the largest block and is sliced back);
* a per-device op goes to its rank unchanged (values have device ``None``: the
  rank itself);
* ``Send(x, to_device=q)`` becomes ``SendTo(peer=q)`` on the sender and
  ``RecvFrom(peer=p)`` on the receiver, with one tag per message;
* a tuple collective becomes a ``RankCollective`` on each member;
* the final ``Gather`` / ``Reduce`` / ``Unshard`` becomes rank *outputs*.

Ranks whose programs are equivalent share one program (``dedup``), as the RFC's
"eliminate redundant ranked IRs".
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..builder import FunctionBuilder
from ..function import Function
from ..types import TensorType, TupleType
from ..value import Value
from ..verify import describe_op
from .errors import LoweringError
from .mesh import Layout, Mesh, P, R, S

_DISTRIBUTE = ("Scatter", "Broadcast", "Shard")
_COLLECT = ("Gather", "Reduce", "Unshard")
_TUPLE_COLLECTIVES = {
    "AllReduce": "allreduce",
    "AllGather": "allgather",
    "ReduceScatter": "reducescatter",
    "AllToAll": "alltoall",
}


@dataclass(frozen=True)
class Binding:
    """How one input (output) of the global program maps to rank inputs (outputs).

    ``layout`` is None when a single rank holds the whole tensor. ``positions``
    maps rank -> index among that rank's inputs (outputs); ``padded`` gives the
    padded block shape per rank when inputs are padded. A per-device tuple
    input or output (a steady-state step's resident state) lists its elements'
    ``(rank, index)`` in ``elements``.
    """

    name: str
    layout: Layout | None
    positions: dict[int, int]
    padded: dict[int, tuple[int, ...]] = field(default_factory=dict)
    elements: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class RankedProgram:
    """One program per rank, the unique ones, and how to feed and read them."""

    programs: dict[int, Function]
    unique: tuple[Function, ...]
    dedup: dict[int, int]  # rank -> index into unique
    inputs: tuple[Binding, ...]
    outputs: tuple[Binding, ...]

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(sorted(self.programs))

    @property
    def num_unique(self) -> int:
        return len(self.unique)

    def ranks_of(self, index: int) -> list[int]:
        """The ranks that run unique program ``index``."""
        return [r for r in self.ranks if self.dedup[r] == index]

    def __str__(self) -> str:
        parts = []
        for i, f in enumerate(self.unique):
            parts.append(f"# ranks {self.ranks_of(i)}\n{f}")
        return "\n".join(parts)


def lower_to_ranks(function: Function, *, pad: bool = False) -> RankedProgram:
    """Split a distributed Function into deduplicated per-rank programs (module doc)."""
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


def _is_single(rep) -> bool:
    return isinstance(rep, tuple) and len(rep) == 2 and isinstance(rep[1], Value)


class _Lowering:
    def __init__(self, function: Function, pad: bool) -> None:
        self.f = function
        self.pad = pad
        self.builders: dict[int, FunctionBuilder] = {}
        self.rep: dict[Value, object] = {}  # global value -> (rank, local) or tuple of reps
        self.inputs: list[Binding] = []
        self.outputs: list[Binding] = []
        self.tag = 0

    def rank(self, r) -> FunctionBuilder:
        if not isinstance(r, int):
            raise LoweringError(f"device {r!r} is not a concrete rank; bind device variables first")
        if r not in self.builders:
            self.builders[r] = FunctionBuilder(f"{self.f.name}_rank{r}")
        return self.builders[r]

    def run(self) -> RankedProgram:
        outputs_only = set(self.f.outputs)
        inputs = set(self.f.inputs)
        for x in self.f.inputs:
            users = self.f.consumers[x]
            if not users or any(op.op_type not in _DISTRIBUTE for op in users):
                self._whole_input(x)
        out_slots: dict[int, list[Value]] = {}
        for op in self.f.ops:
            if op.op_type in _DISTRIBUTE and op.inputs[0] in inputs:
                self._distributed_input(op)
            elif op.op_type in _COLLECT and all(
                v in outputs_only and not self.f.consumers[v] for v in op.outputs
            ):
                continue  # handled with the outputs
            else:
                self._op(op)
        for v in self.f.outputs:
            self._output(v, out_slots)
        programs = {r: b.finish(out_slots.get(r, [])) for r, b in sorted(self.builders.items())}
        unique: list[Function] = []
        dedup: dict[int, int] = {}
        for r, prog in programs.items():
            for i, u in enumerate(unique):
                if u.is_equivalent(prog):
                    dedup[r] = i
                    break
            else:
                dedup[r] = len(unique)
                unique.append(prog)
        return RankedProgram(
            programs, tuple(unique), dedup, tuple(self.inputs), tuple(self.outputs)
        )

    # -- inputs and outputs --------------------------------------------------------------

    def _whole_input(self, x: Value) -> None:
        if isinstance(x.type, TupleType):
            self._tuple_input(x)
            return
        b = self.rank(x.type.device)
        pos = len(b._inputs)
        self.rep[x] = (x.type.device, b.input(x.name, x.type.with_device(None)))
        self.inputs.append(Binding(x.name, None, {x.type.device: pos}))

    def _tuple_input(self, x: Value) -> None:
        """A per-device tuple input: element i is an input of the rank that holds it."""
        reps, elements = [], []
        for e in x.type.elements:
            if not isinstance(e, TensorType):
                raise LoweringError(f"input {x.name!r}: nested tuple inputs are not supported")
            b = self.rank(e.device)
            elements.append((e.device, len(b._inputs)))
            reps.append((e.device, b.input(x.name, e.with_device(None))))
        self.rep[x] = tuple(reps)
        self.inputs.append(Binding(x.name, None, {}, elements=tuple(elements)))

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
        self.inputs.append(Binding(x.name, layout, positions, padded if self.pad else {}))

    def _output(self, v: Value, slots: dict[int, list[Value]]) -> None:
        op = self.f.producers.get(v)
        if op is not None and op.op_type in _COLLECT and op.inputs[0] in self.rep:
            layout = _layout_of(op)
            positions = {}
            for r, local in self.rep[op.inputs[0]]:  # type: ignore[misc]
                positions[r] = len(slots.setdefault(r, []))
                slots[r].append(local)
            self.outputs.append(Binding(v.name, layout, positions))
            return
        rep = self._local(v)
        if all(_is_single(e) for e in rep):  # type: ignore[union-attr]
            elements = []
            for r, local in rep:  # type: ignore[union-attr]
                elements.append((r, len(slots.setdefault(r, []))))
                slots[r].append(local)
            self.outputs.append(Binding(v.name, None, {}, elements=tuple(elements)))
            return
        if not _is_single(rep):
            raise LoweringError(f"output {v.name!r} is neither a tensor nor a per-device tuple")
        r, local = rep  # type: ignore[misc]
        self.outputs.append(Binding(v.name, None, {r: len(slots.setdefault(r, []))}))
        slots[r].append(local)

    # -- ops -------------------------------------------------------------------------------

    def _local(self, v: Value):
        rep = self.rep.get(v)
        if rep is None:
            raise LoweringError(f"value {v.name!r} has no rank (it is used before it is placed)")
        return rep

    def _op(self, op) -> None:
        t = op.op_type
        if t == "TupleGet":
            self.rep[op.outputs[0]] = self._local(op.inputs[0])[op.attributes["index"]]
        elif t == "MakeTuple":
            self.rep[op.outputs[0]] = tuple(self._local(v) for v in op.inputs)
        elif t == "Send":
            self._send(op)
        elif t in _TUPLE_COLLECTIVES:
            self._collective(op)
        elif t == "Pmap" or op.device is None or t in _DISTRIBUTE or t in _COLLECT:
            raise LoweringError(
                f"cannot lower {describe_op(op)}: expected per-device ops, tuple collectives and "
                "Send (unroll pmaps first; scatter only inputs, gather only outputs)"
            )
        else:
            self._compute(op)

    def _compute(self, op) -> None:
        r = op.device
        b = self.rank(r)
        ins = []
        for v in op.inputs:
            rank, local = self._local(v)
            if rank != r:
                raise LoweringError(
                    f"{describe_op(op)} on rank {r} reads {v.name!r} of rank {rank}"
                )
            ins.append(local)
        attrs = dict(op.attributes)
        if "device" in attrs:
            attrs["device"] = None
        new = b.add_op(
            op.op_type, ins, attrs, names=[v.name for v in op.outputs], subfunctions=op.subfunctions
        )
        for v, nv in zip(op.outputs, new.outputs):
            self.rep[v] = (r, nv)

    def _send(self, op) -> None:
        src, local = self._local(op.inputs[0])
        dst = op.attributes["to_device"]
        self.tag += 1
        x = op.inputs[0].type
        self.rank(src).call(
            "SendTo", local, peer=dst, tag=self.tag, name=f"{op.inputs[0].name}_sent"
        )
        got = self.rank(dst).call(
            "RecvFrom",
            peer=src,
            tag=self.tag,
            shape=list(x.shape),
            dtype=x.dtype.value,
            name=op.outputs[0].name,
        )
        self.rep[op.outputs[0]] = (dst, got)

    def _collective(self, op) -> None:
        kind = _TUPLE_COLLECTIVES[op.op_type]
        a = op.attributes
        reps = self._local(op.inputs[0])
        group = [r for r, _ in reps]  # type: ignore[misc]
        outs: TupleType = op.outputs[0].type
        self.tag += 1
        attrs = {"kind": kind, "group": group, "tag": self.tag}
        if "op" in a:
            attrs["op"] = a["op"]
        if kind in ("allgather", "reducescatter"):
            attrs["dim"] = a["dim"]
        if kind == "alltoall":
            attrs["dim"], attrs["concat_dim"] = a["split_dim"], a["concat_dim"]
        new = []
        for (r, local), e in zip(reps, outs.elements):  # type: ignore[misc]
            y = self.rank(r).call(
                "RankCollective",
                local,
                **attrs,
                result_shape=list(e.shape),
                name=op.outputs[0].name,
            )
            new.append((r, y))
        self.rep[op.outputs[0]] = tuple(new)
