"""Embedding lookup (the issue's "Embedding/Gather") and its scatter-add gradient, and
``TakeAlongAxis`` (torch's ``gather``: an index per element along one axis) and its
scatter-add gradient ``TakeAlongAxisGrad``.

The communication family already owns the name ``Gather`` (concatenate shards
on one device), so the table lookup is ``Embedding``.
"""

from __future__ import annotations

import numpy as np

from .. import attr_kinds as kinds
from ..errors import TypeRuleError
from ..registry import Attr, Cost, CostContext, OpDef, TypeContext, get_op, register_op
from ..types import DType, TensorType
from . import _factors as fx
from ._common import checked_indices, normalize_axis, tensor
from ._examples import ctx, t

_INT_DTYPES = (DType.int64, DType.int32)


def _ids(c: TypeContext, i: int) -> TensorType:
    ids = tensor(c, i, "ids")
    if ids.dtype not in _INT_DTYPES:
        raise TypeRuleError(f"ids must be int64 or int32, got {ids.dtype.value}; cast them first")
    return ids


def _padding_idx(c: TypeContext, rows: int) -> None:
    pad = c.attributes["padding_idx"]
    if pad is not None and (
        isinstance(pad, bool) or not isinstance(pad, int) or not 0 <= pad < rows
    ):
        raise TypeRuleError(f"padding_idx must be None or a row in 0..{rows - 1}, got {pad!r}")


def _embedding_types(c: TypeContext):
    table, ids = tensor(c, 0, "table"), _ids(c, 1)
    if table.rank != 2:
        raise TypeRuleError(f"the table must be (num_embeddings, hidden), got shape {table.shape}")
    _padding_idx(c, table.shape[0])
    return [table.with_shape((*ids.shape, table.shape[1]))]


def _embedding_cost(c: CostContext) -> Cost:
    ids = c.input_types[1]
    (y,) = c.output_types
    # Only the looked-up rows are read, not the whole table.
    return Cost(0.0, ids.size_bytes + y.size_bytes, y.size_bytes)


register_op(
    OpDef(
        name="Embedding",
        operands=("table", "ids"),
        results=("y",),
        type_rule=_embedding_types,
        kernel=lambda xs, a: [
            np.take(xs[0], checked_indices("Embedding", "ids", xs[1], len(xs[0])), axis=0)
        ],
        cost_rule=_embedding_cost,
        attributes=(
            Attr(
                "padding_idx",
                None,
                "a row that gets no gradient (torch's padding_idx)",
                kind=kinds.optional(kinds.NONNEG_INT),
            ),
        ),
        doc="Row lookup: y[..., :] = table[ids[...], :].",
        extra={
            "weight_operands": (0,),  # the table is a weight
            "vocabulary_form": lambda *args: _vocabulary_form(*args),
            "vocabulary_rows": lambda op: op.inputs[0].type.shape[0],  # a table: must split
            "value_ranges": lambda op: {1: (0, op.inputs[0].type.shape[0])},  # row ids
            "examples": lambda s: [
                ctx(t(4 * s, 3), t(2 * s, dtype=DType.int64)),
                ctx(t(5, 2 * s), t(2, s, dtype=DType.int64)),
            ],
        },
    )
)


def _embedding_grad_types(c: TypeContext):
    ids, dy = _ids(c, 0), tensor(c, 1, "dy")
    v = c.attributes["num_embeddings"]
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise TypeRuleError(f"num_embeddings must be a positive integer, got {v!r}")
    _padding_idx(c, v)
    if dy.rank != ids.rank + 1 or dy.shape[:-1] != ids.shape:
        raise TypeRuleError(f"dy has shape {dy.shape}, ids of shape {ids.shape} need (*ids, H)")
    if not dy.dtype.is_float:
        raise TypeRuleError(f"dy must be floating-point, got {dy.dtype.value}")
    return [dy.with_shape((v, dy.shape[-1]))]


def _scatter_add_cost(c) -> Cost:
    """A scatter-add of ``dy`` (operand 1) at ``ids``/``index`` (operand 0) into a zero
    output: an add per element of dy; both operands read, the output written."""
    return Cost(
        c.input_types[1].num_elements,
        c.input_types[0].size_bytes + c.input_types[1].size_bytes,
        c.output_types[0].size_bytes,
    )


