"""Ops: the nodes of the dataflow graph."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from .types import DeviceRef
from .value import Value

if TYPE_CHECKING:
    from .function import Function


def freeze_attributes(attributes: Mapping[str, Any]) -> Mapping[str, Any]:
    """A read-only copy of ``attributes`` with lists turned into tuples."""
    return MappingProxyType({k: _freeze(v) for k, v in attributes.items()})


#: Values that are frozen as they are: a list of only these becomes a tuple in one C call.
_ATOMS = frozenset({int, float, str, bool, type(None)})


def _freeze(v: Any) -> Any:
    kind = type(v)
    if (kind is tuple or kind is list) and set(map(type, v)) <= _ATOMS:
        return v if kind is tuple else tuple(v)  # a group of device ids: no call per id
    if isinstance(v, (list, tuple)):
        return tuple(_freeze(x) for x in v)
    if isinstance(v, Mapping):
        return MappingProxyType({k: _freeze(x) for k, x in v.items()})
    return v


_NO_ATTRIBUTES: Mapping[str, Any] = MappingProxyType({})


def _thaw(v: Any) -> Any:
    if isinstance(v, Mapping):
        return {k: _thaw(x) for k, x in v.items()}
    if isinstance(v, tuple):
        return tuple(_thaw(x) for x in v)
    return v


def _rebuild(op_type, inputs, outputs, attributes, device, subfunctions, name) -> Op:
    return Op(op_type, inputs, outputs, freeze_attributes(attributes), device, subfunctions, name)


@dataclass(frozen=True, eq=False, init=False, slots=True)
class Op:
    """One application of a registered op type.

    ``op_type`` is the canonical registry name (``MatMul``, ``AllReduce``, ``Pmap``).
    ``device`` is where a single-device op runs; communication ops that span
    several devices have ``device=None`` and carry their devices in their types
    and attributes. ``subfunctions`` holds the body of a ``Pmap``.
    """

    op_type: str
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]
    attributes: Mapping[str, Any] = field(default_factory=lambda: _NO_ATTRIBUTES)
    device: DeviceRef = None
    subfunctions: tuple[Function, ...] = ()
    name: str = ""

    def __init__(
        self,
        op_type: str,
        inputs: tuple[Value, ...],
        outputs: tuple[Value, ...],
        attributes: Mapping[str, Any] = _NO_ATTRIBUTES,
        device: DeviceRef = None,
        subfunctions: tuple[Function, ...] = (),
        name: str = "",
    ) -> None:
        # Slot stores, not a frozen dataclass's object.__setattr__ per field, and no
        # __dict__: builders create an op for every step of every microbatch of a
        # distributed program, and the cyclic GC scans every object they leave.
        _set_op_type(self, op_type)
        _set_inputs(self, inputs)
        _set_outputs(self, outputs)
        _set_attributes(self, attributes)
        _set_device(self, device)
        _set_subfunctions(self, subfunctions)
        _set_name(self, name)

    def __reduce__(self) -> tuple:
        # read-only attribute mappings do not pickle: send plain dicts, freeze them again
        return (
            _rebuild,
            (
                self.op_type,
                self.inputs,
                self.outputs,
                _thaw(self.attributes),
                self.device,
                self.subfunctions,
                self.name,
            ),
        )

    def __repr__(self) -> str:
        ins = ", ".join(v.name for v in self.inputs)
        outs = ", ".join(v.name for v in self.outputs)
        return f"Op({outs} = {self.op_type}({ins}))"


# the slots' own setters (a frozen dataclass's __setattr__ refuses every store)
(
    _set_op_type,
    _set_inputs,
    _set_outputs,
    _set_attributes,
    _set_device,
    _set_subfunctions,
    _set_name,
) = (
    Op.__dict__[n].__set__
    for n in ("op_type", "inputs", "outputs", "attributes", "device", "subfunctions", "name")
)
