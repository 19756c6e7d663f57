"""Reading a session file's JSON document: every field checked for its type, its range
and its meaning, each fault a :class:`~workbench.files.SessionFileError` naming the
file and the field's JSON path (``$.history.undo[2].annotations[0].placements[1]``).

Every size and device id is an integer within its bounds (``ir.limits``), every figure
a finite number, a JSON integer of more than 19 digits is kept as text for its field to
refuse (Python's ``int`` stops at 4,300 digits with a ValueError), and every state of
the undo and redo history is checked as the current one is, when the file is read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ir.device import Device, LinkTable, Topology
from ir.errors import DistIRError
from ir.function import Function
from ir.limits import MAX_DEVICES, MAX_INT
from ir.sharding import Mesh, ShardingSpec, placement
from ir.text import parse

from .files import SessionFileError
from .session import Annotation, State, Strategy

FORMAT = "distir-workbench-session"
VERSION = 1

DEVICE_NUMBERS = ("peak_flops", "mem_bandwidth_bytes_per_s", "memory_bytes", "launch_overhead_s")
_DEVICE_ID = (0, MAX_DEVICES - 1)
_DEGREE = (1, MAX_DEVICES)


@dataclass(frozen=True)
class SavedSession:
    """What a session file holds, checked and built: ready for ``Session(...)``."""

    function: Function
    topology: Topology
    state: State
    undo: tuple[State, ...]
    redo: tuple[State, ...]


class _LongInteger:
    """A JSON integer of more than 19 digits (beyond int64, and past 4,300 beyond what
    Python converts): kept as text for the field that reads it to refuse, or to read
    as a float where a number goes."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return f"a {len(self.text.lstrip('-'))}-digit integer"


def parse_int(text: str) -> int | _LongInteger:
    return int(text) if len(text.lstrip("-")) <= 19 else _LongInteger(text)