def _embedding_grad(xs, a):
    ids, dy = xs
    out = np.zeros((a["num_embeddings"], dy.shape[-1]), dtype=dy.dtype)
    ids = checked_indices("EmbeddingGrad", "ids", ids, a["num_embeddings"])
    np.add.at(out, ids.reshape(-1), dy.reshape(-1, dy.shape[-1]))
    if a["padding_idx"] is not None:
        out[a["padding_idx"]] = 0
    return [out]


register_op(
    OpDef(
        name="EmbeddingGrad",
        operands=("ids", "dy"),
        results=("dtable",),
        type_rule=_embedding_grad_types,
        kernel=_embedding_grad,
        cost_rule=_scatter_add_cost,
        attributes=(
            Attr("num_embeddings", doc="rows of the table (V)", kind=kinds.POS_INT),
            Attr(
                "padding_idx",
                None,
                "a row left at zero (torch's padding_idx)",
                kind=kinds.optional(kinds.NONNEG_INT),
            ),
        ),
        doc="Gradient of Embedding: dy's rows added into a (V, H) zero table at rows ids.",
        extra={
            "vocabulary_form": lambda *args: _vocabulary_form(*args),
            "vocabulary_rows": lambda op: op.attributes["num_embeddings"],
            "value_ranges": lambda op: {0: (0, op.attributes["num_embeddings"])},
            "examples": lambda s: [
                ctx(t(2 * s, dtype=DType.int64), t(2 * s, 3), num_embeddings=4 * s),
                ctx(t(2, s, dtype=DType.int64), t(2, s, 2 * s), num_embeddings=5, padding_idx=1),
            ],
        },
    )
)


def _vocabulary_form(b, op, ins, stats):
    """``op`` as its vocabulary-parallel form (``ir/ops/vocabulary.py``): the table's rows
    named by their vocabulary ids, ``Arange(V)``, so that a shard of the table looks up
    (or accumulates the gradient of) the ids it holds and nothing else."""
    y = op.outputs[0]
    n = get_op(op.op_type).extra["vocabulary_rows"](op)
    if ins[0].type.dtype.is_float:  # Embedding(table, ids)
        table, ids = ins
        dy = None
    else:  # EmbeddingGrad(ids, dy)
        ids, dy = ins
    device = ids.type.device
    rows = b.call("Arange", n=n, dtype=ids.type.dtype.value, device=device, name=f"{y.name}_rows")
    pad = op.attributes["padding_idx"]
    if dy is None:
        return [b.call("VocabEmbedding", table, ids, rows, padding_idx=pad, name=y.name)]
    return [b.call("VocabEmbeddingGrad", ids, dy, rows, padding_idx=pad, name=y.name)]


# -- TakeAlongAxis -------------------------------------------------------------------


def _take_types(c: TypeContext):
    x, index = tensor(c, 0, "x"), _ids(c, 1)
    axis = normalize_axis(c.attributes["axis"], x.rank)
    if index.rank != x.rank:
        raise TypeRuleError(f"index has rank {index.rank}, x has rank {x.rank}: they must match")
    for d, (n, m) in enumerate(zip(x.shape, index.shape)):
        if d != axis and n != m:
            raise TypeRuleError(
                f"index has shape {index.shape}, x has {x.shape}: off axis {axis} they must "
                "match (slice x first)"
            )
    return [x.with_shape(index.shape)]


register_op(
    OpDef(
        name="TakeAlongAxis",
        operands=("x", "index"),
        results=("y",),
        type_rule=_take_types,
        kernel=lambda xs, a: [np.take_along_axis(xs[0], xs[1], axis=a["axis"])],
        cost_rule=lambda c: Cost(
            0.0,
            c.input_types[1].size_bytes + c.output_types[0].size_bytes,
            c.output_types[0].size_bytes,
        ),
        attributes=(Attr("axis", doc="the axis index picks along", kind=kinds.INT),),
        doc="y[..., i, ...] = x[..., index[..., i, ...], ...] along axis (torch.gather).",
        extra={
            "value_ranges": lambda op: {1: (0, _along(op.inputs[0].type, op))},
            "nondiff_operands": (1,),
            "examples": lambda s: [
                ctx(t(2, 4 * s), t(2, 2 * s, dtype=DType.int64), axis=1),
                ctx(t(3 * s, 2, dtype=DType.int64), t(s, 2, dtype=DType.int64), axis=0),
            ],
        },
    )
)


def _along(x: TensorType, op) -> int:
    """The length of ``x`` along the op's axis."""
    return x.shape[normalize_axis(op.attributes["axis"], x.rank)]


