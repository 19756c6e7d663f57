"""The pipeline cut without annotations: weights in ``n`` consecutive groups balanced by
bytes, cut where the model's structure allows, in this order of preference:

1. **layer boundaries**: between the repeated layers of a model that has them (a
   transformer's blocks, an MLP's layers), so that no layer is split between stages,
   as Megatron-LM cuts; the parts before the first and after the last repeated layer
   (embeddings, final norm and head) are layers of their own;
2. **cut points**: every point of the forward pass that one activation alone crosses
   (between layers and between a transformer block's attention and MLP sublayers);
3. only for a model without repeated layers, **between weights read by different ops**
   (a cut there may send several values; the pipeline honours it).

More stages than the model allows raise a :class:`TransformError` naming the degree and
the limit: no stage is ever left without work. :func:`cut_points` reports what a
program offers, :func:`balanced_weights` chooses.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from ..function import Function
from ..op import Op
from ..types import TensorType
from ..value import Value
from ._rewrite import TransformError, batch_inputs, is_optimizer
from .step_parts import weights

# How the cost cut fell (CutPoints tiers), as ``PipelineCut.at`` reports it.
AT_LAYERS = "layer boundaries"
AT_POINTS = "sublayer boundaries"
AT_WEIGHTS = "between weights"


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


@dataclass(frozen=True)
class CutPoints:
    """Where a pipeline may cut a program's forward pass, as counts ``k`` of weights (in
    order of first use) before the cut.

    ``points``: where one activation alone crosses the forward pass (a transformer's
    residual stream between blocks and between sublayers, an MLP between layers), so a
    cut there sends one value. ``layers``: the points that start a repeated layer or
    end the last one (empty if the model repeats no layer). ``repeats``: how many
    repeated layers were found (0: none). ``groups``: every count where the next
    weight is first read by another op than the previous one.
    """

    points: tuple[int, ...]
    layers: tuple[int, ...]
    repeats: int
    groups: tuple[int, ...]


def cut_points(f: Function, backward: set[Op], order: list[Value]) -> CutPoints:
    """The cut points of ``f`` (see :class:`CutPoints`). Values that depend on no batch
    input (an imported Llama's rotary tables, read by every layer; a weight's transpose)
    do not count as crossing: they would leave no point but in the last layer; nor do
    scalars (a MoE layer's load-balancing loss, carried to the model's loss).

    Repeated layers: the forward pass between consecutive points is a *segment*, known
    by its op types; the longest run of segments that repeats with some period ``P``
    (a GPT block is two segments, attention and MLP; an MLP layer one) makes the
    layers, and its every ``P``-th point (from the run's start to its end) a layer
    boundary.
    """
    free = constant_ops(f, order)
    # nor do values made from weights and constants alone (a forward program's rotary
    # tables, from its inv_freq buffer): made once a step, not per microbatch
    unbatched = constant_ops(f, ())
    forward = [op for op in f.ops if op not in backward and not is_optimizer(op)]
    where = {op: i for i, op in enumerate(forward)}
    last_use: dict[Value, int] = {}
    for i, op in enumerate(forward):
        for v in op.inputs:
            last_use[v] = i
    crossing = [0] * (len(forward) + 1)  # values live across the point after op i
    for i, op in enumerate(forward):
        if op in unbatched:
            continue
        for v in op.outputs:
            end = last_use.get(v, i)
            if end > i and not _carried_scalar(v):
                crossing[i] += 1
                crossing[end] -= 1
    first_read = {
        w: min((where[u] for u in f.consumers[w] if u in where), default=len(where)) for w in order
    }
    by_position = sorted(first_read.values())
    groups = tuple(k for k in range(1, len(order)) if by_position[k] != by_position[k - 1])
    weights_before = 0
    points: list[int] = []
    at: list[int] = []  # the op position after which each point falls
    live = 0
    for i in range(len(forward) - 1):
        live += crossing[i]
        while weights_before < len(by_position) and by_position[weights_before] <= i:
            weights_before += 1
        fresh = not points or points[-1] != weights_before
        if live == 1 and 0 < weights_before < len(order) and fresh:
            points.append(weights_before)
            at.append(i)
    bounds = [-1, *at, len(forward) - 1]
    kinds: dict[tuple[str, ...], int] = {}  # each segment's op types, as a small int
    segments = [
        kinds.setdefault(
            tuple(op.op_type for op in forward[a + 1 : b + 1] if op not in free), len(kinds)
        )
        for a, b in itertools.pairwise(bounds)
    ]
    layers, repeats = _repeated(segments)
    # segment j starts at point j - 1
    return CutPoints(
        tuple(points), tuple(points[j - 1] for j in layers if 0 < j <= len(points)), repeats, groups
    )


def _carried_scalar(v: Value) -> bool:
    """A scalar carried along to the end (a mixture-of-experts layer's load-balancing
    loss, summed into the model's loss): it does not count as crossing, or no point would
    follow the first MoE layer."""
    return isinstance(v.type, TensorType) and v.type.rank == 0


def _repeated(segments: list[int]) -> tuple[list[int], int]:
    """The segments that start each layer of the longest run repeating with a period
    (and the one after the run), and the number of layers; ``([], 0)`` if none repeats."""
    best: tuple[int, int, int] | None = None  # (covered segments, -period, -start)
    n = len(segments)
    for period in range(1, n // 2 + 1):
        j = 0
        while j + period < n:
            if segments[j] != segments[j + period]:
                j += 1
                continue
            end = j
            while end + period < n and segments[end] == segments[end + period]:
                end += 1
            covered = (end - j + period) // period * period  # whole layers only
            if covered >= 2 * period:
                key = (covered, -period, -j)
                if best is None or key > best:
                    best = key
            j = end + 1
    if best is None:
        return [], 0
    covered, period, start = best[0], -best[1], -best[2]
    count = covered // period
    return [start + i * period for i in range(count + 1)], count


def weight_cuts(f: Function, backward: set[Op]) -> tuple[list[Value], CutPoints]:
    """The weights of ``f`` in order of first use and where a cut may fall among them
    (:func:`cut_points`): what :func:`balanced_weights` reads, whatever the number of
    stages."""
    order = weights(f)
    return order, cut_points(f, backward, order)


def balanced_weights(
    f: Function,
    n: int,
    backward: set[Op],
    what: str | None = None,
    cuts: tuple[list[Value], CutPoints] | None = None,
) -> tuple[dict[Value, int], str]:
    """Weights cut into ``n`` consecutive groups of about equal bytes (see the module
    docstring), and where the cut fell (``AT_LAYERS``, ``AT_POINTS``, ``AT_WEIGHTS``).

    ``what`` names the degree in errors (``"pp=4"``; default ``"n stages"``); ``cuts``:
    :func:`weight_cuts` of ``f``, if made already (for another number of stages).
    """
    what = what or f"{n} stages"
    order, cut = cuts if cuts is not None else weight_cuts(f, backward)
    sizes = [w.type.size_bytes for w in order]
    if n > len(order):
        raise TransformError(_too_many(f, n, what, cut, len(order)))
    if n == 1:
        chosen, at = [], AT_LAYERS
    elif len(cut.layers) >= n - 1:
        chosen, at = _cuts_at_boundaries(list(cut.layers), sizes, n), AT_LAYERS
    elif len(cut.points) >= n - 1:
        chosen, at = _cuts_at_boundaries(list(cut.points), sizes, n), AT_POINTS
    elif not cut.repeats and len(cut.groups) >= n - 1:
        chosen, at = _cuts_at_boundaries(list(cut.groups), sizes, n), AT_WEIGHTS
    else:
        raise TransformError(_too_many(f, n, what, cut, len(order)))
    weight_stage: dict[Value, int] = {}
    bounds = [0, *chosen, len(order)]
    for s in range(n):
        for w in order[bounds[s] : bounds[s + 1]]:
            weight_stage[w] = s
    return weight_stage, at


def _too_many(f: Function, n: int, what: str, cut: CutPoints, count: int) -> str:
    """Why ``n`` stages would leave a stage without work, with the most there can be."""
    if cut.repeats:
        return (
            f"pipeline level: {what} but {f.name} has {cut.repeats} repeated layers: "
            f"{len(cut.layers)} layer boundaries and {len(cut.points)} points between "
            f"layers and sublayers where one activation crosses, so at most "
            f"{len(cut.points) + 1} stages ({len(cut.layers) + 1} at layer boundaries); "
            f"{n} would leave stages without work (stages more than layers). Use at most "
            f"{len(cut.points) + 1} stages, or cut inside layers with stage_of= or "
            "PipelineStage annotations"
        )
    return (
        f"pipeline level: {what} but {f.name} has {count} weight(s), read by "
        f"{len(cut.groups) + 1} different op(s), to spread over them, so at most "
        f"{len(cut.groups) + 1} stages; {n} would leave stages without work (stages more "
        f"than layers). Use at most {len(cut.groups) + 1} stages"
    )


def _cuts_at_boundaries(boundaries: list[int], sizes: list[int], n: int) -> list[int]:
    """``n - 1`` of ``boundaries`` (weight counts, at least ``n - 1`` of them) whose groups'
    weight bytes are closest to equal: each cut is the boundary nearest to its share."""
    before = [0]
    for size in sizes:
        before.append(before[-1] + size)
    cuts: list[int] = []
    for k in range(1, n):
        left = len(boundaries) - (n - 1 - k)  # leave a boundary for every later cut
        choices = [b for b in boundaries[:left] if not cuts or b > cuts[-1]]
        target = k * before[-1] / n
        cuts.append(min(choices, key=lambda b: (abs(before[b] - target), b)))
    return cuts


__all__ = [
    "AT_LAYERS",
    "AT_POINTS",
    "AT_WEIGHTS",
    "CutPoints",
    "balanced_weights",
    "constant_ops",
    "cut_points",
    "weight_cuts",
]
