"""Megatron-LM's vocabulary-parallel arrangement (Shoeybi et al. 2019, section 3): the
rewrite that lets tensor parallelism split the embedding and the cross-entropy.

:func:`vocabulary_form` rewrites every op whose record offers a vocabulary form
(``extra["vocabulary_form"]``: ``Embedding``, ``EmbeddingGrad``, a cross-entropy ``Loss``
and ``LossGrad``) into the ops of ``ir/ops/vocabulary.py``, which name the vocabulary
ids of a table's rows and of the logits' classes with an ``Arange``. The rewritten
program computes the same values on one device. Under tensor parallelism over ``tp``
ranks (:func:`ir.transforms.megatron`) the sharding rules then split it as Megatron-LM
does, with no op special-cased by the transform:

* the token embedding ``wte (V, H)`` by rows: each rank holds ``V / tp`` rows, looks up
  the tokens it holds, zeros the others, and one all-reduce over the tensor group sums
  the lookups (``VocabParallelEmbedding``); its gradient is made on the rank's rows;
* the output head by columns (column-parallel, as any first MatMul of a pair): each
  rank makes the logits of its ``V / tp`` classes and never gathers them;
* the cross-entropy in parts: each row's largest logit all-reduced with ``max``,
  ``sum(exp(y - max))`` and the label's logit (picked on the rank that holds it, zero on
  the others) all-reduced with ``sum``; the gradient of the logits is made on each rank
  from those row statistics. The whole ``(batch, seq, V)`` logits exist on no rank.

A logits *output* of the program (``ir.models.gpt`` returns its logits) stays split
over the tensor ranks (layout ``S(k)@tp``): gathering it would undo the point.
"""

from __future__ import annotations

from collections.abc import Set

from ..builder import FunctionBuilder, rebuild_op
from ..function import Function
from ..registry import get_op
from ..value import Value
from ..verify import verify
from ._rewrite import TransformError

__all__ = ["vocabulary_form"]


def _form(op):
    return get_op(op.op_type).extra.get("vocabulary_form")


def vocabulary_form(t: Function, tp: int = 1, keep: Set[str] = frozenset()) -> Function:
    """``t`` with its embeddings and cross-entropies in their vocabulary-parallel forms
    (see the module docstring); equal to ``t`` when executed.

    With ``tp > 1`` every embedding table's rows must divide by ``tp`` (a
    :class:`TransformError` says which does not; Megatron-LM pads the vocabulary to a
    multiple of ``tp``, ``--make-vocab-size-divisible-by``); a cross-entropy whose class
    count does not divide by ``tp`` is left whole (its head then stays whole too), as is
    one of logits named in ``keep`` (:func:`ir.transforms.megatron` passes those its plan
    does not split: an MLP's head after a row-parallel layer).

    >>> import ir
    >>> from ir.transforms import training
    >>> t = training(ir.models.gpt(2, 4, 8, 2, 16, 1))
    >>> new = {op.op_type for op in vocabulary_form(t, 2).ops} - {op.op_type for op in t.ops}
    >>> sorted(new)[:4], len(new)
    (['Arange', 'ClassMax', 'ClassPick', 'ClassSumExp'], 8)
    """
    b = FunctionBuilder(t.name)
    env: dict[Value, Value] = {v: b.input(v.name, v.type) for v in t.inputs}
    stats: dict[Value, tuple[Value, Value]] = {}
    for op in t.ops:
        ins = [env[v] for v in op.inputs]
        form = _form(op)
        outs = None
        kept = "vocabulary_classes" in get_op(op.op_type).extra and op.inputs[0].name in keep
        if form is not None and not kept and _divides(op, tp):
            outs = form(b, op, ins, stats)
        if outs is None:
            outs = rebuild_op(b, op, ins)
        env.update(zip(op.outputs, outs))
    return verify(b.finish([env[v] for v in t.outputs]))


def _divides(op, tp: int) -> bool:
    """The op's vocabulary splits evenly over ``tp`` ranks (its record says how large it
    is: a table's ``vocabulary_rows``, which must split, or a cross-entropy's
    ``vocabulary_classes``, which stays whole when they do not)."""
    extra = get_op(op.op_type).extra
    if "vocabulary_rows" not in extra:
        return extra["vocabulary_classes"](op) % tp == 0
    rows = extra["vocabulary_rows"](op)
    if rows % tp:
        raise TransformError(
            f"tensor level: the vocabulary of {rows} rows ({op.op_type} making "
            f"{op.outputs[0].name!r}) does not split over tp={tp} ranks; pad it to a multiple "
            f"of {tp} as Megatron-LM does (--make-vocab-size-divisible-by), or pass "
            "vocab_parallel=False to keep the embedding and head whole on every rank"
        )
    return True
