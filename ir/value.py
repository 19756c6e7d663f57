"""Values: the edges of the dataflow graph."""

from __future__ import annotations

from dataclasses import dataclass

from .types import Type


@dataclass(frozen=True, eq=False, init=False)
class Value:
    """A value defined once (a function input or an op output).

    A value is equal only to itself; ``name`` is a hint that the printer makes
    unique, so two values may share a name.
    """

    name: str
    type: Type

    def __init__(self, name: str, type: Type) -> None:
        # Two item stores, not a frozen dataclass's object.__setattr__ per field: a
        # distributed program makes a value per device of every result.
        d = self.__dict__
        d["name"] = name
        d["type"] = type

    def __repr__(self) -> str:
        return f"Value({self.name!r}: {self.type})"
