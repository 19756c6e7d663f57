"""Which pipeline stage runs each op: cut by cost, or as the program's annotations say.

Without annotations the weights are cut into ``n`` consecutive groups (in order
of first use) and each forward op runs on the stage of the weights it reads,
never before the stage of its operands.

With annotations (seed 001's per-node ``pipeline_stage``: ``PipelineStage``
markers from ``ir.sharding.annotate_stages``, kept by ``training``, or a
``stage_of={value_name: stage}`` mapping) each forward op runs in its annotated
stage, and an unmarked forward op in the latest stage of its operands (the
seed's "A -> ... -> E in stage 1, F -> ... -> K in stage 2": mark the first op
of each stage). The annotations must describe a pipeline of ``n`` stages:
ids ``0 .. n-1``, each with an op, never decreasing along the data flow, and
each weight read in one stage only.

Either way the rest follows the forward pass: a weight lives on the stage of
the forward op that reads it and its optimizer step runs there; a backward op
runs with the forward op it differentiates: the op making a weight's gradient
on that weight's stage, else on the stage of the weight it reads, else on the
latest stage among the forward values it reads, never later than the stage its
incoming gradient comes from; a recomputed activation on its forward op's stage.

Without annotations the cut falls at layer boundaries (:func:`layer_boundaries`:
where one activation alone crosses the forward pass) balanced by weight bytes,
so no layer is split between stages; with too few boundaries, by weight count.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..arguments import function_arg
from ..function import Function
from ..op import Op
from ..ops.communication import split_sizes
from ..sharding.errors import AnnotationError
from ..sharding.stages import is_stage_marker, stage_marks, strip_stages
from ..value import Value
from ..verify import describe_op
from ._rewrite import (
    TransformError,
    batch_inputs,
    is_optimizer,
    parameter_inputs,
    starts_backward,
)

_SEE = "(the pipeline degree, times chunks with the interleaved schedule)"


def weights(f: Function) -> list[Value]:
    """The weights of ``f`` (what its optimizer steps update, else its parameters) in order
    of first use."""
    optimizers = [op for op in f.ops if is_optimizer(op)]
    chosen = {op.inputs[0] for op in optimizers} if optimizers else set(parameter_inputs(f))
    order: list[Value] = []
    for op in f.ops:
        for v in op.inputs:
            if v in chosen and v not in order:
                order.append(v)
    return order


def gradient_ops(f: Function) -> set[Op]:
    """The ops that depend on a ``LossGrad`` result (the backward pass without replays)."""
    tainted: set[Value] = set()
    found: set[Op] = set()
    for op in f.ops:
        if starts_backward(op) or any(v in tainted for v in op.inputs):
            found.add(op)
            tainted.update(op.outputs)
    return found


def backward_ops(f: Function) -> set[Op]:
    """The backward pass: ops that depend on a ``LossGrad`` result, and ops after the first
    ``LossGrad`` that only feed the backward pass (recomputed activations)."""
    found = gradient_ops(f)
    first = next((i for i, op in enumerate(f.ops) if starts_backward(op)), len(f.ops))
    outputs = set(f.outputs)
    for op in reversed(f.ops[first:]):
        users = [u for v in op.outputs for u in f.consumers.get(v, [])]
        if users and all(u in found for u in users) and not outputs & set(op.outputs):
            found.add(op)
    return found


def stage_assignment(
    f: Function, n: int, stage_of: Mapping[str, int] | None = None
) -> dict[Op, int]:
    """The stage (``0 .. n-1``) of every op of ``f``; see the module docstring.

    The annotations are ``f``'s ``PipelineStage`` markers (a marker gets the stage of
    the op it marks) or ``stage_of``, not both; with neither, the cut balances weights.

    >>> import ir
    >>> from ir.sharding import annotate_stages
    >>> t = ir.transforms.training(annotate_stages(ir.models.mlp(8, 4, 6, 4, layers=4), {"a1": 1}))
    >>> stage = stage_assignment(t, 2)
    >>> [(op.outputs[0].name, stage[op]) for op in t.ops if op.op_type == "MatMul"]
    [('a0', 0), ('a1', 1), ('a2', 1), ('y', 1)]
    >>> [(op.outputs[0].name, stage[op]) for op in t.ops if op.op_type == "SGDOptimizer"]
    [('wD1', 1), ('wC1', 1), ('wB1', 1), ('wA1', 0)]
    """
    function_arg("stage_assignment", "f", f)
    return assign_stages(f, n, annotated_stages(f, stage_of))


def annotated_stages(f: Function, stage_of: Mapping[str, int] | None = None) -> dict[Op, int]:
    """The ops of ``f`` that its ``PipelineStage`` markers or ``stage_of`` (value name ->
    stage) put in a stage (empty: no annotations)."""
    try:
        marked = stage_marks(f)
    except AnnotationError as e:
        raise TransformError(f"pipeline level: {e}") from None
    if stage_of is None:
        return marked
    if not isinstance(stage_of, Mapping):
        raise TransformError(
            f"pipeline level: stage_of must map value names to stages, got {stage_of!r}"
        )
    if marked:
        raise TransformError(
            f"pipeline level: {f.name} carries PipelineStage annotations and stage_of= was "
            "given too; give the stages one way (strip the markers or drop stage_of)"
        )
    after = backward_ops(f)
    makers: dict[str, list[Op]] = {}
    for op in f.ops:
        if not is_stage_marker(op) and op not in after and not is_optimizer(op):
            for v in op.outputs:
                makers.setdefault(v.name, []).append(op)
    for name, s in stage_of.items():
        if isinstance(s, bool) or not isinstance(s, int) or s < 0:
            raise TransformError(
                f"pipeline level: the stage of {name!r} must be a non-negative integer, got {s!r}"
            )
        if name not in makers:
            raise TransformError(
                f"pipeline level: no forward op of {f.name} makes a value named {name!r} to put "
                f"in stage {s} (the backward pass and optimizer steps follow their forward ops)"
            )
        for op in makers[name]:
            if marked.get(op, s) != s:
                raise TransformError(
                    f"pipeline level: the op making {name!r} is put in stages {marked[op]} and "
                    f"{s}; one stage per op\n  in: {describe_op(op)}"
                )
            marked[op] = s
    return marked


def unmarked(f: Function, stage_of: Mapping[str, int] | None = None) -> tuple[Function, dict]:
    """``f`` without ``PipelineStage`` markers, and its annotated ops (by the new ops)."""
    marks = annotated_stages(f, stage_of)
    if stage_of is not None:  # then f has no markers (annotated_stages checks)
        return f, marks
    return strip_stages(f)


def assign_stages(f: Function, n: int, marks: Mapping[Op, int]) -> dict[Op, int]:
    """The stage of every op of ``f``: ``marks`` (annotated ops) or, if empty, the cost cut."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise TransformError(f"stages must be a positive integer, got {n!r}")
    backward = backward_ops(f)
    gradients = gradient_ops(f)
    if marks:
        forward = _annotated_forward(f, n, marks, backward)
        weight_stage = _weight_stages(f, forward)
    else:
        forward = None
        weight_stage = _balanced_weights(f, n, backward)
    producer = f.producers
    # the weight whose gradient each op makes (an EmbeddingGrad reads only the weight's
    # shape, not the weight): it runs on that weight's stage
    grad_of: dict[Op, Value] = {}
    for op in f.ops:
        if is_optimizer(op) and op.inputs[1] in producer:
            grad_of[producer[op.inputs[1]]] = op.inputs[0]
    grad_of.update(_weight_gradient_chains(f, grad_of, weight_stage, gradients))
    stage: dict[Op, int] = {}
    # Ops that depend on no batch input and no weight (constants: a mask, a scale, zeros; an
    # imported Llama's rotary tables, computed from buffers) run where they are read, on
    # the earliest stage that reads them; they pull neither their forward readers nor the
    # backward ops that read them to an earlier stage.
    free = _constant_ops(f, weight_stage)
    made_by = {v: op for v, op in producer.items() if op not in free}
    # A weight lives where the forward op that reads it runs (an op reading weights of two
    # groups runs on the later one); its gradient and optimizer step follow it there.
    home: dict[Value, int] = {}
    for op in f.ops:
        if op in free:
            continue
        wstages = [home.get(v, weight_stage[v]) for v in op.inputs if v in weight_stage]
        made = [stage[made_by[v]] for v in op.inputs if v in made_by]
        if is_optimizer(op):
            w = op.inputs[0]
            stage[op] = home.get(w, weight_stage.get(w, max(made, default=0)))
        elif op not in backward:
            stage[op] = forward[op] if forward is not None else max(wstages + made, default=0)
            for v in op.inputs:
                if v in weight_stage:
                    home.setdefault(v, stage[op])
        elif op not in gradients:  # a recomputed activation: where its forward op ran
            stage[op] = max(wstages + made, default=0)
        else:
            # the stage of the forward op it differentiates: of the weight it reads, else
            # the latest of the activations it reads (the forward op's inputs or outputs)
            grads = [stage[producer[v]] for v in op.inputs if producer.get(v) in gradients]
            values = [
                stage[made_by[v]] for v in op.inputs if v in made_by and made_by[v] not in gradients
            ]
            w = grad_of.get(op)
            if w is not None and w in weight_stage:
                stage[op] = home.get(w, weight_stage[w])
                continue
            s = max(wstages) if wstages else max(values, default=min(grads, default=0))
            stage[op] = min([s, *grads])
    consumers = f.consumers
    for op in reversed(f.ops):
        if op in free:
            readers = [stage[u] for v in op.outputs for u in consumers.get(v, [])]
            stage[op] = min(readers, default=0)
    return {op: stage[op] for op in f.ops}


