"""The pipeline cut without annotations: weights in ``n`` consecutive groups balanced by
bytes, cut at layer boundaries (where one activation alone crosses the forward pass)
so that no layer is split between stages; with too few boundaries, by weight count.
"""

from __future__ import annotations

from ..function import Function
from ..op import Op
from ..ops.communication import split_sizes
from ..value import Value
from ._rewrite import TransformError, batch_inputs, is_optimizer
from .step_parts import weights


def constant_ops(f: Function, weights) -> set[Op]:
    """The ops of ``f`` that depend on no batch input and none of ``weights``."""
    derived = set(batch_inputs(f)) | set(weights)
    free: set[Op] = set()
    for op in f.ops:
        if any(v in derived for v in op.inputs):
            derived.update(op.outputs)
        else:
            free.add(op)
    return free


def balanced_weights(f: Function, n: int, backward: set[Op]) -> dict[Value, int]:
    """Weights cut into ``n`` consecutive groups of about equal count, at layer boundaries
    (see :func:`layer_boundaries`) where there are enough; else by count alone."""
    order = weights(f)
    if n > len(order):
        raise TransformError(
            f"{n} stages but {f.name} has only {len(order)} weight(s) to spread over "
            f"them (stages more than layers); use at most {len(order)} stages"
        )
    sizes = [w.type.size_bytes for w in order]
    cuts = _cuts_at_boundaries(layer_boundaries(f, backward, order), sizes, n)
    if cuts is None:
        counts = split_sizes(len(order), n)
        cuts = [sum(counts[:k]) for k in range(1, n)]
    weight_stage: dict[Value, int] = {}
    bounds = [0, *cuts, len(order)]
    for s in range(n):
        for w in order[bounds[s] : bounds[s + 1]]:
            weight_stage[w] = s
    return weight_stage


def layer_boundaries(f: Function, backward: set[Op], order: list[Value]) -> list[int]:
    """Where a pipeline may cut the forward pass: the counts ``k`` of weights (in order of
    first use) before a point of the forward pass that one activation alone crosses (a
    transformer's residual stream between blocks and sublayers, an MLP between layers),
    so that a cut there sends one value and splits no layer (as Megatron-LM cuts).
    Values that depend on no batch input and no weight (an imported Llama's rotary
    tables, read by every layer) do not count: they would leave no boundary but in the
    last layer."""
    free = constant_ops(f, order)
    forward = [op for op in f.ops if op not in backward and not is_optimizer(op)]
    where = {op: i for i, op in enumerate(forward)}
    last_use: dict[Value, int] = {}
    for i, op in enumerate(forward):
        for v in op.inputs:
            last_use[v] = i
    crossing = [0] * (len(forward) + 1)  # values live across the point after op i
    for i, op in enumerate(forward):
        if op in free:
            continue
        for v in op.outputs:
            end = last_use.get(v, i)
            if end > i:
                crossing[i] += 1
                crossing[end] -= 1
    first_read = {}
    for w in order:
        first_read[w] = min((where[u] for u in f.consumers[w] if u in where), default=len(where))
    weights_before = 0
    by_position = sorted(first_read.values())
    out, live = [], 0
    for i in range(len(forward) - 1):
        live += crossing[i]
        while weights_before < len(by_position) and by_position[weights_before] <= i:
            weights_before += 1
        if live == 1 and 0 < weights_before < len(order) and weights_before not in out:
            out.append(weights_before)
    return out


def _cuts_at_boundaries(boundaries: list[int], sizes: list[int], n: int) -> list[int] | None:
    """``n - 1`` boundaries (weight counts) whose groups' weight bytes are closest to equal,
    or None if there are too few: each cut is the boundary nearest to its share."""
    if len(boundaries) < n - 1:
        return None
    before = [0]
    for size in sizes:
        before.append(before[-1] + size)
    cuts: list[int] = []
    for k in range(1, n):
        left = len(boundaries) - (n - 1 - k)  # leave a boundary for every later cut
        choices = [b for b in boundaries[:left] if not cuts or b > cuts[-1]]
        if not choices:
            return None
        target = k * before[-1] / n
        cuts.append(min(choices, key=lambda b: (abs(before[b] - target), b)))
    return cuts


__all__ = ["balanced_weights", "constant_ops", "layer_boundaries"]
