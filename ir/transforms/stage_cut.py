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

Without annotations the cut falls at layer boundaries balanced by weight bytes, so no
layer is split between stages; with too few, between sublayers, and for a model without
repeated layers between weights (``ir/transforms/layer_cut.py``); more stages than that
allows is an error naming the limit. :func:`pipeline_cut` reports where the cut falls.

With activation recomputation, a replay runs on its forward op's stage and each stage
replays from the values it holds (``ir/transforms/stage_replays.py``: :func:`staged`),
so a cut inside a recomputed layer has a schedule.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..arguments import function_arg
from ..function import Function
from ..op import Op
from ..sharding.stages import is_stage_marker
from ..value import Value
from ._rewrite import TransformError, batch_inputs, is_optimizer
from .layer_cut import (
    AT_LAYERS,
    AT_POINTS,
    AT_WEIGHTS,
    balanced_weights,
    constant_ops,
    weight_cuts,
)
from .stage_annotations import annotated_forward, annotated_stages, unmarked, weight_stages
from .stage_constants import local_constants
from .stage_replays import local_replays, replay_twins
from .step_parts import backward_ops, gradient_ops, weights

AT_ANNOTATIONS = "annotations"


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


def assign_stages(
    f: Function, n: int, marks: Mapping[Op, int], what: str | None = None
) -> dict[Op, int]:
    """The stage of every op of ``f``: ``marks`` (annotated ops) or, if empty, the cost cut.
    ``what`` names the degree in errors (``"pp=4"``)."""
    return _assign(f, n, marks, what)[0]


class StageCuts:
    """The cuts of one program into any number of stages (:func:`stage_assignment`'s, for
    each ``n``), reading the analyses that do not depend on ``n`` once: the backward pass,
    the replays' twins, where a cut may fall, the ops that make constants, the gradient
    ops that follow a weight. A search's estimator asks the cut of every pipeline shape of
    its space."""

    def __init__(self, f: Function, marks: Mapping[Op, int]) -> None:
        """``marks``: the annotated ops' stages (``annotated_stages``; empty: cut by cost)."""
        self.f, self.marks = f, marks
        self.backward = backward_ops(f)
        self.gradients = gradient_ops(f)
        self.twins = replay_twins(f, self.backward, self.gradients)
        self.optimizers = {op for op in f.ops if is_optimizer(op)}
        self._cuts: tuple | None = None
        self._of_weights: dict[frozenset[Value], tuple] = {}

    def assignment(self, n: int, what: str | None = None) -> dict[Op, int]:
        """:func:`assign_stages` of ``f`` over ``n`` stages (``what`` names the degree in
        errors)."""
        return _assign(self.f, n, self.marks, what, self)[0]

    def weight_cuts(self) -> tuple:
        if self._cuts is None:
            self._cuts = weight_cuts(self.f, self.backward)
        return self._cuts

    def of_weights(
        self, weight_stage: Mapping[Value, int]
    ) -> tuple[set[Op], dict[Op, Value], dict[Value, Op]]:
        """For a cut placing ``weight_stage``'s weights (what depends on which weights it
        places, not on where): the ops that make constants, the weight whose gradient each
        op makes, and the op making each value that is no constant."""
        key = frozenset(weight_stage)
        found = self._of_weights.get(key)
        if found is None:
            f, producer = self.f, self.f.producers
            # the weight whose gradient each op makes (an EmbeddingGrad reads only the
            # weight's shape, not the weight): it runs on that weight's stage
            grad_of: dict[Op, Value] = {}
            for op in f.ops:
                if op in self.optimizers and op.inputs[1] in producer:
                    grad_of[producer[op.inputs[1]]] = op.inputs[0]
            grad_of.update(_weight_gradient_chains(f, grad_of, weight_stage, self.gradients))
            # Ops that depend on no batch input and no weight (constants: a mask, a scale,
            # zeros; an imported Llama's rotary tables, computed from buffers) run where
            # they are read, on the earliest stage that reads them; they pull neither their
            # forward readers nor the backward ops that read them to an earlier stage.
            free = constant_ops(f, weight_stage)
            made_by = {v: op for v, op in producer.items() if op not in free}
            found = self._of_weights[key] = (free, grad_of, made_by)
        return found


