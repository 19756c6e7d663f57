"""Session files: a workbench session as a versioned JSON document, and back.

The document holds the program as text (``ir.format``, read back with
``ir.parse``), the topology (a preset's name and device count, or every device's
figures and the links), the user's strategy and annotations, and the undo and
redo history. Reading it runs no code from the file: JSON only, every field
checked for its type and meaning before anything is built, and any fault is a
:class:`SessionFileError` naming the file and the field (a JSON path such as
``$.history.undo[2].annotations[0].placements[1]``). Writing goes to a temporary
file in the same folder, renamed over the target (``os.replace``) only once it is
complete, so a failure mid-way leaves the previous file as it was.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ir.device import Device, LinkTable, Topology
from ir.errors import DistIRError
from ir.function import Function
from ir.sharding import Mesh, ShardingSpec, placement
from ir.text import format_function, parse

from .session import Annotation, SessionError, State, Strategy

FORMAT = "distir-workbench-session"
VERSION = 1
MAX_FILE_BYTES = 256 * 2**20
"""Session files larger than this are refused before they are read (256 MiB)."""

_DEVICE_NUMBERS = ("peak_flops", "mem_bandwidth_bytes_per_s", "memory_bytes", "launch_overhead_s")


class SessionFileError(SessionError):
    """A session file that cannot be read or written; ``file`` and ``field`` say where."""

    def __init__(self, file: str | os.PathLike[str], field: str, message: str) -> None:
        self.file, self.field = str(file), field
        where = f"session file {self.file!r}" + (f", {field}" if field else "")
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True)
class SavedSession:
    """What a session file holds, checked and built: ready for ``Session(...)``."""

    function: Function
    topology: Topology
    state: State
    undo: tuple[State, ...]
    redo: tuple[State, ...]


# -- writing ----------------------------------------------------------------------------


def document(
    function: Function, topology: Topology, state: State, undo: list[State], redo: list[State]
) -> dict[str, Any]:
    """The JSON document of a session (plain dicts, lists, strings and numbers)."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "program": format_function(function),
        "topology": topology_document(topology),
        **state_document(state),
        "history": {
            "undo": [state_document(s) for s in undo],
            "redo": [state_document(s) for s in redo],
        },
    }


def state_document(state: State) -> dict[str, Any]:
    s = state.strategy
    strategy = {"dp": s.dp, "hp": s.hp, "pp": s.pp, "microbatches": s.microbatches}
    strategy["schedule"] = s.schedule  # type: ignore[assignment]
    return {
        "strategy": strategy,
        "annotations": [annotation_document(n, a) for n, a in state.annotations],
    }


def annotation_document(value_name: str, spec: Annotation) -> dict[str, Any]:
    if isinstance(spec, ShardingSpec):
        device_map = {str(k): list(v) for k, v in spec.device_map.items()}
        return {
            "value": value_name,
            "spec": {
                "devices": list(spec.devices),
                "sharded_dims": [list(d) for d in spec.sharded_dims],
                "device_map": device_map,
            },
        }
    mesh, placements = spec
    return {
        "value": value_name,
        "mesh": {"shape": list(mesh.shape), "devices": list(mesh.devices)},
        "placements": [str(p) for p in placements],
    }


def topology_document(topology: Topology) -> dict[str, Any]:
    """``{"preset", "devices", "allow_tf32"}`` for a preset as made, else the full description."""
    n = len(topology.devices)
    for name in Topology.presets():
        if topology.name in (name, f"{name}-{n}"):
            made = Topology.preset(name, n, allow_tf32=topology.allow_tf32)
            if made == topology:
                return {"preset": name, "devices": n, "allow_tf32": topology.allow_tf32}
    return {
        "name": topology.name,
        "devices": [_device_document(d) for d in topology.devices],
        "bandwidth_bytes_per_s": _links_document(topology.bandwidth_bytes_per_s),
        "latency_s": _links_document(topology.latency_s),
        "nodes": [list(node) for node in topology.nodes],
        "allow_tf32": topology.allow_tf32,
    }


