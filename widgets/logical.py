"""The logical graph view: one node per logical op, whatever the number of devices.

A transform's output is a *logical* program: a ``Pmap`` runs one body on a tuple
of devices, ``AllReduce(xs, groups=...)`` is one grouped collective, ``SendEach``
moves a tuple from one pipeline stage to the next. :class:`LogicalDrawing` draws
each of them as one node (a pmap's body is summarised in its label, its devices
shown as colour stripes from the shared palette), so dp × tp never changes the
size of the drawing. Above ``GraphOptions.max_ops`` ops, each run of consecutive
ops on the same devices (a pipeline stage's forward or backward of one
microbatch) folds into one node naming its repeated layers; a click opens it.
Pure Python: it writes dot source and the id map, :mod:`widgets.graph` runs dot.
Which ops share a node is :mod:`widgets.logical_plan`'s; how a node shows its
devices, :mod:`widgets.device_marks`'s.
"""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING

from ir.function import Function
from ir.op import Op
from ir.registry import OpKind, get_op
from ir.text import format_op
from ir.types import DeviceRef, TupleType, Type
from ir.value import Value

from .collapse import find_repeats
from .device_marks import MAX_STRIPES, device_glyph, device_ranges
from .drawing import GROUP_FILL, _attrs, _q, _short, stub_line
from .ids import op_id, op_paths, shape_label, value_names
from .layout import long_edges
from .legend import LegendEntry
from .logical_plan import Item, NodePlan, value_devices
from .palette import COMMUNICATION_COLOR, COMMUNICATION_TEXT, device_color, device_label
from .units import format_bytes, format_time

if TYPE_CHECKING:
    from ir.sim.result import SimResult

    from .graph import GraphOptions

_FONT = "Helvetica,Arial,sans-serif"


def _html_text(text: str) -> str:
    lines = html.escape(text).split("\n")
    return "<BR/>".join(lines)


def _tensor_bytes(t: Type) -> int:
    """Bytes of one device's part: the first element of a per-device tuple."""
    while isinstance(t, TupleType) and t.elements:
        t = t.elements[0]
    return t.size_bytes if not isinstance(t, TupleType) else 0


def op_durations_s(result: SimResult | None) -> dict[Op, float]:
    """The longest simulated duration of each op over the devices it ran on."""
    if result is None:
        return {}
    bars = result.bars
    out: dict[Op, float] = {}
    for op, dur in zip(bars.ops, bars.dur_s.tolist()):
        if dur > out.get(op, 0.0):
            out[op] = dur
    return out


