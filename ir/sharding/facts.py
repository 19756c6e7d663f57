"""Mesh-independent facts about one Function's ops, held by an explicit object.

Propagation asks, per op, for its sharding rule and for a key of what its strategy
choice depends on besides layouts (op type, operand and result types, attributes).
Neither depends on the mesh or the annotations. Whoever propagates one program over
and over (the workbench session: a new mesh or annotation per click) keeps one
:class:`ProgramFacts` for it and passes it to every call; ``propagate`` without one
makes a fresh one for that call. Nothing is kept at module level.
"""

from __future__ import annotations

from ..arguments import function_arg
from ..errors import ArgumentError
from ..function import Function
from ..op import Op
from ..registry import OpDef, get_op
from ..verify import attributes_key, hashed_key
from .rules import Rule, rule_for


class ProgramFacts:
    """Each op's sharding rule and signature for one ``function``, computed on first use.

    Keep one per program that is propagated repeatedly and pass it as
    ``propagate(..., facts=...)``: the second propagation reads no rule again. A rule is
    re-read when the registry's record of its op changed since it was read.

    >>> import ir
    >>> from ir.sharding import Mesh, S, propagate
    >>> f = ir.models.mlp(8, 4, 6, 4)
    >>> facts = ProgramFacts(f)
    >>> facts
    ProgramFacts('mlp': 0 rules read, signatures not computed)
    >>> for n in (2, 4):  # the second mesh reads no rule again
    ...     g, _ = propagate(f, {"x": (Mesh((n,)), [S(0)])}, facts=facts)
    >>> facts
    ProgramFacts('mlp': 4 rules read, signatures computed)
    """

    def __init__(self, function: Function) -> None:
        self.function: Function = function_arg("ProgramFacts", "function", function)
        self._rules: dict[Op, tuple[OpDef, Rule]] = {}
        self._signatures: dict[Op, int | None] | None = None

    def __repr__(self) -> str:
        return (
            f"ProgramFacts({self.function.name!r}: {len(self._rules)} rules read, "
            f"signatures {'computed' if self._signatures is not None else 'not computed'})"
        )

    @staticmethod
    def of(where: str, function: Function, facts: ProgramFacts | None) -> ProgramFacts:
        """``facts`` if they were made for ``function`` (a fresh ProgramFacts when None);
        an ArgumentError naming ``where`` and both programs if not."""
        if facts is None:
            return ProgramFacts(function)
        if not isinstance(facts, ProgramFacts):
            raise ArgumentError(
                f"{where}: facts must be an ir.sharding.ProgramFacts or None, got "
                f"{type(facts).__name__}"
            )
        if function is not facts.function:
            raise ArgumentError(
                f"{where}: facts were made for the program {facts.function.name!r}, not for "
                f"{function.name!r} (another Function object): pass ProgramFacts(function) "
                "of the program propagated"
            )
        return facts

    def rule(self, op: Op) -> Rule:
        """``rule_for(op)`` (an op of the function), read once per registry record."""
        found = self._rules.get(op)
        if found is None or get_op(op.op_type) is not found[0]:
            found = self._rules[op] = (get_op(op.op_type), rule_for(op))
        return found[1]

    def rules(self, ops: list[Op]) -> dict[Op, Rule]:
        """:meth:`rule` for each of ``ops`` (of the function), in order: the same rules and
        the same error at the first op without one."""
        return {op: self.rule(op) for op in ops}

    def signatures(self) -> dict[Op, int | None]:
        """Per op of the function, a small int naming its type, its operand and result
        types and its attributes: equal ints for equal signatures; None for an op with a
        body or an attribute that cannot be hashed."""
        if self._signatures is None:
            ids: dict[tuple, int] = {}
            signatures: dict[Op, int | None] = {}
            for op in self.function.ops:
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
            self._signatures = signatures
        return self._signatures
