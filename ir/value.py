"""Values: the edges of the dataflow graph."""

from __future__ import annotations

from dataclasses import dataclass

from .types import Type


@dataclass(frozen=True, eq=False, init=False, slots=True)
class Value:
    """A value defined once (a function input or an op output).

    A value is equal only to itself; ``name`` is a hint that the printer makes
    unique, so two values may share a name.
    """

    name: str
    type: Type

    def __init__(self, name: str, type: Type) -> None:
        # The slots' own setters, not a frozen dataclass's object.__setattr__ per field,
        # and no __dict__: a distributed program makes a value per device of every
        # result, and the cyclic GC scans every object a build leaves.
        _set_name(self, name)
        _set_type(self, type)

    def __repr__(self) -> str:
        return f"Value({self.name!r}: {self.type})"


_set_name, _set_type = Value.__dict__["name"].__set__, Value.__dict__["type"].__set__
