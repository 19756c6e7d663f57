"""Mesh-independent facts about a Function's ops, kept while the Function lives.

Propagation asks, per op, for its sharding rule and for a key of what its strategy
choice depends on besides layouts (op type, operand and result types, attributes).
Neither depends on the mesh or the annotations, and a session propagates one
program over and over (a new mesh or annotation per click), so both are computed
once per Function (held weakly: they go with it). A rule is re-read when the
registry's record of its op changed since (``rule_for``'s own check).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

from ..function import Function
from ..op import Op
from ..registry import OpDef, get_op
from ..verify import attributes_key, hashed_key
from .rules import Rule, rule_for


@dataclass
class _Facts:
    """One Function's facts: each op's (registry record, rule) and the ops' signatures."""

    rules: dict[Op, tuple[OpDef, Rule]] = field(default_factory=dict)
    signatures: dict[Op, int | None] | None = None


_FACTS: weakref.WeakKeyDictionary[Function, _Facts] = weakref.WeakKeyDictionary()


def _facts(function: Function) -> _Facts:
    found = _FACTS.get(function)
    if found is None:
        found = _FACTS[function] = _Facts()
    return found


def op_rules(function: Function, ops: list[Op]) -> dict[Op, Rule]:
    """``rule_for(op)`` for each of ``ops`` (of ``function``), in order: the same rules
    and the same error at the first op without one."""
    known = _facts(function).rules
    out: dict[Op, Rule] = {}
    for op in ops:
        found = known.get(op)
        if found is None or get_op(op.op_type) is not found[0]:
            found = known[op] = (get_op(op.op_type), rule_for(op))
        out[op] = found[1]
    return out


def op_signatures(function: Function) -> dict[Op, int | None]:
    """Per op of ``function``, a small int naming its type, its operand and result types
    and its attributes: equal ints for equal signatures; None for an op with a body or an
    attribute that cannot be hashed."""
    facts = _facts(function)
    if facts.signatures is None:
        ids: dict[tuple, int] = {}
        signatures: dict[Op, int | None] = {}
        for op in function.ops:
            key = None
            if not op.subfunctions:
                key = hashed_key(
                    (
                        op.op_type,
                        tuple([v.type for v in op.inputs]),
                        tuple([v.type for v in op.outputs]),
                        attributes_key(op.attributes),
                    )
                )
            signatures[op] = None if key is None else ids.setdefault(key, len(ids))
        facts.signatures = signatures
    return facts.signatures