class SessionReader:
    """Checks a parsed document field by field; every error names its JSON path."""

    def __init__(self, file: Path) -> None:
        self.file = file

    def fail(self, at: str, message: str) -> SessionFileError:
        return SessionFileError(self.file, at, message)

    def get(self, obj: dict[str, Any], key: str, at: str, kind: type | tuple[type, ...]) -> Any:
        if key not in obj:
            raise self.fail(f"{at}.{key}", "missing")
        return self.typed(obj[key], f"{at}.{key}", kind)

    def typed(self, value: Any, at: str, kind: type | tuple[type, ...]) -> Any:
        kinds = kind if isinstance(kind, tuple) else (kind,)
        ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
        if not ok:
            names = " or ".join(_JSON_NAMES.get(k, k.__name__) for k in kinds)
            shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
            raise self.fail(at, f"must be {names}, got {shown}")
        return value

    def integer(self, value: Any, at: str, bounds: tuple[int, int] = (-MAX_INT, MAX_INT)) -> int:
        """``value``: an integer within ``bounds`` (every size and device id has one)."""
        lo, hi = bounds
        if isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi:
            return value
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        raise self.fail(at, f"must be an integer from {lo} to {hi}, got {shown}")

    def get_integer(
        self, obj: dict[str, Any], key: str, at: str, bounds: tuple[int, int] = (-MAX_INT, MAX_INT)
    ) -> int:
        if key not in obj:
            raise self.fail(f"{at}.{key}", "missing")
        return self.integer(obj[key], f"{at}.{key}", bounds)

    def ints(self, value: Any, at: str, bounds: tuple[int, int] = (-MAX_INT, MAX_INT)) -> list[int]:
        items = self.typed(value, at, list)
        return [self.integer(x, f"{at}[{i}]", bounds) for i, x in enumerate(items)]

    def real(self, value: Any, at: str) -> float:
        """``value``: a finite number (an integer of any length is read as a float)."""
        if isinstance(value, _LongInteger):
            value = float(value.text)  # no digit limit; past 1e308 it is inf
        number = self.typed(value, at, (int, float))
        try:
            number = float(number)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):
            raise self.fail(at, f"must be a finite number, got {value!r}")
        return number

    def number(self, obj: dict[str, Any], key: str, at: str) -> float:
        if key not in obj:
            raise self.fail(f"{at}.{key}", "missing")
        return self.real(obj[key], f"{at}.{key}")

    def session(self, data: Any) -> SavedSession:
        doc = self.typed(data, "$", dict)
        fmt = self.get(doc, "format", "$", str)
        if fmt != FORMAT:
            raise self.fail("$.format", f"{fmt!r} is not a workbench session ({FORMAT!r})")
        version = self.get_integer(doc, "version", "$")
        if version != VERSION:
            newer = "a newer workbench" if version > VERSION else "no workbench"
            raise self.fail(
                "$.version",
                f"version {version} was written by {newer}; this one reads version {VERSION}",
            )
        text = self.get(doc, "program", "$", str)
        try:
            function = parse(text)
        except DistIRError as e:
            raise self.fail("$.program", f"the program does not parse: {e}") from None
        topology = self.topology(self.get(doc, "topology", "$", dict), "$.topology")
        names = {v.name for v in function.inputs} | {
            v.name for op in function.ops for v in op.outputs
        }
        state = self.state(doc, "$", names, topology)
        history = self.get(doc, "history", "$", dict)
        stacks = []
        for key in ("undo", "redo"):
            items = self.get(history, key, "$.history", list)
            at = f"$.history.{key}"
            stacks.append(
                tuple(
                    self.state(self.typed(s, f"{at}[{i}]", dict), f"{at}[{i}]", names, topology)
                    for i, s in enumerate(items)
                )
            )
        return SavedSession(function, topology, state, stacks[0], stacks[1])

    # -- state ----------------------------------------------------------------------------

    def state(self, obj: dict[str, Any], at: str, names: set[str], topology: Topology) -> State:
        raw = self.get(obj, "strategy", at, dict)
        fields: dict[str, Any] = {}
        for key in ("dp", "hp", "pp"):
            fields[key] = self.get_integer(raw, key, f"{at}.strategy", _DEGREE)
        fields["microbatches"] = self.get_integer(
            raw, "microbatches", f"{at}.strategy", (1, MAX_INT)
        )
        fields["schedule"] = self.get(raw, "schedule", f"{at}.strategy", str)
        for key, bounds in (("ep", _DEGREE), ("cp", _DEGREE), ("zero", (0, 3))):
            if key in raw:  # absent from files saved before issue 28: their defaults
                fields[key] = self.integer(raw[key], f"{at}.strategy.{key}", bounds)
        try:
            strategy = Strategy(**fields)
        except DistIRError as e:
            raise self.fail(f"{at}.strategy", str(e)) from None
        if strategy.num_devices > len(topology.devices):
            raise self.fail(
                f"{at}.strategy",
                f"{strategy.describe()} needs {strategy.num_devices} devices, but topology "
                f"{topology.name!r} has {len(topology.devices)}",
            )
        annotations: list[tuple[str, Annotation]] = []
        for i, item in enumerate(self.get(obj, "annotations", at, list)):
            where = f"{at}.annotations[{i}]"
            entry = self.typed(item, where, dict)
            name = self.get(entry, "value", where, str)
            if name not in names:
                raise self.fail(f"{where}.value", f"the program has no value named {name!r}")
            if any(n == name for n, _ in annotations):
                raise self.fail(f"{where}.value", f"{name!r} is annotated twice")
            annotations.append((name, self.annotation(entry, where, topology)))
        if annotations and not strategy.is_sequential:
            raise self.fail(at, "a state has either a strategy or annotations, not both")
        return State(strategy, tuple(annotations))

    def annotation(self, entry: dict[str, Any], at: str, topology: Topology) -> Annotation:
        ids = set(topology.device_ids)
        if "spec" in entry:
            raw = self.get(entry, "spec", at, dict)
            devices = self.ints(
                self.get(raw, "devices", f"{at}.spec", list), f"{at}.spec.devices", _DEVICE_ID
            )
            dims_at = f"{at}.spec.sharded_dims"
            dims = []
            for j, pair in enumerate(self.get(raw, "sharded_dims", f"{at}.spec", list)):
                pair = self.typed(pair, f"{dims_at}[{j}]", list)
                if len(pair) != 2:
                    raise self.fail(f"{dims_at}[{j}]", "must be [axis, num_shards]")
                pair = [
                    self.integer(pair[0], f"{dims_at}[{j}][0]"),
                    self.integer(pair[1], f"{dims_at}[{j}][1]", _DEGREE),
                ]
                dims.append((pair[0], pair[1]))
            device_map: dict[int, list[int]] = {}
            map_at = f"{at}.spec.device_map"
            for key, group in self.get(raw, "device_map", f"{at}.spec", dict).items():
                shown = key if len(key) <= 20 else f"{key[:17]}..."
                # ASCII digits, few enough for int(): "٣" is a digit to str.isdigit
                if not (key.isascii() and key.isdigit() and len(key) <= 19):
                    raise self.fail(
                        f"{map_at}.{shown}",
                        f"keys must be device numbers from 0 to {MAX_DEVICES - 1}",
                    )
                device = self.integer(int(key), f"{map_at}.{shown}", _DEVICE_ID)
                device_map[device] = self.ints(group, f"{map_at}.{shown}", _DEVICE_ID)
            try:
                spec = ShardingSpec(devices, dims, device_map)
            except DistIRError as e:
                raise self.fail(f"{at}.spec", str(e)) from None
            physical = [d for e in spec.devices for d in spec.device_map.get(e, (e,))]
            self._on_topology(physical, ids, f"{at}.spec.devices", topology)
            return spec
        mesh_raw = self.get(entry, "mesh", at, dict)
        shape = self.ints(
            self.get(mesh_raw, "shape", f"{at}.mesh", list), f"{at}.mesh.shape", _DEGREE
        )
        devices = self.ints(
            self.get(mesh_raw, "devices", f"{at}.mesh", list), f"{at}.mesh.devices", _DEVICE_ID
        )
        if not shape or len(shape) > len(devices) or math.prod(shape) != len(devices):
            raise self.fail(
                f"{at}.mesh",
                f"shape {shape} must list positive sizes whose product is the "
                f"{len(devices)} devices listed",
            )
        self._on_topology(devices, ids, f"{at}.mesh.devices", topology)
        try:
            mesh = Mesh(shape, devices)
        except DistIRError as e:
            raise self.fail(f"{at}.mesh", str(e)) from None
        texts = self.get(entry, "placements", at, list)
        if len(texts) != len(shape):
            raise self.fail(
                f"{at}.placements", f"{len(texts)} placement(s) for a mesh of {len(shape)} axes"
            )
        placements = []
        for j, text in enumerate(texts):
            text = self.typed(text, f"{at}.placements[{j}]", str)
            try:
                placements.append(placement(text))
            except DistIRError as e:
                raise self.fail(f"{at}.placements[{j}]", str(e)) from None
        return mesh, tuple(placements)

    def _on_topology(self, devices: list[int], ids: set[int], at: str, topology: Topology) -> None:
        missing = sorted(set(devices) - ids)
        if missing:
            raise self.fail(at, f"device(s) {missing[:8]} are not in topology {topology.name!r}")

    # -- topology -------------------------------------------------------------------------

    def topology(self, raw: dict[str, Any], at: str) -> Topology:
        tf32 = self.get(raw, "allow_tf32", at, bool)
        if "preset" in raw:
            name = self.get(raw, "preset", at, str)
            n = self.get_integer(raw, "devices", at, _DEGREE)
            try:
                return Topology.preset(name, n, allow_tf32=tf32)
            except DistIRError as e:
                raise self.fail(at, str(e)) from None
        name = self.get(raw, "name", at, str)
        devices = [
            self.device(self.typed(d, f"{at}.devices[{i}]", dict), f"{at}.devices[{i}]")
            for i, d in enumerate(self.get(raw, "devices", at, list))
        ]
        n = len(devices)
        links = [self.links(raw, key, at, n) for key in ("bandwidth_bytes_per_s", "latency_s")]
        nodes = tuple(
            tuple(self.ints(node, f"{at}.nodes[{i}]", _DEVICE_ID))
            for i, node in enumerate(self.get(raw, "nodes", at, list))
        )
        try:
            return Topology(tuple(devices), links[0], links[1], name, nodes, tf32)
        except DistIRError as e:
            raise self.fail(at, str(e)) from None

    def device(self, raw: dict[str, Any], at: str) -> Device:
        fields: dict[str, Any] = {
            "device_id": self.get_integer(raw, "device_id", at, _DEVICE_ID),
            "device_type": self.get(raw, "device_type", at, str),
        }
        for key in DEVICE_NUMBERS:
            fields[key] = self.number(raw, key, at)
        for key in ("matrix_peak_flops", "vector_peak_flops"):
            table = self.get(raw, key, at, dict)
            fields[key] = {
                dtype: self.real(flops, f"{at}.{key}.{dtype[:20]}")
                for dtype, flops in table.items()
            }
        try:
            return Device(**fields)
        except DistIRError as e:
            raise self.fail(at, str(e)) from None

    def links(self, raw: dict[str, Any], key: str, at: str, n: int) -> Any:
        value = self.get(raw, key, at, (dict, list))
        at = f"{at}.{key}"
        if isinstance(value, list):
            rows = [self.typed(r, f"{at}[{i}]", list) for i, r in enumerate(value)]
            return tuple(
                tuple(self.real(x, f"{at}[{i}][{j}]") for j, x in enumerate(row))
                for i, row in enumerate(rows)
            )
        if "uniform" in value:
            return LinkTable.uniform(n, self.number(value, "uniform", at))
        per_node = self.get_integer(value, "per_node", at, _DEGREE)
        intra = self.get(value, "intra", at, list)
        rows = [self.typed(r, f"{at}.intra[{i}]", list) for i, r in enumerate(intra)]
        local = min(per_node, n)
        if len(rows) != local or any(len(r) != local for r in rows):
            raise self.fail(f"{at}.intra", f"must be a {local}x{local} matrix")
        rows = [
            [self.real(x, f"{at}.intra[{i}][{j}]") for j, x in enumerate(row)]
            for i, row in enumerate(rows)
        ]
        return LinkTable.by_node(n, per_node, rows, self.number(value, "inter", at))


_JSON_NAMES: dict[type, str] = {
    dict: "an object",
    list: "an array",
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "true or false",
}
