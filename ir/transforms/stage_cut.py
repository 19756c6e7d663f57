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
from ..value import Value
from ._rewrite import TransformError, is_optimizer
from .layer_cut import balanced_weights, constant_ops, layer_boundaries
from .stage_annotations import annotated_forward, annotated_stages, unmarked, weight_stages
from .step_parts import backward_ops, gradient_ops, weights


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


def assign_stages(f: Function, n: int, marks: Mapping[Op, int]) -> dict[Op, int]:
    """The stage of every op of ``f``: ``marks`` (annotated ops) or, if empty, the cost cut."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise TransformError(f"stages must be a positive integer, got {n!r}")
    backward = backward_ops(f)
    gradients = gradient_ops(f)
    if marks:
        forward = annotated_forward(f, n, marks, backward)
        weight_stage = weight_stages(f, forward)
    else:
        forward = None
        weight_stage = balanced_weights(f, n, backward)
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
    free = constant_ops(f, weight_stage)
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


__all__ = [
    "annotated_stages",
    "assign_stages",
    "backward_ops",
    "gradient_ops",
    "layer_boundaries",
    "stage_assignment",
    "unmarked",
    "weights",
]