def _take_grad_types(c: TypeContext):
    index, dy = _ids(c, 0), tensor(c, 1, "dy")
    if index.shape != dy.shape or not dy.dtype.is_float:
        raise TypeRuleError(f"dy must be a float tensor of index's shape {index.shape}, got {dy}")
    axis = normalize_axis(c.attributes["axis"], dy.rank)
    return [dy.with_shape((*dy.shape[:axis], c.attributes["size"], *dy.shape[axis + 1 :]))]


def _take_grad(xs, a):
    index, dy = xs
    axis = normalize_axis(a["axis"], dy.ndim)
    out = np.zeros((*dy.shape[:axis], a["size"], *dy.shape[axis + 1 :]), dtype=dy.dtype)
    where = list(np.indices(dy.shape, sparse=True))
    where[axis] = checked_indices("TakeAlongAxisGrad", "index", index, a["size"])
    np.add.at(out, tuple(where), dy)
    return [out]


register_op(
    OpDef(
        name="TakeAlongAxisGrad",
        operands=("index", "dy"),
        results=("dx",),
        type_rule=_take_grad_types,
        kernel=_take_grad,
        cost_rule=_scatter_add_cost,
        attributes=(
            Attr("axis", doc="the axis index picked along", kind=kinds.INT),
            Attr("size", doc="x's length along axis", kind=kinds.POS_INT),
        ),
        doc="Gradient of TakeAlongAxis: dy added into a zero tensor (size along axis) at "
        "index along axis (repeated indices add up).",
        extra={
            "value_ranges": lambda op: {0: (0, op.attributes["size"])},
            "examples": lambda s: [
                ctx(t(2, 2 * s, dtype=DType.int64), t(2, 2 * s), axis=1, size=4 * s),
                ctx(t(3 * s, 2, dtype=DType.int64), t(3 * s, 2), axis=0, size=2),
            ],
        },
    )
)


# -- sharding rules ------------------------------------------------------------------
# The table may be sharded along its hidden axis and the ids anywhere; the vocabulary
# axis stays whole (a sharded vocabulary needs a masked lookup, not provided).


def _embedding_sharding(c: TypeContext) -> dict:
    lead = fx.axes(c.input_types[1].rank)
    return fx.rule([(None, "h"), lead], [(*lead, "h")], linear=[(0,)])


def _embedding_grad_sharding(c: TypeContext) -> dict:
    lead = fx.axes(c.input_types[0].rank)
    return fx.rule(
        [lead, (*lead, "h")], [(None, "h")], reduce=dict.fromkeys(lead, "sum"), linear=[(1,)]
    )


fx.attach("Embedding", _embedding_sharding)
fx.attach("EmbeddingGrad", _embedding_grad_sharding)


def _take_sharding(c: TypeContext) -> dict:
    rank = c.input_types[0].rank
    axis = normalize_axis(c.attributes["axis"], rank)
    names = tuple(None if d == axis else n for d, n in enumerate(fx.axes(rank)))
    return fx.rule([names, names], [names], partial_ops=fx.ALL_REDUCTIONS)


fx.attach("TakeAlongAxis", _take_sharding)


def _take_grad_sharding(c: TypeContext) -> dict:
    rank = c.input_types[1].rank
    axis = normalize_axis(c.attributes["axis"], rank)
    names = tuple(None if d == axis else n for d, n in enumerate(fx.axes(rank)))
    return fx.rule([names, names], [names], linear=[(1,)])


fx.attach("TakeAlongAxisGrad", _take_grad_sharding)


# -- gradient rules (autodiff) -------------------------------------------------------
# The integer ids get no gradient.


def _embedding_gradient(b, op, ins, outs, dys):
    from ._grad import gname

    (dy,) = dys
    if dy is None:
        return [None, None]
    table, ids = ins
    n = table.type.shape[0]
    pad = op.attributes["padding_idx"]
    return [
        b.call("EmbeddingGrad", ids, dy, num_embeddings=n, padding_idx=pad, name=gname(table)),
        None,
    ]


def _take_gradient(b, op, ins, outs, dys):
    from ._grad import gname

    (dy,) = dys
    if dy is None:
        return [None, None]
    x, index = ins
    axis, size = op.attributes["axis"], _along(x.type, op)
    return [b.call("TakeAlongAxisGrad", index, dy, axis=axis, size=size, name=gname(x)), None]


def _attach_gradient_rules() -> None:
    from ..registry import attach_rule

    attach_rule("Embedding", "gradient_rule", _embedding_gradient)
    attach_rule("TakeAlongAxis", "gradient_rule", _take_gradient)


_attach_gradient_rules()
