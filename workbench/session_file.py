"""Session files: a workbench session as a versioned JSON document, and back.

The document holds the program as text (``ir.format``, read back with
``ir.parse``), the topology (a preset's name and device count, or every device's
figures and the links), the user's strategy and annotations, and the undo and
redo history. Reading it runs no code from the file: JSON only, every field
checked for its type, its range and its meaning before anything is built (every
state of the history too, not when undo reaches it), and any fault is a
:class:`SessionFileError` naming the file and the field (a JSON path such as
``$.history.undo[2].annotations[0].placements[1]``). The file itself is opened by
``workbench.files``: only a regular file, at most :data:`MAX_FILE_BYTES`; a save
goes to a temporary file beside the target, renamed over it only once complete (a
failure mid-way leaves the previous file as it was), through a symbolic link
rather than over it, and never over a device file, a FIFO or a directory.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO, Any

from ir.device import Device, LinkTable, Topology
from ir.function import Function
from ir.sharding import ShardingSpec
from ir.text import format_function

from .files import SessionFileError, checked_path, read_regular, write_atomic
from .session import Annotation, State
from .session_reader import (
    DEVICE_NUMBERS,
    FORMAT,
    VERSION,
    SavedSession,
    SessionReader,
    parse_int,
)

MAX_FILE_BYTES = 256 * 2**20
"""Session files larger than this are refused before they are read (256 MiB)."""


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
    strategy.update(ep=s.ep, cp=s.cp, zero=s.zero)
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
    out.update({k: getattr(d, k) for k in DEVICE_NUMBERS})
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
    target = checked_path(path)
    raw = read_regular(target, MAX_FILE_BYTES)
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_no_constant, parse_int=parse_int)
    except UnicodeDecodeError as e:
        raise SessionFileError(target, "", f"not UTF-8 text (byte {e.start})") from None
    except RecursionError:
        raise SessionFileError(target, "", "JSON nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, a number too long or not finite
        raise SessionFileError(target, "", f"not valid JSON: {e}") from None
    return SessionReader(target).session(data)
