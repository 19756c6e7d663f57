"""What part of a training step each op of a program is: forward, backward or the
optimizer's update, and which microbatch it works on, for the Gantt's labels.

The phase is read from the dataflow, not from names: an op is *backward* when it
seeds a backward pass (its registry record's ``extra["backward_seed"]``: ``LossGrad``)
or reads a value that depends on one; an *update* when its record says
``extra["optimizer"]``; otherwise *forward*. A pmap's body is walked with its operands'
phases. The microbatch is the transforms' own name for it: a result named
``..._mb3`` (or ``..._mb3_s1``, ``..._mb3_dp``) is microbatch 3's, the convention
``ir.transforms.pipeline.live_microbatches`` reads too, and a gradient summed up to
microbatch 3 inside the body that makes it is ``..._acc3``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ir.function import Function
from ir.op import Op
from ir.registry import get_op
from ir.value import Value

FORWARD, BACKWARD, UPDATE = "F", "B", "U"
_MICROBATCH = re.compile(r"_(?:mb|acc)(\d+)(?:_|$)")


@dataclass(frozen=True)
class Role:
    """An op's phase (``"F"``, ``"B"`` or ``"U"``) and microbatch (None: not one's)."""

    phase: str
    microbatch: int | None = None

    @property
    def label(self) -> str:
        """``F3``, ``B3`` for a microbatch's forward and backward work; ``""`` else."""
        if self.microbatch is None or self.phase == UPDATE:
            return ""
        return f"{self.phase}{self.microbatch}"


def op_roles(function: Function) -> dict[Op, Role]:
    """Every op of ``function`` and of its pmap bodies, with its :class:`Role`.

    >>> from ir import models, transforms
    >>> t = transforms.training(models.mlp(8, 4, 8, 4), "sgd")
    >>> phases = [r.phase for r in op_roles(t).values()]
    >>> phases[0], "B" in phases, phases[-1]
    ('F', True, 'U')
    """
    roles: dict[Op, Role] = {}
    _walk(function, set(), roles, None)
    return roles


def _walk(f: Function, tainted: set[Value], roles: dict[Op, Role], outer: int | None) -> bool:
    """Give ``f``'s ops their roles; ``tainted`` holds the values that depend on a
    backward seed (updated in place). True when ``f`` has a backward op."""
    any_backward = False
    for op in f.ops:
        record = get_op(op.op_type)
        backward = bool(record.extra.get("backward_seed")) or any(v in tainted for v in op.inputs)
        microbatch = _microbatch(op, outer)
        for body in op.subfunctions:
            inner = {b for b, v in zip(body.inputs, op.inputs) if v in tainted}
            backward |= _walk(body, inner, roles, microbatch)
        phase = BACKWARD if backward else FORWARD
        if record.extra.get("optimizer"):
            phase = UPDATE
        if backward:
            tainted.update(op.outputs)
            any_backward = True
        roles[op] = Role(phase, microbatch)
    return any_backward


def _microbatch(op: Op, outer: int | None) -> int | None:
    for v in op.outputs:
        match = _MICROBATCH.search(v.name)
        if match:
            return int(match.group(1))
    return outer


__all__ = ["BACKWARD", "FORWARD", "UPDATE", "Role", "op_roles"]
