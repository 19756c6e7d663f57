"""The text format: the seeds' syntax, printed and parsed (round trip)."""

from __future__ import annotations

from .parser import parse
from .printer import format_attribute, format_function, format_op

__all__ = ["format_attribute", "format_function", "format_op", "parse"]
