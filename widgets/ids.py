"""Stable names for what the views show: op ids from index paths, value names
as the printer assigns them, compact shape labels."""

from __future__ import annotations

import re

from ir.function import Function
from ir.op import Op
from ir.types import TupleType, Type
from ir.value import Value

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_RESERVED = {"def", "return", "lambda", "_"}  # as the printer spells them


def op_id(path: str) -> str:
    """The SVG id of the op at index path ``path`` (``"3.1"`` -> ``"op-3.1"``)."""
    return f"op-{path}"


def op_paths(function: Function) -> dict[Op, str]:
    """Index path of every op, pmap bodies included: ``"3"``, ``"3.1"``, ..."""
    paths: dict[Op, str] = {}

    def walk(fn: Function, prefix: str) -> None:
        for i, op in enumerate(fn.ops):
            paths[op] = f"{prefix}{i}"
            for body in op.subfunctions:
                walk(body, f"{prefix}{i}.")

    walk(function, "")
    return paths


def value_names(function: Function) -> dict[Value, str]:
    """Unique names for every value, assigned in print order as the printer does."""
    names: dict[Value, str] = {}
    taken: set[str] = set()

    def name(v: Value) -> None:
        if v in names:
            return
        base = v.name if _IDENT.match(v.name or "") else _sanitize(v.name)
        if base in _RESERVED:
            base = f"{base.strip('_') or 'v'}_"
        unique, k = base, 0
        while unique in taken:
            k += 1
            unique = f"{base}_{k}"
        taken.add(unique)
        names[v] = unique

    def walk(fn: Function) -> None:
        for v in fn.inputs:
            name(v)
        for op in fn.ops:
            for v in op.outputs:
                name(v)
            for body in op.subfunctions:
                walk(body)

    walk(function)
    return names


def _sanitize(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_]", "_", name or "v")
    return s if _IDENT.match(s) else f"v_{s}"


def shape_label(t: Type) -> str:
    """A compact shape: ``8×4``, ``scalar``, ``2 × [8×4]`` for a uniform tuple."""
    if isinstance(t, TupleType):
        parts = [shape_label(e) for e in t.elements]
        if parts and all(p == parts[0] for p in parts):
            return f"{len(parts)} × [{parts[0]}]"
        text = ", ".join(parts)
        return "[" + (text if len(text) <= 40 else text[:37] + "...") + "]"
    dims = "×".join(map(str, t.shape)) if t.shape else "scalar"
    return dims if t.dtype.value == "float32" else f"{dims} {t.dtype.value}"
