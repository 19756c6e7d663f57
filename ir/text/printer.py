"""The printer: Functions in the seeds' syntax, which ``ir.parse`` reads back.

One generic form serves every op (``outs: types = OpType(operands, attr=value)``);
only ``Pmap`` has the seeds' ``pmap(device_var=d, fn=lambda ...: {...}, (data))``
layout. Names are hints: the printer makes them unique and valid identifiers
(a pmap body has its own namespace, as it has its own scope). Attributes equal
to their registered default are left out, and a tuple of four or more equal
tensors on consecutive devices is written ``Tuple[T@1, ..., T@N]``.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Mapping
from typing import Any

from ..function import Function
from ..op import Op
from ..registry import REQUIRED, get_op
from ..types import DeviceVar, DType, TensorType, TupleType, Type
from ..types import format_type as _format_type
from ..value import Value

_INDENT = "    "
_RESERVED = {"def", "return", "lambda", "_"}
_MAX_LINE = 100
_ELLIPSIS_MIN = 4  # tuples at least this long are written with "..." when they can be


class _Names:
    """Unique, valid identifiers for values, assigned in print order."""

    def __init__(self) -> None:
        self._of: dict[Value, str] = {}
        self._taken: set[str] = set()

    def __call__(self, v: Value) -> str:
        name = self._of.get(v)
        if name is None:
            base = v.name if is_name(v.name) else _sanitize(v.name)
            if base in _RESERVED:
                base = f"{base.strip('_') or 'v'}_"
            name, k = base, 0
            while name in self._taken:
                k += 1
                name = f"{base}_{k}"
            self._taken.add(name)
            self._of[v] = name
        return name


def is_name(name: object) -> bool:
    """Whether the lexer reads ``name`` back as this very name: a Python identifier in
    NFKC normal form (the lexer normalises names, as Python does)."""
    return (
        isinstance(name, str)
        and name.isidentifier()
        and unicodedata.normalize("NFKC", name) == name
    )


def _sanitize(name: object) -> str:
    text = unicodedata.normalize("NFKC", name) if isinstance(name, str) and name else "v"
    s = "".join(c if ("_" + c).isidentifier() else "_" for c in text)
    return s if is_name(s) else f"v_{s}"


def format_function(function: Function) -> str:
    """The whole Function as text."""
    lines: list[str] = []
    _function_lines(function, _Names(), lines, "")
    return "\n".join(lines)


def format_op(op: Op) -> str:
    """One op as a line of text (pmap bodies elided), for messages and labels."""
    names = _Names()
    if op.op_type == "Pmap":
        data = ", ".join(names(v) for v in op.inputs)
        return f"{_lhs(op, names)} = pmap(device_var={op.attributes['device_var']}, ({data}))"
    if op.op_type == "Task":
        data = ", ".join(names(v) for v in op.inputs)
        return f"{_lhs(op, names)} = task({op.subfunctions[0].name}, ({data}))"
    return _op_line(op, names)


def format_attribute(value: Any) -> str:
    """An attribute value in the text format."""
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # the lexer reads JSON's escapes
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


def format_type(t: Type) -> str:
    """A type as the printer writes it: ``ir.types.format_type``, with long uniform tuples
    shortened to ``Tuple[T@first, ..., T@last]`` (the parser expands them back)."""
    if isinstance(t, TupleType):
        elements = t.elements
        if _is_device_run(elements):
            shown = [format_type(elements[0]), "...", format_type(elements[-1])]
        else:
            shown = [format_type(e) for e in elements]
        return "Tuple[" + ", ".join(shown) + "]"
    return _format_type(t)


def _is_device_run(elements: tuple[Type, ...]) -> bool:
    """Equal tensors on devices k, k+1, ..., k+n-1 (n >= _ELLIPSIS_MIN)."""
    if len(elements) < _ELLIPSIS_MIN or not all(isinstance(e, TensorType) for e in elements):
        return False
    first = elements[0]
    if not isinstance(first.device, int) or isinstance(first.device, bool):
        return False
    return all(
        e.with_device(None) == first.with_device(None) and e.device == first.device + i
        for i, e in enumerate(elements)
    )


def _layout_suffix(levels: tuple[str, ...] | None) -> str:
    """`` layout ["R@2", "S(1)@2"]`` after a steady-state step's input or output."""
    return "" if levels is None else " layout " + format_attribute(list(levels))


