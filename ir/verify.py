"""Checks of a Function's invariants: order, single definition, arity, types, devices.

``check_op`` is the per-op check the builder runs as each op is added;
``verify`` re-runs every check over a whole Function (pmap bodies included).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .attr_kinds import problem as kind_problem
from .attr_kinds import shown as shown_value
from .errors import (
    DistIRError,
    InvalidTypeError,
    RegistryError,
    TypeRuleError,
    UnknownOpError,
    VerifyError,
)
from .function import Function
from .op import Op
from .registry import OpDef, OpKind, TypeContext, get_op
from .types import TensorType, Type
from .value import Value


def describe_op(op: Op) -> str:
    """The op as one line of the text format, for error messages."""
    try:
        from .text import format_op

        return format_op(op)
    except Exception:  # the printer itself must never hide the real error
        return repr(op)


class HashedKey(tuple):
    """A tuple that hashes once: a memo's lookup and insertion would hash every type again."""

    hash: int

    def __hash__(self) -> int:
        return self.hash


def hashed_key(items: tuple) -> HashedKey | None:
    """``items`` as a :class:`HashedKey`, or None when an item is not hashable."""
    key = HashedKey(items)
    try:
        key.hash = tuple.__hash__(key)
    except TypeError:
        return None
    return key


def attributes_key(v: Any) -> Any:
    """A hashable stand-in for attributes (or one value) that tells 1, 1.0, True and lists
    from tuples apart; hashing it raises TypeError when a value is not hashable (an array)."""
    t = type(v)
    if t in _SCALARS:  # the common case first: this runs for every op propagation keys
        return (t, v)
    if isinstance(v, (list, tuple)):
        return (t, tuple([attributes_key(x) for x in v]))
    if isinstance(v, Mapping):
        return (dict, tuple([(k, attributes_key(x)) for k, x in v.items()]))
    return (t, v)


_SCALARS = frozenset({str, int, float, bool, type(None)})


def infer_types(
    opdef: OpDef,
    input_types: Sequence[Type],
    attributes: Mapping[str, Any],
    subfunctions: Sequence[Function] = (),
) -> tuple[tuple[Type, ...], dict[str, Any]]:
    """Run ``opdef``'s arity, attribute and type checks; return result types and full attributes.

    Raises :class:`VerifyError` with a sentence that names the op type. Builders that
    repeat an op on operands of the same types (a layer per microbatch, a collective
    per layer) type it once and copy it with :meth:`ir.FunctionBuilder.add_like`.
    """
    problem = opdef.check_arity(len(input_types))
    if problem:
        raise VerifyError(problem)
    try:
        attrs = opdef.complete_attributes(attributes)
    except RegistryError as e:
        raise VerifyError(str(e)) from None
    for a in opdef.attributes:
        if a.kind is not None and not a.kind.accepts(attrs[a.name]):
            wrong = kind_problem(a.kind, attrs[a.name])
            raise VerifyError(
                f"{opdef.name}: attribute {a.name}={shown_value(attrs[a.name])} {wrong}"
            )
    if opdef.kind is OpKind.COMPUTE:
        devices = {t.device for t in input_types if isinstance(t, TensorType)}
        if len(devices) > 1:
            shown = ", ".join(sorted(map(str, devices)))
            raise VerifyError(
                f"{opdef.name} reads operands on different devices ({shown}); "
                "move them to one device first (send, broadcast or a collective)"
            )
    try:
        results = tuple(
            opdef.type_rule(TypeContext(tuple(input_types), attrs, tuple(subfunctions)))
        )
    except (TypeRuleError, InvalidTypeError) as e:  # a result type beyond ir.limits, say
        raise VerifyError(f"{opdef.name}: {e}") from None
    if len(results) != len(opdef.results) and not opdef.extra.get("variadic_results"):
        raise VerifyError(
            f"{opdef.name}'s type rule gave {len(results)} results, its signature has "
            f"{len(opdef.results)} ({', '.join(opdef.results)})"
        )
    return results, attrs


def check_op(op: Op, defined: set[Value] | Mapping[Value, Any]) -> None:
    """Check one op against its record and the set of values defined before it."""
    try:
        opdef = get_op(op.op_type)
    except UnknownOpError as e:
        raise VerifyError(f"{e}\n  in: {describe_op(op)}") from None
    for i, v in enumerate(op.inputs):
        if v not in defined:
            raise VerifyError(
                f"operand {i} of {op.op_type} ({v.name!r}) is not defined before this op "
                f"(ops must be in topological order and bodies may not read outer values)"
                f"\n  in: {describe_op(op)}"
            )
    try:
        results, _ = infer_types(opdef, [v.type for v in op.inputs], op.attributes, op.subfunctions)
    except VerifyError as e:
        raise VerifyError(f"{e}\n  in: {describe_op(op)}") from None
    if len(results) != len(op.outputs):
        raise VerifyError(
            f"{op.op_type} defines {len(results)} result(s), the op lists {len(op.outputs)}"
            f"\n  in: {describe_op(op)}"
        )
    for out, want in zip(op.outputs, results):
        if out.type != want:
            raise VerifyError(
                f"{op.op_type} result {out.name!r} is declared {out.type} but the op's "
                f"type rule gives {want}\n  in: {describe_op(op)}"
            )


def verify(function: Function) -> Function:
    """Check every invariant of ``function`` (and its pmap bodies); return it unchanged."""
    defined: set[Value] = set()
    for v in function.inputs:
        if v in defined:
            raise VerifyError(f"function {function.name!r} lists input {v.name!r} twice")
        defined.add(v)
    for op in function.ops:
        check_op(op, defined)
        for sub in op.subfunctions:
            verify(sub)
        for out in op.outputs:
            if out in defined:
                raise VerifyError(
                    f"value {out.name!r} is defined more than once\n  in: {describe_op(op)}"
                )
            defined.add(out)
    check_outputs(function.name, function.outputs, defined)
    return function


def check_outputs(name: str, outputs: Iterable[Value], defined: set[Value]) -> None:
    for v in outputs:
        if v not in defined:
            raise VerifyError(f"function {name!r} returns {v.name!r}, which it never defines")


__all__ = [
    "DistIRError",
    "attributes_key",
    "check_op",
    "describe_op",
    "infer_types",
    "verify",
]
