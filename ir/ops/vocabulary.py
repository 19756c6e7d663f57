"""The vocabulary-parallel forms of the embedding and the cross-entropy (Megatron-LM's
``VocabParallelEmbedding`` and parallel cross-entropy, Shoeybi et al. 2019, section 3).

Each op here is an ordinary sequential op whose *index operand* (``rows``, ``classes``)
holds the vocabulary ids of the table's rows or of the logits' last axis: ``Arange(V)``
in the sequential program. Because the ids travel with the data, a shard of the table
(or of the logits) together with the same shard of its ids computes its part of the
result on any device, with no device index: a split along the vocabulary gives partial
sums (``P``), or partial maxima for ``ClassMax``. ``ir.transforms.megatron`` rewrites
``Embedding``, ``EmbeddingGrad``, ``Loss`` and ``LossGrad`` (cross-entropy) into these
forms (their records' ``extra["vocabulary_form"]``) and splits them over the tensor
ranks; slicing the replicated ``Arange`` costs nothing (``KeepShard``).

Here: ``Arange`` and the embedding's form, ``VocabEmbedding`` and its gradient; the
cross-entropy's parts (``ClassMax``, ``ClassSumExp``, ``ClassPick``,
``CrossEntropyLoss``, ``CrossEntropyGrad``) are in ``ir/ops/cross_entropy.py``.
"""

from __future__ import annotations

import numpy as np

from .. import attr_kinds as kinds
from ..errors import TypeRuleError
from ..registry import Attr, Cost, OpDef, TypeContext, register_op
from ..types import DType, TensorType
from . import _factors as fx
from ._common import memory_cost, tensor
from ._examples import ctx, t

_INTS = (DType.int64, DType.int32)
I64 = DType.int64


def _int_operand(c: TypeContext, i: int, what: str, rank: int | None = None) -> TensorType:
    x = tensor(c, i, what)
    if x.dtype not in _INTS:
        raise TypeRuleError(f"{what} must be int64 or int32, got {x.dtype.value}")
    if rank is not None and x.rank != rank:
        raise TypeRuleError(f"{what} must have rank {rank}, got shape {x.shape}")
    return x


