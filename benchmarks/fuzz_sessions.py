"""The *sessions* target of ``benchmarks/fuzz.py``: session files with hostile fields,
and hostile paths to load from and save to.

*fields*: a valid session document (an MLP with annotations in several forms, a
strategy, an undo and redo history; on a preset topology, or a dense one with its
devices' figures, links and nodes) with one field, or one key of an object, replaced by
a hostile value: numbers far out of range (``10**400``, a 5,000-digit integer,
``2**63``, ``-1``, ``1e400``, ``-0.0``), wrong types (strings, ``null``, ``true``,
lists, objects), text with NUL, non-ASCII digits or 100,000 characters, a device map
key of 5,000 digits. Loading must give a project error naming the field replaced or
one that holds it (``$.topology`` for a device the topology refuses), or load.

*paths*: ``Session.load`` and ``Session.save`` on special files and odd paths:
``/dev/zero`` and ``/dev/urandom`` (loaded only), a character device made in a
scratch folder (saved to), a FIFO, a directory, a Unix socket, a
symbolic link loop, a dangling link, a link to a file, a path with a NUL, ``None``, an
int, bytes, an empty string, a sparse file over the size limit. A save through a link
must keep the link; a save refused must leave what the path names as it was.
"""

from __future__ import annotations

import atexit
import json
import os
import random
import shutil
import socket
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fuzz_transforms import WrongOutputError

from ir import models
from ir.device import Device, Topology
from ir.sharding import Mesh, S, ShardingSpec
from workbench import Session
from workbench.session_file import SessionFileError


class Raw:
    """JSON text written as is (numbers Python cannot write: 5,000 digits, 1e400)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text if len(self.text) <= 12 else f"<a {len(self.text)}-character number>"


HOSTILE: list[Any] = [
    10**400, -(10**400), Raw("9" * 5000), Raw("-" + "9" * 5000), 2**63, 2**64, 2**31, -1, 0,
    Raw("1e400"), Raw("-1e400"), Raw("1" * 400 + ".5"), 1.5, -0.0, 1e308, 1e-320, None, True,
    False, "", "x", "1", "٣", "a\x00b", "x" * 100_000, [], {}, [1], {"a": 1}, [[0, 1]],
    [-1, 0], [10**400], [Raw("9" * 5000)],
]  # fmt: skip
"""JSON values that are wrong for most fields (some are right for some)."""


def dumps(doc: Any) -> str:
    """``json.dumps``, with :class:`Raw` values written as their text."""
    raws: list[Raw] = []

    def encode(node: Any) -> Any:
        if isinstance(node, Raw):
            raws.append(node)
            return f"@raw{len(raws) - 1}@"
        if isinstance(node, dict):
            return {k: encode(v) for k, v in node.items()}
        if isinstance(node, list):
            return [encode(v) for v in node]
        return node

    text = json.dumps(encode(doc))
    for i, raw in enumerate(raws):
        text = text.replace(f'"@raw{i}@"', raw.text)
    return text


class SessionCase:
    """A saved session's document and the folder the cases write into."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="fuzz-sessions-"))
        atexit.register(shutil.rmtree, self.folder, True)
        mlp = models.mlp(8, 16, 32, 4)
        dense = Topology(
            tuple(Device(i, "toy", 2e12, 3e11, 8e9, 1e-6, {"float32": 2e12}) for i in range(4)),
            tuple(tuple(0.0 if i == j else 1e10 for j in range(4)) for i in range(4)),
            tuple(tuple(0.0 if i == j else 1e-6 for j in range(4)) for i in range(4)),
            name="toy",
            nodes=((0, 1), (2, 3)),
        )
        self.documents = []
        for topology in (Topology.preset("a100-hgx", 4), dense):
            s = Session(mlp, topology)
            s.annotate("h", ShardingSpec([0, 1], [(1, 2)], {0: [0, 2], 1: [1, 3]}))
            s.set_strategy(dp=2, microbatches=1)
            s.annotate("wA", (Mesh((4,)), [S(1)]))
            s.annotate("x", (Mesh((2, 2)), ["S(0)", "R"]))
            s.undo()
            path = s.save(self.folder / "valid.json")
            self.documents.append(json.loads(path.read_text()))
        self.session = Session(mlp, Topology.preset("a100-hgx", 4))


