"""The data level of :func:`ir.transforms.megatron`'s analysis: the program one piece of the
batch runs (a replica's microbatch).

The data plan over ``dp * microbatches`` pieces gives the per-piece program (global loss
denominators), the gradients it leaves partial and the optimizer steps after their
all-reduce. None of it depends on the strategy's other values: every strategy whose batch
is cut into as many pieces (and, with experts, as many expert groups) has the same
:class:`PieceAnalysis` of a program, whatever its tensor degree, pipeline stages or
schedule (a search's strategies share it: ``ir.transforms._megatron_shared``). It is read,
never changed, by the plans that use it.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..builder import FunctionBuilder
from ..errors import VerifyError
from ..function import Function
from ..op import Op
from ..value import Value
from ..verify import describe_op
from ._rewrite import TransformError, is_optimizer
from ._spmd import P, R, Step
from ._spmd import Plan as _Plan
from .data_parallel import data_plan
from .pipeline import backward_ops
from .stage_cut import gradient_ops


def copy_op(builder: FunctionBuilder, op: Op, inputs: list[Value]) -> tuple[Value, ...]:
    """``op`` (of a plan's per-device program: built, so verified) added to ``builder`` on
    ``inputs``, keeping its names: typed again only if the operand types differ."""
    try:
        return builder.add_like(op, inputs, [v.name for v in op.outputs]).outputs
    except VerifyError as e:
        raise VerifyError(f"{e}\n  while rebuilding: {describe_op(op)}") from None


@dataclass(frozen=True, eq=False)
class PieceAnalysis:
    """The data level of a 3D step of ``t`` over a number of pieces (see the module doc)."""

    dplan: _Plan  # the data plan over every piece of the batch
    post: tuple[Op, ...]  # the optimizer steps after the gradients' all-reduce
    post_keys: dict[Op, tuple[Value, ...]]  # their operands (data-plan keys)
    conv_dst: dict[Value, Step]  # each data-level conversion, by its result
    summed_sources: frozenset[Value]  # data-plan keys summed over the replicas
    piece: Function  # the program of one piece (one expert group's, with experts)
    source_of: dict[Value, Value]  # piece input -> data-plan key
    key_of: dict[Value, Value]  # piece value -> data-plan key
    piece_out: tuple[Value, ...]  # what the piece returns
    summed: frozenset[Value]  # piece outputs summed over microbatches and replicas
    origin: tuple[tuple[Op, Op], ...]  # each op of the piece and the op of t it runs
    backward: frozenset[Op]  # the backward ops of t


def analyse_pieces(t: Function, pieces: int, ep: int = 1) -> PieceAnalysis:
    """The data level of a 3D step of ``t`` over ``pieces`` pieces of the batch (replicas
    x microbatches), ``ep`` replicas to an expert group; a TransformError names what cannot
    be pipelined or cut."""
    # Data plan over dp * m pieces: the per-piece program (global loss denominators),
    # the gradients it leaves partial, and the optimizer steps after their all-reduce.
    dplan = data_plan(t, pieces, what="dp x microbatches")
    sliced = [st.keys[0].name for st in dplan.steps if st.op is None and st.src == R]
    if sliced:
        raise TransformError(
            f"data level: {sliced} are whole-batch values made from no batch input that "
            "are no broadcast the step can make per microbatch (a constant of the "
            "batch's rows); the 3D step does not cut them into the microbatches' "
            "pieces: use T.pipeline_parallel or T.data_parallel, which do"
        )
    late: set[Value] = {st.keys[1] for st in dplan.steps if st.op is None}
    post: list[Op] = []
    post_keys: dict[Op, tuple[Value, ...]] = {}
    piece_ops: list[tuple[int, Op]] = []
    for i, st in enumerate(dplan.steps):
        if st.op is None:
            continue
        if any(k in late for k in st.keys):
            if any(dplan.state[k] != R for k in st.keys if k not in late):
                raise TransformError(
                    f"pipeline level: {st.op.op_type} needs a value summed over the whole "
                    "batch before the batch is done; it cannot be pipelined"
                )
            late.update(st.op.outputs)
            post.append(st.op)
            post_keys[st.op] = st.keys
        else:
            piece_ops.append((i, st.op))
    if any(not is_optimizer(op) for op in post):
        shown = sorted({op.op_type for op in post if not is_optimizer(op)})
        raise TransformError(
            f"3D parallelism runs only optimizer steps after the gradient all-reduce; "
            f"{t.name} also runs {shown} there"
        )
    conv_dst = {st.keys[1]: st for st in dplan.steps if st.op is None}
    summed_sources = {st.keys[0] for st in conv_dst.values() if st.src == P}
    # A gradients-only program (T.gradients) returns its weight gradients: summed over
    # the replicas (all-reduced, as DDP does) like those an optimizer step reads.
    made_by_backward = gradient_ops(t)
    summed_sources |= {
        dplan.current[v]
        for v in t.outputs
        if t.producers.get(v) in made_by_backward and dplan.state[dplan.current[v]] == P
    }
    # The per-piece program: the local ops of the data plan (batch / (dp m) rows). With
    # experts split over ep replicas, a piece is one expert group's microbatch (ep
    # replicas' rows: the expert level splits it over the group).
    pplan = dplan if ep == 1 else data_plan(t, pieces // ep)
    if pplan is not dplan:
        after = set(post)
        piece_ops = [(i, st.op) for i, st in enumerate(pplan.steps) if st.op and st.op not in after]
    loc = pplan.local
    b = FunctionBuilder(f"{t.name}_piece")
    env: dict[Value, Value] = {}
    source_of: dict[Value, Value] = {}  # piece input -> source key
    for i, _ in piece_ops:
        local = loc.step_ops[i]
        ins = []
        for k, lv in zip(pplan.steps[i].keys, local.inputs):
            if lv not in env:
                env[lv] = b.input(k.name, lv.type)
                source_of[env[lv]] = k
            ins.append(env[lv])
        for x, y in zip(local.outputs, copy_op(b, local, ins)):
            env[x] = y
    key_of = {env[loc.env[k]]: k for k in loc.env if loc.env[k] in env}
    needed = [st.keys[0] for st in conv_dst.values()]
    needed += [dplan.current[v] for v in t.outputs if dplan.current[v] not in late]
    piece_out = list(dict.fromkeys(env[loc.env[k]] for k in needed))
    piece = b.finish(piece_out)
    summed = {env[loc.env[st.keys[0]]] for st in conv_dst.values() if st.src == P}
    summed |= {
        env[loc.env[dplan.current[v]]]
        for v in t.outputs
        if dplan.state[dplan.current[v]] == P and dplan.current[v] not in late
    }
    return PieceAnalysis(
        dplan,
        tuple(post),
        post_keys,
        conv_dst,
        frozenset(summed_sources),
        piece,
        source_of,
        key_of,
        tuple(piece_out),
        frozenset(summed),
        tuple(zip(piece.ops, [op for _, op in piece_ops])),
        frozenset(backward_ops(t)),
    )


__all__ = ["PieceAnalysis", "analyse_pieces", "copy_op"]
