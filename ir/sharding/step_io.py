"""A propagated step's inputs and outputs: where its state lives and where it stays.

``inputs="resident"`` (a steady-state step): each input is a per-device tuple laid out
on the mesh (its levels in ``Function.input_layouts``, :mod:`ir.layout`), each output
stays on the devices that computed it, with its layout, and an optimizer's updated
state takes the layout of the state it updates. ``inputs="distribute"`` (the seeds'
form): whole inputs are scattered or broadcast every step and outputs gathered back.
A mixin of propagation's materialiser, which holds the builder, the mesh and the
distributed values.
"""

from __future__ import annotations

from ..function import Function
from ..registry import OpKind, get_op
from ..types import TensorType, TupleType
from ..value import Value
from .errors import PropagationError
from .mesh import Layout, Partial, R, Shard
from .redistribute import DistValue


def levels_of(layout: Layout) -> tuple[str, ...]:
    """A mesh layout as the levels of :mod:`ir.layout` over its flat device tuple.

    >>> from ir.sharding import Layout, Mesh
    >>> levels_of(Layout(Mesh((2, 4)), ("S(0)", "R")))
    ('S(0)@2', 'R@4')
    >>> levels_of(Layout(Mesh((4,)), ("P(sum)",)))
    ('P',)
    """
    texts = []
    for p in layout.placements:
        if isinstance(p, Shard):
            texts.append(f"S({p.dim})")
        elif isinstance(p, Partial):
            texts.append("P")
        else:
            texts.append("R")
    if layout.mesh.ndim == 1:
        return tuple(texts)
    return tuple(f"{t}@{n}" for t, n in zip(texts, layout.mesh.shape))


def symmetric(g: Function, devices: int) -> bool:
    """Every mesh device does the same work at the same time: the step's ops outside
    pmap bodies are structural, or collectives over all ``devices`` at once (an op per
    device, a per-group all-to-all or a halo exchange makes devices differ)."""
    for op in g.ops:
        kind = get_op(op.op_type).kind
        if kind is OpKind.CONTROL:
            continue
        if kind is not OpKind.COMMUNICATION or not op.inputs:
            return False
        t = op.inputs[0].type
        if not isinstance(t, TupleType) or len(t.elements) != devices:
            return False
    return True


def has_partial(layout: Layout) -> bool:
    return any(isinstance(p, Partial) for p in layout.placements)


class StepIO:
    """``_distribute`` an input, ``_keep`` (resident) or ``_collect`` (seed form) an
    output; see the module doc."""

    def _distribute(self, x: Value) -> DistValue:
        if not isinstance(x.type, TensorType):
            raise PropagationError(
                f"input {x.name!r} is {x.type}, already per-device: propagate distributes a "
                "sequential program (unroll or gather it first)"
            )
        layout = self._layout_of(self.desired.get(x, (R,) * self.mesh.ndim))
        if self.resident:  # the input arrives laid out: one piece per mesh device
            if has_partial(layout):  # partial sums are results, never resident state
                layout = Layout.replicated(self.mesh)
            local = self._local_types(x.type, layout.placements)
            nx = self.b.input(x.name, TupleType(tuple(local)))
            self._in_levels[x.name] = levels_of(layout)
            return DistValue(None, layout, x.type, whole=nx)
        nx = self.b.input(x.name, x.type)
        names = [f"{x.name}_s"]
        known = self._distributions.get((x.type, layout))
        if known is not None:  # inputs of one type and layout (every layer's weights) alike
            xs = self.b.add_inferred(known[0], [nx], known[1], known[2], names).outputs[0]
        else:
            devices = list(self.mesh.devices)
            ps = layout.placements
            if self.mesh.ndim == 1 and isinstance(ps[0], Shard) and ps[0].block is None:
                op_type, attrs = "Scatter", {"dim": ps[0].dim, "devices": devices}
            elif layout.is_replicated:
                op_type, attrs = "Broadcast", {"devices": devices}
            else:
                op_type, attrs = "Shard", layout.attributes()
            op = self.b.add_op(op_type, [nx], attrs, names=names)
            self._distributions[x.type, layout] = (op_type, op.attributes, (op.outputs[0].type,))
            xs = op.outputs[0]
        return DistValue(None, layout, x.type, whole=xs, name=x.name)

    def _keep(self, v: Value, state: Value | None) -> tuple[Value, tuple[str, ...] | None]:
        """Output ``v`` where it was computed: a per-device tuple and its layout. Updated
        state (``state``: the input ``v`` is the next value of) takes that input's layout."""
        d = self.dist[v]
        if isinstance(v.type, TupleType):  # a tuple-valued result (Split): gathered whole
            return self._collect(v), None
        if state is not None and d.layout != self.dist[state].layout:
            d = self.redistribute(
                d, self.dist[state].layout, f"{v.name!r} is {state.name!r} updated"
            )
        elif has_partial(d.layout):
            d = self._reduced(v, d)
            if any(isinstance(p, Partial) and p.op != "sum" for p in d.layout.placements):
                d = self.redistribute(d, Layout.replicated(self.mesh), "a partial max/min output")
        return d.whole_in(self.b), levels_of(d.layout)

    def _reduced(self, v: Value, d: DistValue) -> DistValue:
        """``d``, or the view of ``v`` already reduced for a consumer if ``d`` is partial:
        an output is not reduced twice."""
        if has_partial(d.layout):
            for w in self.views.get(v, {}).values():
                if not has_partial(w.layout):
                    return w
        return d

    def _collect(self, v: Value) -> Value:
        return self._collect_value(v, self._reduced(v, self.dist[v]))

    def _collect_value(self, v: Value, d: DistValue) -> Value:
        if isinstance(v.type, TupleType):  # a tuple-valued result (Split): element by element
            parts = []
            for e, t in enumerate(v.type.elements):
                locs = tuple(
                    self.b.call("TupleGet", x, index=e, name=f"{v.name}{e}_{dev}")
                    for x, dev in zip(d.locals_in(self.b, self._suffixes), self.mesh.devices)
                )
                parts.append(
                    self._collect_value(Value(f"{v.name}{e}", t), DistValue(locs, d.layout, t))
                )
            return self.b.call("MakeTuple", *parts, name=v.name)
        xs = d.whole_in(self.b)
        p = d.layout.placements
        device = getattr(v.type, "device", None)
        if self.mesh.ndim == 1 and isinstance(p[0], Shard):
            return self.b.call("Gather", xs, dim=p[0].dim, to_device=device, name=v.name)
        if self.mesh.ndim == 1 and isinstance(p[0], Partial):
            return self.b.call("Reduce", xs, op=p[0].op, to_device=device, name=v.name)
        return self.b.call(
            "Unshard",
            xs,
            **d.layout.attributes(),
            shape=list(d.shape),
            to_device=device,
            name=v.name,
        )