def _places(node: Any, at: str = "$") -> list[tuple[Any, Any, str]]:
    """(parent, key, JSON path) of every value in ``node``."""
    out = []
    if isinstance(node, dict):
        for key, value in node.items():
            out.append((node, key, f"{at}.{key}"))
            out += _places(value, f"{at}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out.append((node, i, f"{at}[{i}]"))
            out += _places(value, f"{at}[{i}]")
    return out


def related(field: str, at: str) -> bool:
    """The error's ``field`` is the path replaced, holds it, or lies within it."""
    return at.startswith(field) or field.startswith(at)


class UnlocatedError(AssertionError):
    """A project error whose field is neither the replaced one nor one that holds it."""


def field_case(rng: random.Random, case: SessionCase) -> tuple[str, Callable[[], Any]]:
    """One document with one hostile field or key: (what it is, the load)."""
    doc = json.loads(json.dumps(rng.choice(case.documents)))
    places = _places(doc)
    parent, key, at = rng.choice(places)
    if isinstance(parent, dict) and rng.random() < 0.2:  # a hostile key instead
        new_key = rng.choice(["9" * 5000, "-1", "٣", "", "x", "4", "65536", "1" * 20, "a\x00"])
        parent[new_key] = parent.pop(key)
        at = at.rsplit(".", 1)[0]
        shown = f"key {at}.{new_key[:12]!r}"
    else:
        value = rng.choice(HOSTILE)
        parent[key] = value
        shown = f"{at} = {_short(value)}"
    text = dumps(doc)
    path = case.folder / f"case-{rng.randrange(10**9)}.json"

    def run() -> None:
        path.write_text(text)
        try:
            Session.load(path)
        except SessionFileError as e:
            if not related(e.field, at):
                raise UnlocatedError(f"{shown}: the error names {e.field}: {e}") from None
            raise
        finally:
            path.unlink(missing_ok=True)

    return shown, run


def _short(value: Any) -> str:
    try:
        text = repr(value)
    except ValueError:
        return f"<an integer of {value.bit_length()} bits>"
    return text if len(text) <= 40 else text[:37] + "..."


# -- special files and odd paths ------------------------------------------------------


def _special(folder: Path, kind: str) -> Any:
    """A path of kind ``kind`` in ``folder`` (made fresh)."""
    name = folder / f"{kind}-{random.randrange(10**9)}"
    if kind == "chardev":  # a null device of its own: a save must never touch /dev's
        try:
            os.mknod(name, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        except PermissionError:  # not root: a FIFO is as special
            os.mkfifo(name)
    elif kind == "fifo":
        os.mkfifo(name)
    elif kind == "directory":
        name.mkdir()
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        short = Path(tempfile.mkdtemp(prefix="s")) / "s"  # AF_UNIX paths are short
        atexit.register(shutil.rmtree, short.parent, True)
        sock.bind(str(short))
        sock.close()
        return short
    elif kind == "loop":
        os.symlink(name.name + "-b", name)
        os.symlink(name.name, str(name) + "-b")
    elif kind == "dangling":
        os.symlink(name.name + "-missing", name)
    elif kind == "link":
        (folder / (name.name + "-target")).write_text("{}")
        os.symlink(name.name + "-target", name)
    elif kind == "sparse":
        with open(name, "wb") as f:
            f.truncate(256 * 2**20 + 1)  # one byte over the limit, no disk used
    elif kind == "file":
        name.write_text("{}")
    return name


PATHS = [
    "/dev/zero", "/dev/urandom", "chardev", "fifo", "directory", "socket", "loop",
    "dangling", "link", "sparse", "file", "nul", None, 7, b"bytes.json", "", 1.5,
]  # fmt: skip
"""Where a case loads from or saves to. ``/dev/zero`` and ``/dev/urandom`` are only ever
read: a save goes to ``chardev``, a device file made in the case's own folder (a save
that replaced a device file, as the workbench's did before issue 25, would otherwise
replace the machine's own when run as root)."""


def path_case(rng: random.Random, case: SessionCase) -> tuple[str, Callable[[], Any]]:
    """Load from or save to a special file or odd path: (what it is, the call)."""
    kind = rng.choice(PATHS)
    how = rng.choice(["load", "save"])
    if how == "save" and isinstance(kind, str) and kind.startswith("/dev/"):
        kind = "chardev"

    def run() -> None:
        if isinstance(kind, str) and kind.startswith("/dev/"):
            path: Any = kind
        elif kind == "nul":
            path = str(case.folder / "a\x00b.json")
        elif kind == "bytes.json" or isinstance(kind, bytes):
            path = bytes(case.folder / "bytes.json")
        elif isinstance(kind, str) and kind:
            path = _special(case.folder, kind)
        else:
            path = kind
        before = _what_is(path)
        if how == "load":
            Session.load(path)
            return
        try:
            case.session.save(path)
        except SessionFileError:
            if _what_is(path) != before:
                raise WrongOutputError(f"a refused save changed {path!r}") from None
            raise
        if kind in ("link", "dangling") and not os.path.islink(path):
            raise WrongOutputError(f"saving through the link {path} replaced the link")

    return f"{how} {kind!r}", run


def _what_is(path: Any) -> Any:
    """What ``path`` names: its kind and, for a file, its bytes (None: nothing, or no path)."""
    try:
        info = os.lstat(path)
    except (OSError, TypeError, ValueError):
        return None
    if stat.S_ISREG(info.st_mode) and info.st_size < 2**20:
        return ("file", Path(os.fsdecode(path)).read_bytes())
    return (stat.S_IFMT(info.st_mode), info.st_rdev, info.st_size)


def session_case(rng: random.Random, case: SessionCase) -> tuple[str, Callable[[], Any]]:
    """A hostile field (three in four) or a hostile path."""
    return field_case(rng, case) if rng.random() < 0.75 else path_case(rng, case)


__all__ = ["HOSTILE", "PATHS", "SessionCase", "UnlocatedError", "related", "session_case"]
