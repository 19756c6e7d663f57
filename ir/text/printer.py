"""The printer: Functions in the seeds' syntax, which ``ir.parse`` reads back.

One generic form serves every op (``outs: types = OpType(operands, attr=value)``);
only ``Pmap`` has the seeds' ``pmap(device_var=d, fn=lambda ...: {...}, (data))``
layout. Names are hints: the printer makes them unique and valid identifiers.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..function import Function
from ..op import Op
from ..types import DeviceVar, DType, TupleType, format_type
from ..value import Value

_INDENT = "    "
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class _Names:
    """Unique, valid identifiers for values, assigned in print order."""

    def __init__(self) -> None:
        self._of: dict[Value, str] = {}
        self._taken: set[str] = set()

    def __call__(self, v: Value) -> str:
        name = self._of.get(v)
        if name is None:
            base = v.name if _IDENT.match(v.name or "") else _sanitize(v.name)
            name, k = base, 0
            while name in self._taken:
                k += 1
                name = f"{base}_{k}"
            self._taken.add(name)
            self._of[v] = name
        return name


def _sanitize(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_]", "_", name or "v")
    return s if _IDENT.match(s) else f"v_{s}"


def format_function(function: Function) -> str:
    """The whole Function as text."""
    lines: list[str] = []
    _function_lines(function, _Names(), lines, "")
    return "\n".join(lines) + "\n"


def format_op(op: Op) -> str:
    """One op as a line of text (pmap bodies elided), for messages and labels."""
    names = _Names()
    if op.op_type == "Pmap":
        data = ", ".join(names(v) for v in op.inputs)
        return f"{_lhs(op, names)} = pmap(device_var={op.attributes['device_var']}, ({data}))"
    return _op_line(op, names)


def format_attribute(value: Any) -> str:
    """An attribute value in the text format."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, DeviceVar):
        return str(value)
    if isinstance(value, DType):
        return value.value
    if isinstance(value, Mapping):
        items = ", ".join(f"{format_attribute(k)}: {format_attribute(v)}" for k, v in value.items())
        return "{" + items + "}"
    if isinstance(value, (tuple, list)):
        return "[" + ", ".join(format_attribute(x) for x in value) + "]"
    raise TypeError(f"attribute value {value!r} has no text form")


def _function_lines(function: Function, names: _Names, lines: list[str], indent: str) -> None:
    params = ", ".join(f"{names(v)}: {format_type(v.type)}" for v in function.inputs)
    lines.append(f"{indent}def {function.name}({params}):")
    _body_lines(function, names, lines, indent + _INDENT)


def _body_lines(function: Function, names: _Names, lines: list[str], indent: str) -> None:
    for op in function.ops:
        if op.op_type == "Pmap":
            _pmap_lines(op, names, lines, indent)
        else:
            lines.append(indent + _op_line(op, names))
    lines.append(indent + "return " + ", ".join(names(v) for v in function.outputs))


def _lhs(op: Op, names: _Names) -> str:
    if len(op.outputs) == 1:
        v = op.outputs[0]
        return f"{names(v)}: {format_type(v.type)}"
    outs = ", ".join(names(v) for v in op.outputs)
    return f"({outs}): {format_type(TupleType(tuple(v.type for v in op.outputs)))}"


def _op_line(op: Op, names: _Names) -> str:
    args = [names(v) for v in op.inputs]
    args += [f"{k}={format_attribute(v)}" for k, v in op.attributes.items()]
    return f"{_lhs(op, names)} = {op.op_type}({', '.join(args)})"


def _pmap_lines(op: Op, names: _Names, lines: list[str], indent: str) -> None:
    (body,) = op.subfunctions
    inner = indent + _INDENT
    lines.append(indent + "(")
    for v in op.outputs:
        lines.append(f"{inner}{names(v)}: {format_type(v.type)},")
    lines.append(indent + ") = pmap(")
    lines.append(f"{inner}device_var={op.attributes['device_var']},")
    if op.attributes.get("device_map") is not None:
        lines.append(f"{inner}device_map={format_attribute(op.attributes['device_map'])},")
    params = ", ".join(f"({names(v)}: {format_type(v.type)})" for v in body.inputs)
    lines.append(f"{inner}fn=lambda {params}: {{")
    _body_lines(body, names, lines, inner + _INDENT)
    lines.append(inner + "},")
    data = ", ".join(names(v) for v in op.inputs) + ("," if len(op.inputs) == 1 else "")
    lines.append(inner + "(" + data + ")")
    lines.append(indent + ")")
