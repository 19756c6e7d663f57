"""What a tensor-parallel degree leaves whole that tensor parallelism splits.

Megatron's plan splits a weight only where the axis its split runs along divides by the
degree: attention by heads, the MLP by its hidden width, a vocabulary-parallel layer by
the vocabulary. Past that limit the plan keeps the weight whole and every tensor rank
repeats its work (a 16-head GPT at tp = 64 runs all of its attention on each of the 64
ranks). :func:`replicated_split` finds such weights by comparing the plan with the plan
of one rank, where every split fits (the structure of the program: what tensor
parallelism splits at all), and names the axis that limits the degree.
"""

from __future__ import annotations

import math

from ..function import Function
from ..value import Value
from ._rewrite import TransformError
from ._spmd import Plan
from .step_parts import weights


class TensorReplicationError(TransformError):
    """A tensor-parallel degree would leave whole, and repeat on every tensor rank, work
    that tensor parallelism splits at a degree dividing the axis of the split."""


def _split_weights(piece: Function, plan: Plan) -> list[Value]:
    return [v for v in piece.inputs if (s := plan.state.get(v)) is not None and s.kind == "S"]


def replicated_split(piece: Function, plan: Plan, structure: Plan, tp: int) -> str | None:
    """Why ``plan`` (tensor parallelism of ``piece`` over ``tp`` ranks) repeats work on
    every rank, or None: the weights ``structure`` (the same plan over one rank) splits
    and ``plan`` keeps whole, and the axis their splits run along (the greatest common
    divisor of its sizes is the limit: ``tp`` must divide it)."""
    split = set(_split_weights(piece, plan))
    whole = [w for w in _split_weights(piece, structure) if w not in split]
    if not whole:
        return None
    kept = set(whole)
    named = set(weights(piece))  # not their optimizer state, which follows them
    whole = [w for w in whole if w in named] or whole
    axes: list[tuple[int, Value, int]] = []  # (size, value, dim) of every split they make
    for v, s in structure.state.items():
        if s is None or s.kind != "S":
            continue
        if v in kept or structure.prov.get(v, frozenset()) & kept:
            axes.append((v.type.shape[s.dim], v, s.dim))
    limit = math.gcd(*(size for size, _, _ in axes))
    size, value, dim = min(axes, key=lambda a: (a[0], a[1].name))
    names = ", ".join(w.name for w in whole[:4]) + (
        f" and {len(whole) - 4} more" if len(whole) > 4 else ""
    )
    return (
        f"tensor level: tp={tp} leaves {len(whole)} weight(s) that tensor parallelism "
        f"splits whole on every tensor rank ({names}), so each of the {tp} ranks repeats "
        f"their work: their split runs along an axis of {size} (dim {dim} of "
        f"{value.name!r}, shape {value.type.shape}: a transformer's attention heads, say) "
        f"and the degree must divide {limit}. Use a tensor-parallel degree that divides "
        f"{limit}, or allow_replication=True to build the replicated step anyway"
    )


__all__ = ["TensorReplicationError", "replicated_split"]
