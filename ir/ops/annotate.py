"""Annotation ops: identities that carry a user's sharding or pipeline-stage choice.

They keep annotations in the program, so that they print and parse with the
generic op syntax:

* ``ShardAnnotate(x, mesh=[2, 4], devices=[...], placements=["S(0)", "R"])``:
  the layout the user wants for ``x`` (``ir.sharding.propagate`` reads it);
* ``PipelineStage(y, stage=1)``: the op that produced ``y`` runs in pipeline
  stage 1 (ONNX's per-node ``pipeline_stage``; ``ir.sharding.pipeline_stages``
  reads it and gives unmarked ops the stage of their operands). It moves no data
  (a backend runs nothing for it), so it costs nothing, and its gradient is the
  gradient of ``y`` passed through unchanged: ``training`` keeps the markers in
  the forward pass and adds no op for them to the backward pass (the pipeline
  transforms put each backward op on the stage of the forward op it differentiates).
"""

from __future__ import annotations

from .. import attr_kinds as kinds
from ..errors import TypeRuleError
from ..registry import Attr, OpDef, OpKind, TypeContext, attach_rule, register_op
from . import _factors as fx
from ._common import memory_cost, no_cost, tensor
from ._examples import ctx, t
from .p2p import MESH, MESH_DEVICES, PLACEMENTS, check_layout, layout_contexts, mesh_attrs


def _annotate_types(c: TypeContext):
    x = tensor(c, 0, "x")
    mesh, _, placements = mesh_attrs(c)
    check_layout(x.shape, mesh, placements)
    return [x]


register_op(
    OpDef(
        name="ShardAnnotate",
        operands=("x",),
        results=("y",),
        type_rule=_annotate_types,
        kernel=lambda xs, a: [xs[0]],
        cost_rule=memory_cost,
        attributes=(MESH, MESH_DEVICES, PLACEMENTS),
        kind=OpKind.CONTROL,
        doc="x unchanged, annotated with a layout (mesh, devices, placements) for propagation.",
        extra={"examples": layout_contexts},
    )
)


def _stage_types(c: TypeContext):
    stage = c.attributes["stage"]
    if isinstance(stage, bool) or not isinstance(stage, int) or stage < 0:
        raise TypeRuleError(f"stage must be a non-negative integer, got {stage!r}")
    return [c.input_types[0]]


register_op(
    OpDef(
        name="PipelineStage",
        operands=("x",),
        results=("y",),
        type_rule=_stage_types,
        kernel=lambda xs, a: [xs[0]],
        cost_rule=no_cost,
        attributes=(
            Attr("stage", doc="pipeline stage of the op that produced x", kind=kinds.NONNEG_INT),
        ),
        kind=OpKind.CONTROL,
        doc="x unchanged; marks the op that produced x as running in pipeline stage `stage`.",
        extra={"examples": lambda s: [ctx(t(2 * s, 3), stage=1), ctx(t(s), stage=0)]},
    )
)

# -- sharding rules ------------------------------------------------------------------

fx.attach("PipelineStage", lambda c: fx.same_axes(c))

# -- gradient rules ------------------------------------------------------------------

# The marker is an identity: the gradient of y is the gradient of x, with no op for it.
attach_rule("PipelineStage", "gradient_rule", lambda b, op, ins, outs, dys: [dys[0]])