def _constant_ops(f: Function, weights) -> set[Op]:
    """The ops of ``f`` that depend on no batch input and none of ``weights``."""
    derived = set(batch_inputs(f)) | set(weights)
    free: set[Op] = set()
    for op in f.ops:
        if any(v in derived for v in op.inputs):
            derived.update(op.outputs)
        else:
            free.add(op)
    return free


def _weight_gradient_chains(
    f: Function, grad_of: Mapping[Op, Value], weight_stage: Mapping[Value, int], gradients: set[Op]
) -> dict[Op, Value]:
    """The gradient ops that make a weight's gradient from the operand it was multiplied
    with: a broadcast scale's ``dy * x`` (an RMSNorm's) and its sum over the broadcast axes.
    They run on the weight's stage, not on the stage of ``x``: a pipeline cut between an
    RMSNorm and its scale would otherwise send the gradient back and forth."""
    consumers, producer = f.consumers, f.producers
    feeds: dict[Op, Value] = {}  # ops whose results feed one weight's gradient only
    for op in reversed(f.ops):
        if op in grad_of or op not in gradients:
            continue
        users = {grad_of.get(u, feeds.get(u)) for v in op.outputs for u in consumers.get(v, [])}
        if len(users) == 1 and None not in users:
            feeds[op] = users.pop()
    beside: dict[Value, set[Value]] = {}  # forward value -> weights read with it
    for op in f.ops:
        if op not in gradients and not is_optimizer(op):
            ws = {v for v in op.inputs if v in weight_stage}
            for v in op.inputs:
                beside.setdefault(v, set()).update(ws)
    chains: dict[Op, Value] = {}
    for op in f.ops:
        w = feeds.get(op)
        if w is None or any(v in weight_stage for v in op.inputs):
            continue
        forward = [v for v in op.inputs if producer.get(v) not in gradients]
        if any(w in beside.get(v, ()) for v in forward) or any(
            producer.get(v) in chains for v in op.inputs
        ):
            chains[op] = w
    return chains