def _device_document(d: Device) -> dict[str, Any]:
    out: dict[str, Any] = {"device_id": d.device_id, "device_type": d.device_type}
    out.update({k: getattr(d, k) for k in _DEVICE_NUMBERS})
    out["matrix_peak_flops"] = dict(d.matrix_peak_flops)
    out["vector_peak_flops"] = dict(d.vector_peak_flops)
    return out


def _links_document(links: Any) -> Any:
    if isinstance(links, LinkTable) and links.key[0] == "uniform":
        return {"uniform": links.key[1]}
    if isinstance(links, LinkTable) and links.key[0] == "by_node":
        _, per_node, intra, inter = links.key
        return {"per_node": per_node, "intra": [list(r) for r in intra], "inter": inter}
    return [list(row) for row in links]


def write_atomic(path: str | os.PathLike[str], write: Callable[[IO[str]], None]) -> Path:
    """Call ``write(file)`` on a temporary file beside ``path``, then rename it to ``path``.

    Whatever ``write`` raises, the file at ``path`` is as it was and no temporary file
    is left behind; an OSError (no such folder, no permission) becomes a SessionFileError.
    """
    target = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as e:
        raise SessionFileError(target, "", f"cannot write there: {e.strerror or e}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise SessionFileError(target, "", f"cannot write it: {e.strerror or e}") from None
        raise
    return target


def save(
    path: str | os.PathLike[str],
    function: Function,
    topology: Topology,
    state: State,
    undo: list[State],
    redo: list[State],
) -> Path:
    """Write the session's document to ``path`` atomically (see :func:`write_atomic`)."""
    doc = document(function, topology, state, undo, redo)

    def write(f: IO[str]) -> None:
        try:
            json.dump(doc, f, indent=1, allow_nan=False)
        except ValueError as e:  # a figure of inf or NaN has no JSON form
            raise SessionFileError(path, "", f"cannot save: {e}") from None
        f.write("\n")

    return write_atomic(path, write)


# -- reading ----------------------------------------------------------------------------


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def read(path: str | os.PathLike[str]) -> SavedSession:
    """Read and check the session file at ``path``; SessionFileError on any fault."""
    target = Path(path)
    try:
        size = target.stat().st_size
        if size > MAX_FILE_BYTES:
            raise SessionFileError(target, "", f"{size} bytes, more than {MAX_FILE_BYTES}")
        raw = target.read_bytes()
    except OSError as e:
        raise SessionFileError(target, "", f"cannot read it: {e.strerror or e}") from None
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except UnicodeDecodeError as e:
        raise SessionFileError(target, "", f"not UTF-8 text (byte {e.start})") from None
    except RecursionError:
        raise SessionFileError(target, "", "JSON nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, a number too long or not finite
        raise SessionFileError(target, "", f"not valid JSON: {e}") from None
    return _Reader(target).session(data)


class _Reader:
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

    def ints(self, value: Any, at: str) -> list[int]:
        items = self.typed(value, at, list)
        return [self.typed(x, f"{at}[{i}]", int) for i, x in enumerate(items)]

    def number(self, obj: dict[str, Any], key: str, at: str) -> float:
        return self.get(obj, key, at, (int, float))

    def session(self, data: Any) -> SavedSession:
        doc = self.typed(data, "$", dict)
        fmt = self.get(doc, "format", "$", str)
        if fmt != FORMAT:
            raise self.fail("$.format", f"{fmt!r} is not a workbench session ({FORMAT!r})")
        version = self.get(doc, "version", "$", int)
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
        for key in ("dp", "hp", "pp", "microbatches"):
            fields[key] = self.get(raw, key, f"{at}.strategy", int)
        fields["schedule"] = self.get(raw, "schedule", f"{at}.strategy", str)
        try:
            strategy = Strategy(**fields)
        except DistIRError as e:
            raise self.fail(f"{at}.strategy", str(e)) from None
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
            devices = self.ints(self.get(raw, "devices", f"{at}.spec", list), f"{at}.spec.devices")
            dims_at = f"{at}.spec.sharded_dims"
            dims = []
            for j, pair in enumerate(self.get(raw, "sharded_dims", f"{at}.spec", list)):
                pair = self.ints(pair, f"{dims_at}[{j}]")
                if len(pair) != 2:
                    raise self.fail(f"{dims_at}[{j}]", "must be [axis, num_shards]")
                dims.append((pair[0], pair[1]))
            device_map: dict[int, list[int]] = {}
            map_at = f"{at}.spec.device_map"
            for key, group in self.get(raw, "device_map", f"{at}.spec", dict).items():
                if not (key.isascii() and key.isdigit()):
                    raise self.fail(f"{map_at}.{key}", "keys must be device numbers")
                device_map[int(key)] = self.ints(group, f"{map_at}.{key}")
            try:
                spec = ShardingSpec(devices, dims, device_map)
            except DistIRError as e:
                raise self.fail(f"{at}.spec", str(e)) from None
            physical = [d for e in spec.devices for d in spec.device_map.get(e, (e,))]
            self._on_topology(physical, ids, f"{at}.spec.devices", topology)
            return spec
        mesh_raw = self.get(entry, "mesh", at, dict)
        shape = self.ints(self.get(mesh_raw, "shape", f"{at}.mesh", list), f"{at}.mesh.shape")
        devices = self.ints(self.get(mesh_raw, "devices", f"{at}.mesh", list), f"{at}.mesh.devices")
        if not shape or any(n < 1 for n in shape) or math.prod(shape) != len(devices):
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
            n = self.get(raw, "devices", at, int)
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
            tuple(self.ints(node, f"{at}.nodes[{i}]"))
            for i, node in enumerate(self.get(raw, "nodes", at, list))
        )
        try:
            return Topology(tuple(devices), links[0], links[1], name, nodes, tf32)
        except DistIRError as e:
            raise self.fail(at, str(e)) from None

    def device(self, raw: dict[str, Any], at: str) -> Device:
        fields: dict[str, Any] = {
            "device_id": self.get(raw, "device_id", at, int),
            "device_type": self.get(raw, "device_type", at, str),
        }
        for key in _DEVICE_NUMBERS:
            fields[key] = self.number(raw, key, at)
        for key in ("matrix_peak_flops", "vector_peak_flops"):
            table = self.get(raw, key, at, dict)
            for dtype, flops in table.items():
                self.typed(flops, f"{at}.{key}.{dtype}", (int, float))
            fields[key] = table
        try:
            return Device(**fields)
        except DistIRError as e:
            raise self.fail(at, str(e)) from None

    def links(self, raw: dict[str, Any], key: str, at: str, n: int) -> Any:
        value = self.get(raw, key, at, (dict, list))
        at = f"{at}.{key}"
        if isinstance(value, list):
            rows = [self.typed(r, f"{at}[{i}]", list) for i, r in enumerate(value)]
            for i, row in enumerate(rows):
                for j, x in enumerate(row):
                    self.typed(x, f"{at}[{i}][{j}]", (int, float))
            return tuple(tuple(row) for row in rows)
        if "uniform" in value:
            return LinkTable.uniform(n, self.number(value, "uniform", at))
        per_node = self.get(value, "per_node", at, int)
        if per_node < 1:
            raise self.fail(f"{at}.per_node", f"must be positive, got {per_node}")
        intra = self.get(value, "intra", at, list)
        rows = [self.typed(r, f"{at}.intra[{i}]", list) for i, r in enumerate(intra)]
        local = min(per_node, n)
        if len(rows) != local or any(len(r) != local for r in rows):
            raise self.fail(f"{at}.intra", f"must be a {local}x{local} matrix")
        for i, row in enumerate(rows):
            for j, x in enumerate(row):
                self.typed(x, f"{at}.intra[{i}][{j}]", (int, float))
        return LinkTable.by_node(n, per_node, rows, self.number(value, "inter", at))


_JSON_NAMES: dict[type, str] = {
    dict: "an object",
    list: "an array",
    str: "a string",
    int: "an integer",
    float: "a number",
    bool: "true or false",
}
