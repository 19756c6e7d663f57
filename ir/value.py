"""Values: the edges of the dataflow graph."""

from __future__ import annotations

from dataclasses import dataclass

from .types import Type


@dataclass(frozen=True, eq=False)
class Value:
    """A value defined once (a function input or an op output).

    A value is equal only to itself; ``name`` is a hint that the printer makes
    unique, so two values may share a name.
    """

    name: str
    type: Type

    def __repr__(self) -> str:
        return f"Value({self.name!r}: {self.type})"