class LogicalDrawing:
    """Dot source, id map, tooltips and legend of the logical view of one Function.

    Offers what :class:`widgets.graph.PendingGraph` reads from a drawing:
    ``id_map``, ``tooltips``, ``groups``, ``paths``, ``names`` and :meth:`legend`.
    """

    def __init__(
        self,
        function: Function,
        placements: Mapping[Value | str, str],
        options: GraphOptions,
        result: SimResult | None = None,
    ) -> None:
        self.function = function
        self.options = options
        self.names = value_names(function)
        self.paths = op_paths(function)
        self.placements = {
            (k if isinstance(k, str) else self.names.get(k, k.name)): v
            for k, v in placements.items()
        }
        self.durations_s = op_durations_s(result)
        self.id_map: dict[str, tuple[str, str]] = {}
        self.tooltips: dict[str, str] = {}
        self.groups: dict[str, tuple[str, ...]] = {}
        self.devices: dict[DeviceRef, None] = {}
        self.lines: list[str] = []
        self.source: dict[Value, str] = {}
        self.has_comm = self.has_fold = False
        self.plan = NodePlan(function, self.paths, options)
        self.lanes = 0  # pipeline stages drawn as lanes (see _lanes)
        self.node_devices: dict[str, frozenset] = {}  # where each op or fold node runs

    # -- top level -----------------------------------------------------------

    def dot(self) -> str:
        self.lines += [
            "digraph distir {",
            f"  graph {_attrs(rankdir=self.options.rankdir, fontname=_FONT, nodesep=0.25)};",
            f"  node {_attrs(fontname=_FONT, fontsize=11, shape='box', height=0.3)};",
            f"  edge {_attrs(fontname=_FONT, fontsize=9, color='#555555', arrowsize=0.6)};",
        ]
        layouts = self.function.input_layouts
        items = self.plan.items()
        if not self.plan.fold:
            for k, v in enumerate(self.function.inputs):
                self._input_node(k, v)
        else:
            for v in self.function.inputs:
                self.source[v] = ""  # read by a fold: counted in its label, not drawn
        edges: dict[tuple[str, str], list[Value]] = {}
        for item in items:
            nid = self._draw(item)
            self.node_devices[nid] = frozenset(self.plan.item_devices(item))
            for op in item.ops:
                for v in op.inputs:
                    src = self.source.get(v, "")
                    if src and src != nid:
                        edges.setdefault((src, nid), []).append(v)
                for v in op.outputs:
                    self.source[v] = nid
        self._lanes(self.node_devices)
        self.lines.append(f'  "return" {_attrs(id="return", label="return", style="rounded")};')
        for v in self.function.outputs:
            if self.source.get(v):
                edges.setdefault((self.source[v], "return"), []).append(v)
        index = {v: k for k, v in enumerate(self.function.inputs)}
        far = long_edges(list(edges), self.options)
        for k, ((src, dst), values) in enumerate(edges.items()):
            if (src, dst) in far:  # a weight read again far below: a stub by its reader
                src = self._stub(f"s-{k}", src, values)
            self._edge(src, dst, values, layouts, index)
        self.lines.append("}")
        return "\n".join(self.lines) + "\n"

    def _lanes(self, placed: dict[str, frozenset]) -> None:
        """One lane (a dashed box) per pipeline stage: the nodes that run on exactly one
        stage's devices, when at least two disjoint sets of devices hold two nodes each.
        At 64 devices a pipeline's folds otherwise scatter over the whole drawing."""
        counts = Counter(placed.values())
        stages: list[frozenset] = []
        for devices, n in counts.most_common():
            if n >= 2 and len(devices) > 0 and all(not devices & s for s in stages):
                stages.append(devices)
        if len(stages) < 2:
            return
        stages.sort(key=lambda s: min(str(d) for d in s) if None in s else min(s))
        # dot's older ranking fails on clusters of this shape ("trouble in init_rank")
        self.lines.append("  graph [newrank=true];")
        for k, devices in enumerate(stages):
            members = " ".join(_q(nid) for nid, where in placed.items() if where == devices)
            label = f"stage {k}: devices {device_ranges(tuple(devices))}"
            lane = _attrs(id=f"lane-{k}", label=label, style="dashed", color="#bbbbbb")
            self.lines.append(f"  subgraph {_q(f'cluster_lane_{k}')} {{ graph {lane}; {members} }}")
        self.lanes = len(stages)

    def legend(self) -> tuple[LegendEntry, ...]:
        ints = sorted(d for d in self.devices if isinstance(d, int))
        rest = [d for d in self.devices if not isinstance(d, int)]
        entries = [LegendEntry(device_label(d), device_color(d), "device", d) for d in ints + rest]
        if len(ints) > 20:  # the palette wraps: say so rather than list 64 swatches
            entries = [*entries[:20], LegendEntry(f"… {len(ints)} devices", "#ffffff", "style")]
        if self.has_comm:
            entries.append(LegendEntry("communication", COMMUNICATION_COLOR, "comm"))
        if self.has_fold:
            entries.append(LegendEntry("folded ops (click to open)", GROUP_FILL, "group"))
        return tuple(entries)

    # -- nodes -----------------------------------------------------------------

    def _draw(self, item: Item) -> str:
        if item.kind == "fold":
            return self._group_node(item)
        if item.kind == "copies":
            return self._copies_node(item.ops)
        op = item.ops[0]
        if op.op_type == "Pmap":
            return self._pmap_node(op)
        if get_op(op.op_type).kind is OpKind.COMMUNICATION:
            return self._comm_node(op)
        return self._plain_node(op)

    def _common(self, op: Op, attrs: dict[str, object], tooltip: str, glyph: str = "") -> str:
        nid = op_id(self.paths[op])
        self.id_map[nid] = ("op", self.paths[op])
        self.tooltips[nid] = f"{_short(format_op(op), 400)}\n{tooltip}"
        self._node(nid, attrs, glyph)
        return nid

    def _node(self, nid: str, attrs: dict[str, object], glyph: str) -> None:
        """One node line; with a glyph, the label is an HTML table: glyph above text."""
        if not glyph:
            self.lines.append(f"  {_q(nid)} {_attrs(id=nid, **attrs)};")
            return
        text = _html_text(str(attrs.pop("label")))
        label = f"{glyph}<BR/>{text}"
        self.lines.append(f"  {_q(nid)} {_attrs(id=nid, **attrs)[:-1]}, label=<{label}>];")

    def _glyph(self, devices: tuple[DeviceRef, ...]) -> str:
        self.devices.update(dict.fromkeys(devices))
        return device_glyph(devices)

    def _stripes(self, devices: tuple[DeviceRef, ...]) -> str:
        self.devices.update(dict.fromkeys(devices))
        colors = list(dict.fromkeys(device_color(d) for d in devices))
        return ":".join(colors[:MAX_STRIPES]) or device_color(None)

    def _pmap_node(self, op: Op) -> str:
        (body,) = op.subfunctions
        devices = self.plan.op_devices(op)
        kinds = Counter(o.op_type for o in body.ops)
        summary = ", ".join(f"{t}×{n}" if n > 1 else t for t, n in kinds.most_common(3))
        more = "…" if len(kinds) > 3 else ""
        where = f"on {_short(device_ranges(devices), 24)} ({len(set(devices))} dev)"
        if len(body.ops) == 1:  # one op run alike by every device: a propagated step's op
            label = f"{body.ops[0].op_type} {where}"
        else:
            label = f"pmap {where}\n{body.num_ops()} ops: {_short(summary + more, 40)}"
        attrs = {"label": label, "style": "filled", "fillcolor": "#ffffff", "margin": "0.05"}
        tooltip = f"body: {', '.join(o.op_type for o in body.ops)}"
        return self._common(op, attrs, tooltip, self._glyph(devices))

    def _comm_node(self, op: Op) -> str:
        self.has_comm = True
        devices = self.plan.op_devices(op)
        self.devices.update(dict.fromkeys(devices))
        nbytes = sum(_tensor_bytes(v.type) for v in op.inputs)
        cost = format_bytes(nbytes) + "/dev"
        if op in self.durations_s:
            cost += f" · {format_time(self.durations_s[op])}"
        if op.op_type == "SendEach":
            dest = tuple(op.attributes.get("to_devices", ()))
            label = f"⇢ {op.op_type} {_short(device_ranges(devices), 14)}"
            if dest:
                src = tuple(d for d in devices if d not in dest)
                label = f"⇢ {op.op_type} {device_ranges(src)} → {device_ranges(dest)}"
            attrs = {"shape": "cds", "fontsize": 9, "height": 0.25}
        else:
            groups = op.attributes.get("groups")
            kind = op.attributes.get("op")
            head = op.op_type + (f" {kind}" if kind else "")
            shape = f"{len(groups)} groups of {len(groups[0])}" if groups else "all devices"
            label = f"⇄ {head}\n{shape} · {cost}"
            attrs = {"shape": "hexagon", "height": 0.4}
        attrs.update(
            label=label,
            style="filled",
            fillcolor=COMMUNICATION_COLOR,
            fontcolor=COMMUNICATION_TEXT,
            color=COMMUNICATION_COLOR,
        )
        return self._common(op, attrs, f"{cost} on devices {device_ranges(devices)}")

    def _plain_node(self, op: Op) -> str:
        devices = self.plan.op_devices(op)
        outs = ", ".join(self.names[v] for v in op.outputs)
        attrs = {
            "label": _short(f"{outs} = {op.op_type}", 34),
            "style": "striped" if len(set(devices)) > 1 else "filled,rounded",
            "fillcolor": self._stripes(devices),
        }
        if get_op(op.op_type).kind is OpKind.CONTROL:
            attrs.update(fontsize=9, height=0.2)
        return self._common(op, attrs, f"on devices {device_ranges(devices)}")

    def _copies_node(self, ops: list[Op]) -> str:
        """Per-device copies of one op: one node, like a pmap's."""
        first = ops[0]
        nid = op_id(self.paths[first])
        self.groups[nid] = tuple(op_id(self.paths[op]) for op in ops[1:])
        devices = tuple(d for op in ops for d in self.plan.op_devices(op))
        shape = ", ".join(shape_label(v.type) for v in first.outputs)
        label = f"{first.op_type} ×{len(ops)} on {_short(device_ranges(devices), 24)}\n{shape}"
        attrs: dict[str, object] = {"label": label, "style": "filled", "fillcolor": "#ffffff"}
        if get_op(first.op_type).kind is OpKind.CONTROL:
            attrs.update(fontsize=9, height=0.2)
        tooltip = f"{len(ops)} per-device copies ({nid} … {op_id(self.paths[ops[-1]])})"
        return self._common(first, attrs, tooltip, self._glyph(devices))

    def _group_node(self, item: Item) -> str:
        run = item.ops
        gid = self.plan.group_id(item)
        self.groups[gid] = tuple(op_id(self.paths[op]) for op in run)
        self.has_fold = True
        devices = tuple(dict.fromkeys(d for op in run for d in self.plan.op_devices(op)))
        types = item.types
        repeats = find_repeats(types, budget=1, min_count=2, max_period=40, min_gain=1)
        best = max(repeats, key=lambda r: r.period * r.count, default=None)
        if item.block is not None:
            shape = f"{item.head}[{_short(', '.join(item.block), 44)}]"
        elif best is not None:
            block = ", ".join(types[best.start : best.start + best.period])
            shape = f"{best.count} × [{_short(block, 40)}]"
            rest = len(types) - best.period * best.count
            shape += f" + {rest} more" if rest else ""
        else:
            shape = _short(", ".join(types), 48)
        counts = Counter(types)
        comm = [op for op in run if get_op(op.op_type).kind is OpKind.COMMUNICATION]
        body_ops = sum(s.num_ops() for op in run for s in op.subfunctions)
        parts = [f"{counts['Pmap']} pmaps ({body_ops} ops)"] if counts["Pmap"] else []
        if comm:
            self.has_comm = True
            nbytes = sum(_tensor_bytes(v.type) for op in comm for v in op.inputs)
            text = f"{len(comm)} collectives {format_bytes(nbytes)}/dev"
            spent = sum(self.durations_s.get(op, 0.0) for op in comm)
            parts.append(text + (f" · {format_time(spent)}" if spent else ""))
        reads = sum(1 for op in run for v in op.inputs if self.source.get(v) == "")
        if reads:
            parts.append(f"reads {reads} inputs")
        label = (
            f"▸ {len(types)} ops on {_short(device_ranges(devices), 24)} "
            f"({len(set(devices))} dev)\n{shape}\n{' · '.join(parts)}"
        )
        attrs = {
            "label": label,
            "style": "filled,dashed",
            "fillcolor": GROUP_FILL,
            "penwidth": 2,
            "color": COMMUNICATION_COLOR if comm else "#666666",
            "margin": "0.05",
        }
        self.id_map[gid] = ("group", gid)
        first, last = self.groups[gid][0], self.groups[gid][-1]
        self.tooltips[gid] = f"{len(types)} ops folded ({first} … {last}): click to open"
        self._node(gid, attrs, self._glyph(devices))
        return gid

    def _input_node(self, k: int, v: Value) -> None:
        nid = f"in-{k}"
        name = self.names[v]
        devices = value_devices(v.type)
        attrs = _attrs(
            id=nid,
            label=f"{_short(name, 20)}\n{shape_label(v.type)}",
            shape="ellipse",
            style="wedged" if len(set(devices)) > 1 else "filled",
            fillcolor=self._stripes(devices),
            fontsize=9,
        )
        self.id_map[nid] = ("value", name)
        self.tooltips[nid] = f"{name}: {_short(str(v.type), 300)}"
        self.source[v] = nid
        self.lines.append(f"  {_q(nid)} {attrs};")

    def _stub(self, sid: str, src: str, values: list[Value]) -> str:
        """A small node standing for ``src`` next to a far-away reader: dot routes a
        long edge through one virtual node per rank it crosses, which is slow."""
        text = self.names[values[0]] if len(values) == 1 else f"{len(values)} values"
        kind, name = self.id_map.get(src, ("group", src))
        self.id_map[sid] = ("value", self.names[values[0]]) if kind == "value" else (kind, name)
        self.tooltips[sid] = f"{text} from {src} (far above)"
        self.lines.append(stub_line(sid, text))
        return sid

    def _edge(
        self,
        src: str,
        dst: str,
        values: list[Value],
        layouts: tuple[tuple[str, ...] | None, ...],
        index: dict[Value, int],
    ) -> None:
        eid = f"e-{src}-{dst}"
        names = [self.names[v] for v in values]
        if len(values) == 1:
            (v,) = values
            label = shape_label(v.type)
            k = index.get(v)
            if k is not None and k < len(layouts) and layouts[k]:
                label += "\n" + " ".join(layouts[k])  # type: ignore[arg-type]
            elif names[0] in self.placements:
                label += "\n" + self.placements[names[0]]
            self.id_map[eid] = ("value", names[0])
        else:
            shapes = {shape_label(v.type) for v in values}
            label = (
                f"{len(values)} × {shapes.pop()}" if len(shapes) == 1 else f"{len(values)} values"
            )
            group = src if src in self.groups else dst
            self.id_map[eid] = ("group", group) if group in self.groups else ("value", names[0])
        self.tooltips[eid] = _short(", ".join(names), 300)
        self.lines.append(f"  {_q(src)} -> {_q(dst)} {_attrs(id=eid, label=_short(label, 40))};")

    # -- helpers ----------------------------------------------------------------