def _balanced_weights(f: Function, n: int, backward: set[Op]) -> dict[Value, int]:
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
    free = _constant_ops(f, order)
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


def _annotated_forward(
    f: Function, n: int, marks: Mapping[Op, int], backward: set[Op]
) -> dict[Op, int]:
    """The stage of every forward op (markers included), checked to make ``n`` stages."""
    producer = f.producers
    for op in marks:
        if op in backward or is_optimizer(op):
            raise TransformError(
                f"pipeline level: {op.outputs[0].name!r} is annotated, but its op is part of "
                "the backward pass or an optimizer step, which follow their forward ops; "
                f"annotate forward ops only\n  in: {describe_op(op)}"
            )
    forward: dict[Op, int] = {}
    for op in f.ops:
        if op in backward or is_optimizer(op):
            continue
        made = {v: forward[producer[v]] for v in op.inputs if producer.get(v) in forward}
        if is_stage_marker(op):
            forward[op] = made.get(op.inputs[0], 0)
            continue
        inherited = max(made.values(), default=0)
        s = marks.get(op, inherited)
        if s < inherited:
            late = next(v for v, k in made.items() if k == inherited)
            raise TransformError(
                f"pipeline level: {op.outputs[0].name!r} is annotated stage {s} but reads "
                f"{late.name!r} from stage {inherited}; stages must not decrease along the "
                "data flow (a later stage feeding an earlier one is a cycle between stages): "
                f"put it in stage {inherited} or later\n  in: {describe_op(op)}"
            )
        forward[op] = s
    used = sorted({s for op, s in forward.items() if not is_stage_marker(op)})
    beyond = [s for s in used if s >= n]
    if beyond:
        raise TransformError(
            f"pipeline level: the annotations use stages {used} but the pipeline has {n} "
            f"{_SEE}, numbered 0 to {n - 1}; stage(s) {beyond} are out of range"
        )
    empty = [s for s in range(n) if s not in used]
    gaps = [s for s in empty if s < used[-1]]
    if gaps:
        raise TransformError(
            f"pipeline level: stage(s) {gaps} have no op (a gap in the annotated stages "
            f"{used}); number the stages 0, 1, 2, ... without gaps"
        )
    if empty:
        raise TransformError(
            f"pipeline level: the annotations make {len(used)} stage(s) but the pipeline has "
            f"{n} {_SEE}; annotate {n} stages or ask for {len(used)}"
        )
    return forward


def _weight_stages(f: Function, forward: Mapping[Op, int]) -> dict[Value, int]:
    """The one stage whose forward ops read each weight."""
    readers: dict[Value, set[int]] = {}
    chosen = set(weights(f))
    for op, s in forward.items():
        for v in op.inputs:
            if v in chosen:
                readers.setdefault(v, set()).add(s)
    for w, stages in readers.items():
        if len(stages) > 1:
            raise TransformError(
                f"pipeline level: weight {w.name!r} is read by stages {sorted(stages)}; a "
                "weight lives on one stage, so annotate the ops that read it into one stage "
                "(tied weights across stages are not supported)"
            )
    return {w: min(stages) for w, stages in readers.items()}


__all__ = [
    "annotated_stages",
    "assign_stages",
    "backward_ops",
    "stage_assignment",
    "unmarked",
    "weights",
]