def staged(
    f: Function, n: int, marks: Mapping[Op, int], what: str | None = None
) -> tuple[Function, dict[Op, int]]:
    """``f`` ready to pipeline over ``n`` stages, and the stage of each of its ops: as
    :func:`assign_stages`, with each stage's replays (recomputed activations) started
    from the values the stage holds (:mod:`ir.transforms.stage_replays`), so that any
    cut of a recomputed program has a schedule, and with each value of no batch input
    made on every stage that reads it (:mod:`ir.transforms.stage_constants`). Every
    stage has work."""
    stage, _, twins = _assign(f, n, marks, what)
    g, stage = local_replays(f, stage, twins, backward_ops(f))
    g, stage = local_constants(g, stage, backward_ops(g))
    _check_every_stage_works(g, n, stage, what)
    return g, stage


def _check_every_stage_works(
    f: Function, n: int, stage: Mapping[Op, int], what: str | None
) -> None:
    busy = {stage[op] for op in f.ops if not is_stage_marker(op)}
    idle = [s for s in range(n) if s not in busy]
    if idle:  # the cuts above never leave one: a guard against a silent wrong program
        raise TransformError(
            f"pipeline level: {what or f'{n} stages'} leaves stage(s) {idle} of {f.name} "
            "without an op (stages more than layers); use fewer stages"
        )