def _match(ids: np.ndarray, index: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Positions of ``ids`` in ``index`` when ``index`` is a run of consecutive ids (an
    ``Arange`` or a slice of one): (position clipped into range, found); else None."""
    n = len(index)
    if n == 0 or int(index[-1]) - int(index[0]) != n - 1:
        return None
    if n > 1 and not np.all(np.diff(index) == 1):
        return None
    pos = np.asarray(ids, dtype=np.int64) - int(index[0])
    found = (pos >= 0) & (pos < n)
    return np.where(found, pos, 0), found


def _onehot(ids: np.ndarray, index: np.ndarray, dtype) -> np.ndarray:
    """``[index[j] == ids[...]]`` as ``(*ids.shape, len(index))`` (any index: the general
    form, duplicates summed)."""
    return (np.asarray(ids, dtype=np.int64)[..., None] == index).astype(dtype)


# -- Arange ----------------------------------------------------------------------------


def _arange_types(c: TypeContext):
    a = c.attributes
    return [TensorType((a["n"],), DType(a["dtype"]), a["device"])]


register_op(
    OpDef(
        name="Arange",
        operands=(),
        results=("ids",),
        type_rule=_arange_types,
        kernel=lambda xs, a: [np.arange(a["n"], dtype=DType(a["dtype"]).numpy)],
        cost_rule=memory_cost,
        attributes=(
            Attr("n", doc="how many ids: 0, 1, ..., n - 1", kind=kinds.POS_INT),
            Attr("dtype", "int64", "integer element type", kind=kinds.one_of("int64", "int32")),
            Attr("device", None, "device the ids live on", kind=kinds.DEVICE),
        ),
        doc="The ids 0, 1, ..., n - 1 (the vocabulary ids of a table's rows).",
        extra={"examples": lambda s: [ctx(n=4 * s, device=0), ctx(n=s, dtype="int32", device=1)]},
    )
)

# -- VocabEmbedding and its gradient ---------------------------------------------------


def _vocab_embedding_types(c: TypeContext):
    table = tensor(c, 0, "table")
    ids = _int_operand(c, 1, "ids")
    rows = _int_operand(c, 2, "rows", rank=1)
    if table.rank != 2 or rows.shape[0] != table.shape[0]:
        raise TypeRuleError(
            f"the table must be (rows, hidden) with one id per row in rows; got table "
            f"{table.shape} and rows {rows.shape}"
        )
    return [table.with_shape((*ids.shape, table.shape[1]))]


def _vocab_embedding(xs, a):
    table, ids, rows = xs
    hit = _match(ids, rows)
    if hit is None:
        return [np.tensordot(_onehot(ids, rows, table.dtype), table, axes=1).astype(table.dtype)]
    pos, found = hit
    return [np.where(found[..., None], np.take(table, pos, axis=0), 0).astype(table.dtype)]


def _vocab_embedding_grad_types(c: TypeContext):
    ids = _int_operand(c, 0, "ids")
    dy = tensor(c, 1, "dy")
    rows = _int_operand(c, 2, "rows", rank=1)
    if not dy.dtype.is_float or dy.shape[:-1] != ids.shape or dy.rank != ids.rank + 1:
        raise TypeRuleError(f"dy has shape {dy.shape}, ids of shape {ids.shape} need (*ids, H)")
    return [dy.with_shape((rows.shape[0], dy.shape[-1]))]


def _vocab_embedding_grad(xs, a):
    ids, dy, rows = xs
    h = dy.shape[-1]
    flat_ids, flat_dy = np.asarray(ids).reshape(-1), dy.reshape(-1, h)
    hit = _match(flat_ids, rows)
    if hit is None:
        out = _onehot(flat_ids, rows, dy.dtype).T @ flat_dy
    else:
        pos, found = hit
        out = np.zeros((len(rows), h), dtype=dy.dtype)
        np.add.at(out, pos[found], flat_dy[found])
    pad = a["padding_idx"]
    if pad is not None:
        out[np.asarray(rows) == pad] = 0
    return [out.astype(dy.dtype)]


_PADDING = Attr(
    "padding_idx",
    None,
    "a vocabulary id whose row gets no gradient (torch's padding_idx)",
    kind=kinds.optional(kinds.NONNEG_INT),
)

register_op(
    OpDef(
        name="VocabEmbedding",
        operands=("table", "ids", "rows"),
        results=("y",),
        type_rule=_vocab_embedding_types,
        kernel=_vocab_embedding,
        cost_rule=lambda c: Cost(
            0.0,
            c.input_types[1].size_bytes
            + c.input_types[2].size_bytes
            + c.output_types[0].size_bytes,
            c.output_types[0].size_bytes,
        ),
        attributes=(_PADDING,),
        doc="Row lookup by vocabulary id: y[...] = table[i] where rows[i] == ids[...], zero "
        "where no row has that id (Megatron-LM's VocabParallelEmbedding on a table shard).",
        extra={
            "weight_operands": (0,),
            "index_operands": (2,),  # the vocabulary ids of the table's rows
            "nondiff_operands": (1, 2),
            "value_ranges": lambda op: {
                1: (0, op.inputs[0].type.shape[0]),
                2: (0, op.inputs[0].type.shape[0]),
            },
            "examples": lambda s: [
                ctx(t(4 * s, 3), t(2 * s, dtype=I64), t(4 * s, dtype=I64)),
                ctx(t(5, 2 * s), t(2, s, dtype=I64), t(5, dtype=I64)),
            ],
        },
    )
)

register_op(
    OpDef(
        name="VocabEmbeddingGrad",
        operands=("ids", "dy", "rows"),
        results=("dtable",),
        type_rule=_vocab_embedding_grad_types,
        kernel=_vocab_embedding_grad,
        cost_rule=lambda c: Cost(
            c.input_types[1].num_elements,
            sum(x.size_bytes for x in c.input_types),
            c.output_types[0].size_bytes,
        ),
        attributes=(_PADDING,),
        doc="Gradient of VocabEmbedding: dy's rows added into a zero table at the rows whose "
        "vocabulary id they looked up.",
        extra={
            "index_operands": (2,),
            "value_ranges": lambda op: {0: (0, op.inputs[2].type.shape[0])},
            "examples": lambda s: [
                ctx(t(2 * s, dtype=I64), t(2 * s, 3), t(4 * s, dtype=I64)),
                ctx(t(2, s, dtype=I64), t(2, s, 2 * s), t(5, dtype=I64), padding_idx=1),
            ],
        },
    )
)

# -- sharding rules --------------------------------------------------------------------
# The vocabulary factor ("v" of a table's rows) names the index operand's axis too: a
# shard of the ids goes with the shard of the table.


def _vocab_embedding_sharding(c: TypeContext) -> dict:
    lead = fx.axes(c.input_types[1].rank)
    return fx.rule([("v", "h"), lead, ("v",)], [(*lead, "h")], reduce={"v": "sum"}, linear=[(0,)])


def _vocab_embedding_grad_sharding(c: TypeContext) -> dict:
    lead = fx.axes(c.input_types[0].rank)
    return fx.rule(
        [lead, (*lead, "h"), ("v",)], [("v", "h")], reduce=dict.fromkeys(lead, "sum"), linear=[(1,)]
    )


fx.attach("Arange", lambda c: fx.rule([], [(None,)]))
fx.attach("VocabEmbedding", _vocab_embedding_sharding)
fx.attach("VocabEmbeddingGrad", _vocab_embedding_grad_sharding)


# -- gradient rules (autodiff) ---------------------------------------------------------
# The lookup differentiates like Embedding; the ids, rows and labels get no gradient.


def _vocab_embedding_gradient(b, op, ins, outs, dys):
    from ._grad import gname

    (dy,) = dys
    if dy is None:
        return [None, None, None]
    table, ids, rows = ins
    pad = op.attributes["padding_idx"]
    return [
        b.call("VocabEmbeddingGrad", ids, dy, rows, padding_idx=pad, name=gname(table)),
        None,
        None,
    ]


def _attach_gradient_rules() -> None:
    from ..registry import attach_rule

    attach_rule("VocabEmbedding", "gradient_rule", _vocab_embedding_gradient)


_attach_gradient_rules()