def _function_lines(function: Function, names: _Names, lines: list[str], indent: str) -> None:
    layouts = function.input_layouts or (None,) * len(function.inputs)
    params = ", ".join(
        f"{names(v)}: {format_type(v.type)}{_layout_suffix(levels)}"
        for v, levels in zip(function.inputs, layouts)
    )
    lines.append(f"{indent}def {function.name}({params}):")
    _body_lines(function, names, lines, indent + _INDENT, function.output_layouts)


def _body_lines(
    function: Function, names: _Names, lines: list[str], indent: str, layouts: tuple = ()
) -> None:
    for op in function.ops:
        if op.op_type == "Pmap":
            _pmap_lines(op, names, lines, indent)
        elif op.op_type == "Task":
            _pmap_lines(op, names, lines, indent, task=True)
        else:
            lines.append(indent + _op_line(op, names))
    layouts = layouts or (None,) * len(function.outputs)
    outputs = ", ".join(
        names(v) + _layout_suffix(levels) for v, levels in zip(function.outputs, layouts)
    )
    lines.append(indent + ("return " + outputs if outputs else "return"))


def _lhs(op: Op, names: _Names) -> str:
    if len(op.outputs) == 1:
        v = op.outputs[0]
        return f"{names(v)}: {format_type(v.type)}"
    outs = ", ".join(names(v) for v in op.outputs)
    return f"({outs}): {format_type(TupleType(tuple(v.type for v in op.outputs)))}"


def _op_line(op: Op, names: _Names) -> str:
    args = [names(v) for v in op.inputs]
    args += [f"{k}={format_attribute(v)}" for k, v in _shown_attributes(op).items()]
    return f"{_lhs(op, names)} = {op.op_type}({', '.join(args)})"


def _shown_attributes(op: Op) -> dict[str, Any]:
    """The attributes that differ from their registered defaults (all of them if unknown)."""
    try:
        defaults = {a.name: a.default for a in get_op(op.op_type).attributes}
    except Exception:  # an unregistered op still prints, with every attribute
        defaults = {}
    return {
        k: v
        for k, v in op.attributes.items()
        if k not in defaults or defaults[k] is REQUIRED or not _same(v, defaults[k])
    }


def _same(value: Any, default: Any) -> bool:
    if isinstance(value, bool) or isinstance(default, bool):
        return type(value) is type(default) and value == default
    if isinstance(value, (DeviceVar, DType, str)) or isinstance(default, (DeviceVar, DType, str)):
        return type(value) is type(default) and value == default
    return _plain(value) == _plain(default)


def _plain(v: Any) -> Any:
    if isinstance(v, Mapping):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (tuple, list)):
        return tuple(_plain(x) for x in v)
    return v


def _pmap_lines(op: Op, names: _Names, lines: list[str], indent: str, task: bool = False) -> None:
    """A pmap (or, ``task``, a task: its body on concrete devices, no device variable)."""
    (body,) = op.subfunctions
    inner = indent + _INDENT
    lines.append(indent + "(")
    for v in op.outputs:
        lines.append(f"{inner}{names(v)}: {format_type(v.type)},")
    lines.append(indent + (") = task(" if task else ") = pmap("))
    if not task:
        lines.append(f"{inner}device_var={op.attributes['device_var']},")
    if op.attributes.get("device_map") is not None:
        lines.append(f"{inner}device_map={format_attribute(op.attributes['device_map'])},")
    body_names = _Names()  # a body is its own scope
    params = [f"({body_names(v)}: {format_type(v.type)})" for v in body.inputs]
    head = f"{inner}fn=lambda "
    if not params:  # a task of no operands
        lines.append(head + "(): {")
    elif len(head) + sum(len(p) + 2 for p in params) + 3 <= _MAX_LINE or len(params) == 1:
        lines.append(head + ", ".join(params) + ": {")
    else:
        pad = " " * len(head)
        for i, p in enumerate(params):
            last = i == len(params) - 1
            lines.append((head if i == 0 else pad) + p + (": {" if last else ","))
    _body_lines(body, body_names, lines, inner + _INDENT)
    lines.append(inner + "},")
    data = ", ".join(names(v) for v in op.inputs) + ("," if len(op.inputs) == 1 else "")
    lines.append(inner + "(" + data + ")")
    lines.append(indent + ")")
