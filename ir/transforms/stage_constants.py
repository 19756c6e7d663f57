"""Values of no batch input made on every pipeline stage that reads them.

A model computes some values from no batch input: an imported Llama's rotary tables
(from its ``inv_freq`` buffer and the positions), masks, a weight's transpose. The stage
cut gives such an op one stage, and every later stage that reads its result would
receive it from there, microbatch after microbatch in a 3D step: a transfer from the
first stage to the last that waits (Megatron-LM synchronises after its point-to-point
transfers) until the last stage reaches it, so the first stage stalls a whole pipeline
fill per microbatch. Megatron-LM computes them on each stage (every stage's
``GPTModel.forward`` makes its rotary embedding). So does :func:`local_constants`: each
such op runs on every stage that reads its results, and only the inputs it reads (a
buffer, once per step) cross stages.

Ops that read a trained weight (one an optimizer step updates) are left where they are:
a trained weight lives on one stage.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..builder import FunctionBuilder, rebuild_op
from ..function import Function
from ..layout import layouts_of
from ..op import Op
from ..sharding.stages import is_stage_marker
from ..value import Value
from ..verify import verify
from ._rewrite import is_optimizer
from .layer_cut import constant_ops


def _trained(f: Function) -> set[Value]:
    """The inputs an optimizer step of ``f`` updates (none in a forward program)."""
    return {op.inputs[0] for op in f.ops if is_optimizer(op)}


def local_constants(
    f: Function, stage: Mapping[Op, int], backward: set[Op]
) -> tuple[Function, dict[Op, int]]:
    """``f`` with each forward op that depends on no batch input and no trained weight
    copied onto every stage that reads its results (a copy's results named
    ``<name>_s<stage>``), and the stage of each op of the result; ``f`` itself (and
    ``stage``) when every such op's readers share its stage."""
    movable = {
        op
        for op in constant_ops(f, _trained(f))
        if op not in backward and not is_optimizer(op) and not is_stage_marker(op)
    }
    consumers = f.consumers
    outputs = set(f.outputs)
    needs: dict[Op, set[int]] = {}
    for op in reversed(f.ops):
        if op not in movable:
            continue
        wanted: set[int] = set()
        for v in op.outputs:
            for u in consumers.get(v, ()):
                wanted |= needs[u] if u in movable else {stage[u]}
            if v in outputs:
                wanted.add(stage[op])
        needs[op] = wanted or {stage[op]}
    if all(needs[op] == {stage[op]} for op in needs):
        return f, dict(stage)
    b = FunctionBuilder(f.name)
    env = {v: b.input(v.name, v.type) for v in f.inputs}
    copies: dict[tuple[Value, int], Value] = {}  # (result, stage) -> the copy on that stage
    new_stage: list[int] = []

    def operand(v: Value, s: int) -> Value:
        return copies.get((v, s), env[v])

    for op in f.ops:
        if op not in movable:
            s = stage[op]
            env.update(zip(op.outputs, rebuild_op(b, op, [operand(v, s) for v in op.inputs])))
            new_stage.append(s)
            continue
        first = stage[op] if stage[op] in needs[op] else min(needs[op])
        for s in sorted(needs[op], key=lambda s: (s != first, s)):
            names = [v.name if s == first else f"{v.name}_s{s}" for v in op.outputs]
            new = b.add_op(
                op.op_type,
                [operand(v, s) for v in op.inputs],
                dict(op.attributes),
                names=names,
                subfunctions=op.subfunctions,
                op_name=op.name,
            )
            new_stage.append(s)
            for v, x in zip(op.outputs, new.outputs):
                copies[(v, s)] = x
                if s == first:
                    env[v] = x
    g = verify(layouts_of(b.finish([env[v] for v in f.outputs]), f))
    return g, dict(zip(g.ops, new_stage))


__all__ = ["local_constants"]