def _assign(
    f: Function, n: int, marks: Mapping[Op, int], what: str | None, cuts: StageCuts | None = None
) -> tuple[dict[Op, int], str, dict[Op, Op]]:
    """The stages, how the cut was chosen (``PipelineCut.at``) and the replays' twins
    (``cuts``: the analyses of ``f`` that other numbers of stages read too)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise TransformError(f"stages must be a positive integer, got {n!r}")
    if cuts is None:
        cuts = StageCuts(f, marks)
    backward, gradients, twins = cuts.backward, cuts.gradients, cuts.twins
    optimizers = cuts.optimizers
    if marks:
        forward = annotated_forward(f, n, marks, backward)
        weight_stage = weight_stages(f, forward)
        at = AT_ANNOTATIONS
    else:
        forward = None
        weight_stage, at = balanced_weights(f, n, backward, what, cuts.weight_cuts())
    producer = f.producers
    free, grad_of, made_by = cuts.of_weights(weight_stage)
    stage: dict[Op, int] = {}
    # A weight lives where the forward op that reads it runs (an op reading weights of two
    # groups runs on the later one); its gradient and optimizer step follow it there.
    home: dict[Value, int] = {}
    for op in f.ops:
        if op in free:
            continue
        wstages = [home.get(v, weight_stage[v]) for v in op.inputs if v in weight_stage]
        made = [stage[made_by[v]] for v in op.inputs if v in made_by]
        if op in optimizers:
            w = op.inputs[0]
            stage[op] = home.get(w, weight_stage.get(w, max(made, default=0)))
        elif op not in backward:
            stage[op] = forward[op] if forward is not None else max(wstages + made, default=0)
            for v in op.inputs:
                if v in weight_stage:
                    home.setdefault(v, stage[op])
        elif op not in gradients:  # a recomputed activation: where its forward op ran
            twin = twins.get(op)
            stage[op] = stage[twin] if twin in stage else max(wstages + made, default=0)
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
    # A gradient op placed by the activations it reads can land before the forward op it
    # differentiates (a MoE combine's gradient dispatches dy by the router's slots and
    # gates, on the router's stage, while the experts it feeds ran a stage later): it runs
    # where its gradient readers run, or the backward would flow to a later stage.
    for op in reversed(f.ops):
        if op in gradients and op not in grad_of and op not in optimizers:
            later = [
                stage[u]
                for v in op.outputs
                for u in consumers.get(v, [])
                if u in gradients and u not in optimizers
            ]
            stage[op] = max([stage[op], *later])
    for op in reversed(f.ops):
        if op in free:
            readers = [stage[u] for v in op.outputs for u in consumers.get(v, [])]
            stage[op] = min(readers, default=0)
    return {op: stage[op] for op in f.ops}, at, twins


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
    # A weight read through a weight-only computation (a BatchNorm's scale reshaped to
    # broadcast, Gemma's ``1 + w``) counts as the weight read with its partner.
    of_weights = _weight_derived(f, weight_stage, gradients)
    beside: dict[Value, set[Value]] = {}  # forward value -> weights read with it
    for op in f.ops:
        if op not in gradients and not is_optimizer(op):
            ws = {w for v in op.inputs for w in of_weights.get(v, ())}
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


def _weight_derived(
    f: Function, weight_stage: Mapping[Value, int], gradients: set[Op]
) -> dict[Value, set[Value]]:
    """Each weight, and each forward value computed from weights and constants alone
    (no batch input), mapped to the weights it comes from."""
    batch = set(batch_inputs(f))
    of: dict[Value, set[Value]] = {w: {w} for w in weight_stage}
    for op in f.ops:
        if op in gradients or is_optimizer(op):
            continue
        if any(v in batch for v in op.inputs):
            batch.update(op.outputs)
            continue
        ws = {w for v in op.inputs for w in of.get(v, ())}
        if ws:
            for v in op.outputs:
                of[v] = ws
    return of


@dataclass(frozen=True)
class StageCut:
    """One stage of a pipeline cut: the weights it holds (in order of first use) and the
    forward values it receives from earlier stages (what the cut before it sends)."""

    stage: int
    weights: tuple[str, ...]
    receives: tuple[str, ...]


@dataclass(frozen=True)
class PipelineCut:
    """Where a pipeline cuts a program: how the cut was chosen (``at``: ``"layer
    boundaries"``, ``"sublayer boundaries"``, ``"between weights"`` or
    ``"annotations"``) and each model stage (:class:`StageCut`)."""

    at: str
    stages: tuple[StageCut, ...]


def pipeline_cut(
    f: Function, pp: int, *, chunks: int = 1, stage_of: Mapping[str, int] | None = None
) -> PipelineCut:
    """The cut that ``pipeline_parallel(f, pp, ..., chunks=chunks, stage_of=stage_of)`` and
    ``megatron(f, pp=pp, ...)`` build: ``pp * chunks`` model stages (stage ``c * pp + d``
    on pipeline rank ``d``), each with its weights and the values it receives.

    >>> import ir
    >>> t = ir.transforms.training(ir.models.gpt(2, 8, 16, 2, 32, layers=4))
    >>> cut = pipeline_cut(t, 2)
    >>> cut.at, cut.stages[1].receives, cut.stages[1].weights[0]
    ('layer boundaries', ('h1_res2',), 'h2_ln1_g')
    """
    function_arg("pipeline_cut", "f", f)
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
        raise TransformError(f"chunks must be a positive integer, got {chunks!r}")
    if isinstance(pp, bool) or not isinstance(pp, int) or pp < 1:
        raise TransformError(f"the pipeline degree must be a positive integer, got {pp!r}")
    g, marks = unmarked(f, stage_of)
    n = pp * chunks
    stage, at, _ = _assign(g, n, marks, pipeline_degree(pp, chunks))
    backward = backward_ops(g)
    producer = g.producers
    order = weights(g)
    held_weights = set(order)
    held: list[list[str]] = [[] for _ in range(n)]
    received: list[dict[str, None]] = [{} for _ in range(n)]
    home: dict[Value, int] = {}
    for op in g.ops:
        if op in backward or is_optimizer(op) or is_stage_marker(op):
            continue
        s = stage[op]
        for v in op.inputs:
            if v in producer and stage[producer[v]] < s and not is_stage_marker(producer[v]):
                received[s][v.name] = None
            if v in held_weights:
                home.setdefault(v, s)
    for op in g.ops:  # a weight no forward op reads lives with its optimizer step
        if is_optimizer(op):
            home.setdefault(op.inputs[0], stage[op])
    for w in order:
        held[home.get(w, 0)].append(w.name)
    return PipelineCut(at, tuple(StageCut(s, tuple(held[s]), tuple(received[s])) for s in range(n)))


def pipeline_degree(pp: int, chunks: int = 1, name: str = "pp") -> str:
    """``"pp=4"``, or ``"pp=4 x chunks=2 = 8 model stages"``: the degree errors name."""
    if chunks == 1:
        return f"{name}={pp}"
    return f"{name}={pp} x chunks={chunks} = {pp * chunks} model stages"


__all__ = [
    "AT_ANNOTATIONS",
    "AT_LAYERS",
    "AT_POINTS",
    "AT_WEIGHTS",
    "PipelineCut",
    "StageCut",
    "StageCuts",
    "annotated_stages",
    "assign_stages",
    "backward_ops",
    "gradient_ops",
    "pipeline_cut",
    "pipeline_degree",
    "stage_assignment",
    "staged",
    "unmarked",
    "weights",
]
