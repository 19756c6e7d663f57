"""The exceptions DistIR raises.

Every error says what was wrong and where: verify errors quote the printed op,
parse errors carry line, column and a caret under the fault.
"""

from __future__ import annotations


class DistIRError(Exception):
    """Base class of every error this package raises on bad input."""


class TypeRuleError(DistIRError):
    """An op's operands do not fit its shape/type rule (raised by the rule itself)."""


class VerifyError(DistIRError):
    """A Function breaks an invariant: order, single definition, arity, types, devices."""


class UnknownOpError(DistIRError):
    """An op type that is not in the registry."""


class RegistryError(DistIRError):
    """Registering an op twice, or an op record that is inconsistent."""


class ExecutionError(DistIRError):
    """The reference executor could not run an op (bad inputs, failing kernel)."""


class InvalidTypeError(DistIRError, ValueError):
    """A TensorType or TupleType made of bad parts: a shape that is not non-negative
    integers, an unknown dtype, a device that is not an id, a variable or None, or a
    type beyond the limits in ``ir.limits``. A ValueError too, as it always was."""


class ArgumentError(DistIRError, TypeError, ValueError):
    """A public entry point was given an argument of the wrong type or value; the message
    names the parameter. A TypeError and a ValueError too, so older handlers still work."""


class ParseError(DistIRError):
    """Malformed program text. Carries line, column and the offending source line."""

    def __init__(self, message: str, line: int, column: int, source_line: str) -> None:
        self.message = message
        self.line = line
        self.column = column
        self.source_line = source_line
        caret = " " * max(column - 1, 0) + "^"
        super().__init__(f"line {line}, column {column}: {message}\n    {source_line}\n    {caret}")
