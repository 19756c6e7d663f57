"""Building the dot source of a Function: nodes, folds, clusters, edges, the id map.

:class:`Drawing` walks a Function once and collects the dot statements, the id
map (SVG id -> op path or value name), tooltips, folded groups and the device
legend; :mod:`widgets.graph` turns that into SVG with graphviz. Pure Python,
no browser, no kernel.
"""

from __future__ import annotations

import re
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ir.function import Function
from ir.op import Op
from ir.registry import OpKind, get_op
from ir.text import format_op
from ir.types import DeviceRef, DeviceVar, TupleType, bind_device, devices_of
from ir.value import Value

from .collapse import find_repeats
from .ids import op_id, op_paths, shape_label, value_names
from .layout import long_edges
from .legend import LegendEntry
from .palette import COMMUNICATION_BORDER, device_color, device_label

if TYPE_CHECKING:
    from .graph import GraphOptions

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_FONT = "Helvetica,Arial,sans-serif"
GROUP_FILL = "#fff7d6"


def _q(text: str) -> str:
    """A dot string literal."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _attrs(**attrs: object) -> str:
    return "[" + ", ".join(f"{k}={_q(str(v))}" for k, v in attrs.items()) + "]"


def _short(text: str, limit: int = 28) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


_Env = tuple[tuple[str, tuple[DeviceRef, ...], dict | None], ...]


def _resolve(ref: DeviceRef, env: _Env) -> tuple[DeviceRef, ...]:
    """The concrete devices a (possibly symbolic) device reference ranges over."""
    if not isinstance(ref, DeviceVar):
        return (ref,)
    for var, devices, device_map in reversed(env):
        if ref.name == var:
            return tuple(bind_device(ref, var, d, device_map) for d in devices)
    return (ref,)


@dataclass(frozen=True)
class Placed:
    """A placement label (``S(0) R``) and the devices the value is laid out on: what the
    graph of the program as written shows for a value propagation placed, so that its
    node has the colours of those devices, not of the one device the program names."""

    label: str
    devices: tuple[int, ...]

    def __str__(self) -> str:
        return self.label


class Drawing:
    """Collects the dot statements, the id map and the device legend of one Function."""

    def __init__(
        self, function: Function, placements: Mapping[Value | str, str], options: GraphOptions
    ) -> None:
        self.function = function
        self.options = options
        self.names = value_names(function)
        self.paths = op_paths(function)
        self.placements = {
            (k if isinstance(k, str) else self.names.get(k, k.name)): str(v)
            for k, v in placements.items()
        }
        # values laid out over devices (Placed): their ops take those devices' colours
        self.placed = {
            (k if isinstance(k, str) else self.names.get(k, k.name)): v.devices
            for k, v in placements.items()
            if isinstance(v, Placed)
        }
        self.fold = options.max_ops is not None and function.num_ops() > options.max_ops
        self.lines: list[str] = []
        self.id_map: dict[str, tuple[str, str]] = {}
        self.tooltips: dict[str, str] = {}
        self.groups: dict[str, tuple[str, ...]] = {}
        self.devices: dict[DeviceRef, None] = {}
        self.source: dict[Value, str] = {}
        self.uses: list[tuple[Value, str]] = []
        self.drawn_edges: list[tuple[str, str]] = []
        self.folded_inputs: set[Value] = set()
        self.has_comm = self.has_cluster = False

    # -- top level -----------------------------------------------------------

    def dot(self) -> str:
        o = self.options
        self.lines += [
            "digraph distir {",
            f"  graph {_attrs(rankdir=o.rankdir, fontname=_FONT, nodesep=0.25, ranksep=0.35)};",
            f"  node {_attrs(fontname=_FONT, fontsize=11, shape='box', height=0.3)};",
            f"  edge {_attrs(fontname=_FONT, fontsize=9, color='#555555', arrowsize=0.6)};",
        ]
        header, self.lines = self.lines, []
        self._level(self.function, "", (), "  ", o.max_ops)
        self.lines.append(f'  "return" {_attrs(id="return", label="return", style="rounded")};')
        self.uses += [(v, "return") for v in self.function.outputs]
        body, self.lines = self.lines, header
        targets: dict[Value, set[str]] = {}
        for v, target in self.uses:
            targets.setdefault(v, set()).add(target)
        for k, v in enumerate(self.function.inputs):
            readers = targets.get(v, set())
            if readers and all(t in self.groups for t in readers):
                # read only inside folded groups (a layer's weights in a training step are
                # read by its forward, backward and optimizer folds): fold it too
                self.source[v] = min(readers, key=self._group_order)
                self.folded_inputs.add(v)
            else:
                self._value_node(f"in-{k}", v, (), "ellipse", "  ")
        self.lines += body
        self._edges()
        nodes = sum(1 for line in self.lines if line.lstrip().startswith('"') and "->" not in line)
        if nodes > o.bound_above_nodes:
            # bound network simplex (x positions): 1 x nodes iterations, not until optimal
            self.lines.append(f"  graph {_attrs(nslimit=1, nslimit1=1)};")
        self.lines.append("}")
        return "\n".join(self.lines) + "\n"

    def legend(self) -> tuple[LegendEntry, ...]:
        ints = sorted(d for d in self.devices if isinstance(d, int))
        rest = [d for d in self.devices if not isinstance(d, int)]
        entries = [LegendEntry(device_label(d), device_color(d), "device", d) for d in ints + rest]
        if self.has_comm:
            entries.append(LegendEntry("communication", "#ffffff", "comm"))
        if self.has_cluster:
            entries.append(LegendEntry("pmap body", "#ffffff", "cluster"))
        if self.groups:
            entries.append(LegendEntry("folded ops (click to open)", GROUP_FILL, "group"))
        return tuple(entries)

    # -- nodes ---------------------------------------------------------------

    def _level(self, fn: Function, prefix: str, env: _Env, indent: str, budget: int | None) -> None:
        folded: dict[int, str] = {}
        if self.fold and budget is not None:
            found = _repeats(fn, budget, self.options.min_repeats)
            opened: set[int] = set()  # in a fold the user opened: stays open
            for r in found:
                hidden = [f"{prefix}{i}" for i in r.folded]
                gid = f"group-{hidden[0]}-{hidden[-1]}"
                if gid in self.options.expanded:
                    opened.update(r.folded)
                    continue
                self.groups[gid] = tuple(op_id(p) for p in hidden)
                folded.update(dict.fromkeys(r.folded, gid))
                block = [op.op_type for op in fn.ops[r.start : r.start + r.period]]
                self._group_node(
                    gid, [fn.ops[i] for i in r.folded], block, r.count - 1, env, indent
                )
            if len(fn.ops) - len(folded) + len(set(folded.values())) > budget:
                self._fold_runs(fn, prefix, env, indent, budget, folded, opened)
        for i, op in enumerate(fn.ops):
            path = f"{prefix}{i}"
            if i in folded:
                self._hide(op, folded[i])
            elif op.op_type == "Pmap":
                self._pmap(op, path, env, indent)
            else:
                self._op_node(op, path, env, indent)

    def _fold_runs(
        self,
        fn: Function,
        prefix: str,
        env: _Env,
        indent: str,
        budget: int,
        folded: dict[int, str],
        opened: set[int],
    ) -> None:
        """Still over budget once repeated layers folded (a pipeline's first microbatch
        differs from the others by its weight sends): past the first ``budget // 2``
        visible ops, fold each run of 3 or more consecutive ops on the same devices
        into one node, so the drawing keeps the sends between stages and the order
        of work, and dot gets a few hundred nodes, not thousands."""
        runs: list[list[int]] = []
        last: tuple[DeviceRef, ...] | None = None
        shown = 0
        for i, op in enumerate(fn.ops):
            plain = i not in folded and i not in opened and op.op_type != "Pmap"
            plain = plain and get_op(op.op_type).kind is not OpKind.COMMUNICATION
            shown += i not in folded
            if not plain or shown <= budget // 2:
                last = None
                continue
            devices = self._devices(op, env)
            if devices == last:
                runs[-1].append(i)
            else:
                runs.append([i])
            last = devices
        for run in runs:
            if len(run) < 3:
                continue
            hidden = [f"{prefix}{i}" for i in run]
            gid = f"group-{hidden[0]}-{hidden[-1]}"
            if gid in self.options.expanded:
                continue
            self.groups[gid] = tuple(op_id(p) for p in hidden)
            folded.update(dict.fromkeys(run, gid))
            block = [fn.ops[i].op_type for i in run]
            self._group_node(gid, [fn.ops[i] for i in run], block, 0, env, indent)

    def _op_node(self, op: Op, path: str, env: _Env, indent: str) -> None:
        nid = op_id(path)
        devices = self._devices(op, env)
        outs = ", ".join(self.names[v] for v in op.outputs)
        kind = get_op(op.op_type).kind
        attrs: dict[str, object] = {"id": nid, "label": _short(f"{outs} = {op.op_type}", 34)}
        colors = ":".join(device_color(d) for d in devices)
        if kind is OpKind.COMMUNICATION:
            self.has_comm = True
            attrs.update(
                label="⇄ " + _short(f"{op.op_type} → {outs}", 32),
                style="striped,bold",
                fillcolor=colors,
                color=COMMUNICATION_BORDER,
                peripheries=2,
                penwidth=2,
                fontname="Helvetica-Bold",
            )
        else:
            many = len(devices) > 1
            attrs.update(style="striped" if many else "filled,rounded", fillcolor=colors)
            if kind is OpKind.CONTROL:
                attrs.update(fontsize=9, height=0.2, color="#888888")
        where = ", ".join(device_label(d) for d in devices)
        self.tooltips[nid] = f"{format_op(op)}\n{nid} on {where}"
        self.id_map[nid] = ("op", path)
        self.lines.append(f"{indent}{_q(nid)} {_attrs(**attrs)};")
        for v in op.outputs:
            self.source[v] = nid
        self.uses += [(v, nid) for v in op.inputs]

    def _group_node(
        self, gid: str, ops: list[Op], block: list[str], copies: int, env: _Env, indent: str
    ) -> None:
        devices: dict[DeviceRef, None] = {}
        for op in ops:
            devices.update(dict.fromkeys(self._devices(op, env)))
        where = ", ".join(device_label(d).removeprefix("device ") for d in devices)
        head = f"{copies} more × " if copies else ""
        label = (
            f"▸ {head}[{_short(', '.join(block), 48)}]\n"
            f"{len(ops)} ops on device{'s' if len(devices) > 1 else ''} {_short(where, 30)}: "
            "click to open"
        )
        attrs = {
            "id": gid,
            "label": label,
            "style": "filled,dashed",
            "fillcolor": GROUP_FILL,
            "penwidth": 2,
            "color": device_color(next(iter(devices))) if len(devices) == 1 else "#666666",
        }
        self.id_map[gid] = ("group", gid)
        self.tooltips[gid] = (
            f"{len(ops)} ops folded ({self.groups[gid][0]} … {self.groups[gid][-1]})"
        )
        self.lines.append(f"{indent}{_q(gid)} {_attrs(**attrs)};")

    def _hide(self, op: Op, gid: str) -> None:
        for v in op.outputs:
            self.source[v] = gid
        self.uses += [(v, gid) for v in op.inputs]

    def _pmap(self, op: Op, path: str, env: _Env, indent: str) -> None:
        (body,) = op.subfunctions
        nid = op_id(path)
        var = str(op.attributes["device_var"])
        first = op.inputs[0].type
        bound: list[DeviceRef] = []
        for d in first.devices if isinstance(first, TupleType) else ():
            bound += _resolve(d, env)
        inner = (*env, (var, tuple(bound), _plain_map(op.attributes.get("device_map"))))
        where = ", ".join("?" if d is None else str(d) for d in bound)
        title = f"pmap {var} over [{where}]"
        self.id_map[nid] = ("op", path)
        self.tooltips[nid] = f"{format_op(op)}\n{nid}: body of {body.num_ops()} ops"
        budget = self.options.max_body_ops if self.fold else None
        if (
            self.fold
            and body.num_ops() > self.options.max_body_ops
            and nid not in self.options.expanded
        ):
            hidden = [op_id(p) for o, p in self.paths.items() if p.startswith(f"{path}.")]
            self.groups[nid] = tuple(hidden)
            colors = ":".join(device_color(d) for d in dict.fromkeys(bound)) or device_color(None)
            label = f"▸ {title}\n{body.num_ops()} ops folded: click to open"
            attrs = _attrs(id=nid, label=label, shape="box3d", style="striped", fillcolor=colors)
            self.lines.append(f"{indent}{_q(nid)} {attrs};")
            self.devices.update(dict.fromkeys(bound))
            for v in op.outputs:
                self.source[v] = nid
            self.uses += [(v, nid) for v in op.inputs]
            return
        self.has_cluster = True
        self.lines.append(f"{indent}subgraph {_q('cluster_' + nid)} {{")
        sub = indent + "  "
        cluster = _attrs(id=nid, label=title, style="rounded,dashed", color="#888888")
        self.lines.append(f"{sub}graph {cluster};")
        for k, (outer, param) in enumerate(zip(op.inputs, body.inputs)):
            pid = f"{nid}.in{k}"
            self._value_node(pid, param, inner, "ellipse", sub)
            self.uses.append((outer, pid))
        self._level(body, f"{path}.", inner, sub, budget)
        self.lines.append(f"{indent}}}")
        for v, inner_out in zip(op.outputs, body.outputs):
            self.source[v] = self.source[inner_out]

    def _value_node(self, nid: str, v: Value, env: _Env, shape: str, indent: str) -> None:
        name = self.names[v]
        refs = self.placed.get(name) or devices_of(v.type)
        devices = tuple(dict.fromkeys(d for ref in refs for d in _resolve(ref, env)))
        self.devices.update(dict.fromkeys(devices))
        many = len(devices) > 1
        attrs = _attrs(
            id=nid,
            label=f"{_short(name, 20)}\n{shape_label(v.type)}",
            shape=shape,
            style="wedged" if many else "filled",
            fillcolor=":".join(device_color(d) for d in devices)
            if many
            else device_color(devices[0]),
            fontsize=9,
        )
        self.id_map[nid] = ("value", name)
        self.tooltips[nid] = f"{name}: {v.type}"
        self.source[v] = nid
        self.lines.append(f"{indent}{_q(nid)} {attrs};")

    def _devices(self, op: Op, env: _Env) -> tuple[DeviceRef, ...]:
        refs: tuple[DeviceRef, ...]
        placed = [d for v in op.outputs for d in self.placed.get(self.names[v], ())]
        if placed:
            refs = tuple(dict.fromkeys(placed))
        elif op.device is not None and get_op(op.op_type).kind is not OpKind.COMMUNICATION:
            refs = (op.device,)
        else:
            refs = tuple(
                dict.fromkeys(d for v in (*op.outputs, *op.inputs) for d in devices_of(v.type))
            ) or (None,)
        resolved = dict.fromkeys(d for ref in refs for d in _resolve(ref, env))
        ordered = sorted(d for d in resolved if isinstance(d, int))
        ordered += [d for d in resolved if not isinstance(d, int)]
        self.devices.update(dict.fromkeys(ordered))
        return tuple(ordered)

    # -- edges ---------------------------------------------------------------

    def _edges(self) -> None:
        index = {v: k for k, v in enumerate(self.names)}
        seen: set[tuple[str, str, Value]] = set()
        count: dict[Value, int] = {}
        single: list[tuple[str, str, Value]] = []
        bundles: dict[tuple[str, str], list[Value]] = {}  # edges into or out of a fold
        for v, target in self.uses:
            src = self.source[v]
            if src == target or (src, target, v) in seen or v in self.folded_inputs:
                continue
            seen.add((src, target, v))
            if src in self.groups or target in self.groups:
                bundles.setdefault((src, target), []).append(v)
                continue
            single.append((src, target, v))
        single += [(src, target, vs[0]) for (src, target), vs in bundles.items() if len(vs) == 1]
        many = {key: vs for key, vs in bundles.items() if len(vs) > 1}
        long = long_edges([(s, t) for s, t, _ in single] + list(many), self.options)
        shared = self._shared_stubs(long, single, many)
        for src, target, v in single:
            j = count[v] = count.get(v, -1) + 1
            eid = f"v-{index[v]}-{j}"
            if (src, target) in long and target in shared:
                self._edge(shared[target], target, eid, v, labelled=False)
                continue
            if (src, target) in long:
                src = self._stub(f"s-{index[v]}-{j}", src, v)
            self._edge(src, target, eid, v)
        for (src, target), values in many.items():
            # many values between a fold and one node: one edge, so the layout stays small
            eid = f"b-{_slug(src)}-{_slug(target)}"
            group = src if src in self.groups else target
            names = [self.names[v] for v in values]
            self.id_map[eid] = ("group", group)
            self.tooltips[eid] = f"{len(values)} values: {_short(', '.join(names), 200)}"
            attrs = _attrs(id=eid, label=f"{len(values)} values", style="bold")
            if (src, target) in long and target in shared:
                src, attrs = shared[target], _attrs(id=eid, style="bold")
            elif (src, target) in long:
                src = self._stub(f"s{eid[1:]}", src, None, f"{len(values)} values")
                self.id_map[src] = ("group", group)
            self.lines.append(f"  {_q(src)} -> {_q(target)} {attrs};")
            self.drawn_edges.append((src, target))
        self._stack_feeders()

    def _shared_stubs(
        self,
        long: set[tuple[str, str]],
        single: list[tuple[str, str, Value]],
        many: dict[tuple[str, str], list[Value]],
    ) -> dict[str, str]:
        """One stub per fold that reads many far-away values (a pipeline's backward
        folds read each microbatch's activations): the values' edges, unlabelled,
        all start there, so dot lays out one node and a bundle instead of dozens."""
        far: dict[str, list[str]] = {}
        for src, target, v in single:
            if (src, target) in long and target in self.groups:
                far.setdefault(target, []).append(self.names[v])
        for (src, target), values in many.items():
            if (src, target) in long and target in self.groups:
                far.setdefault(target, []).extend(self.names[v] for v in values)
        shared: dict[str, str] = {}
        for target, names in far.items():
            if len(names) < self.options.shared_stub_from:
                continue
            sid = shared[target] = f"s-far-{_slug(target)}"
            self._stub(sid, target, None, f"{len(names)} values")
            self.id_map[sid] = ("group", target)
            self.tooltips[sid] = f"{len(names)} values from far above: " + _short(
                ", ".join(names), 300
            )
        return shared

    def _stack_feeders(self, width: int = 6) -> None:
        """Stack the input and stub nodes that feed one node into rows of ``width``
        (invisible edges), so fifty weights read by one fold make a block, not a
        row as wide as fifty nodes."""
        out: dict[str, list[str]] = {}
        into: dict[str, bool] = {}
        for src, target in self.drawn_edges:
            out.setdefault(src, []).append(target)
            into[target] = True
        feeders: dict[str, list[str]] = {}
        for src, targets in out.items():
            if len(targets) == 1 and not into.get(src) and src.startswith(("in-", "s-")):
                feeders.setdefault(targets[0], []).append(src)
        for nodes in feeders.values():
            for a, b in zip(nodes, nodes[width:]) if len(nodes) > width else ():
                self.lines.append(f"  {_q(a)} -> {_q(b)} [style=invis];")

    def _group_order(self, gid: str) -> int:
        return list(self.groups).index(gid)

    def _stub(self, sid: str, src: str, v: Value | None, text: str = "") -> str:
        """A small node standing for ``src`` next to a far-away reader: a long edge,
        drawn whole, would cross the graph and make dot's layout slow."""
        kind, name = self.id_map.get(src, ("", src))
        where = name if kind == "value" else src
        if v is not None:
            text = self.names[v]
            self.id_map[sid] = ("value", text)
            self.tooltips[sid] = f"{text}: {v.type}\nfrom {where} (far above)"
        else:
            self.tooltips[sid] = f"{text} from {where} (far above)"
        self.lines.append(stub_line(sid, text))
        return sid

    def _edge(self, src: str, target: str, eid: str, v: Value, *, labelled: bool = True) -> None:
        name = self.names[v]
        label = shape_label(v.type)
        if name in self.placements:
            label += "\n" + self.placements[name]
        self.id_map[eid] = ("value", name)
        self.tooltips[eid] = f"{name}: {v.type}"
        attrs = _attrs(id=eid, label=label) if labelled else _attrs(id=eid)
        self.lines.append(f"  {_q(src)} -> {_q(target)} {attrs};")
        self.drawn_edges.append((src, target))


def _slug(node_id: str) -> str:
    return node_id.replace("group-", "g")


_REPEATS: weakref.WeakKeyDictionary[Function, dict[tuple[int, int], list]] = (
    weakref.WeakKeyDictionary()
)


def _repeats(fn: Function, budget: int, min_count: int) -> list:
    """``find_repeats`` of ``fn``'s op signatures, memoised per Function: the workbench
    redraws the same program with new placements after every click."""
    per_function = _REPEATS.setdefault(fn, {})
    key = (budget, min_count)
    if key not in per_function:
        sigs = [_signature(op) for op in fn.ops]
        per_function[key] = find_repeats(sigs, budget=budget, min_count=min_count, min_gain=8)
    return per_function[key]


def _signature(op: Op) -> tuple:
    """What must match for two ops to count as the same step of a repeated layer."""
    body = tuple(_signature(o) for sub in op.subfunctions for o in sub.ops)
    return (op.op_type, len(op.inputs), len(op.outputs), body)


def _plain_map(m: object) -> dict | None:
    if m is None:
        return None
    return {k: (_plain_map(v) if hasattr(v, "items") else list(v)) for k, v in m.items()}  # type: ignore[attr-defined]


def stub_line(sid: str, text: str) -> str:
    """The dot line of a stub: a small dashed node standing for a value made far above
    its reader (dot routes a long edge through one virtual node per rank it crosses)."""
    attrs = _attrs(
        id=sid,
        label=f"↪ {_short(text, 18)}",
        shape="box",
        style="dashed,rounded",
        color="#999999",
        fontsize=8,
        height=0.2,
        margin="0.04,0.02",
    )
    return f"  {_q(sid)} {attrs};"
