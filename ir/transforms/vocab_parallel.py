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

__all__ = ["undivided_vocabulary", "vocabulary_form", "vocabulary_rewrites"]


def _form(op):
    return get_op(op.op_type).extra.get("vocabulary_form")


def vocabulary_form(t: Function, tp: int = 1, keep: Set[str] = frozenset()) -> Function:
    """``t`` with its embeddings and cross-entropies in their vocabulary-parallel forms
    (see the module docstring); equal to ``t`` when executed.

    A vocabulary (an embedding table's rows, a cross-entropy's classes) that does not
    divide by ``tp`` is left whole, as is a cross-entropy of logits named in ``keep``
    (:func:`ir.transforms.megatron` passes those its plan does not split: an MLP's head
    after a row-parallel layer). :func:`undivided_vocabulary` says which tables stay
    whole; ``megatron`` refuses them unless told to replicate. With nothing to rewrite
    the form is ``t`` itself.

    >>> import ir
    >>> from ir.transforms import training
    >>> t = training(ir.models.gpt(2, 4, 8, 2, 16, 1))
    >>> new = {op.op_type for op in vocabulary_form(t, 2).ops} - {op.op_type for op in t.ops}
    >>> sorted(new)[:4], len(new)
    (['Arange', 'ClassMax', 'ClassPick', 'ClassSumExp'], 8)
    """
    rewritten = set(vocabulary_rewrites(t, tp, keep))
    if not rewritten:
        return t
    b = FunctionBuilder(t.name)
    env: dict[Value, Value] = {v: b.input(v.name, v.type) for v in t.inputs}
    stats: dict[Value, tuple[Value, Value]] = {}
    for i, op in enumerate(t.ops):
        ins = [env[v] for v in op.inputs]
        outs = _form(op)(b, op, ins, stats) if i in rewritten else None
        if outs is None:
            outs = rebuild_op(b, op, ins)
        env.update(zip(op.outputs, outs))
    return verify(b.finish([env[v] for v in t.outputs]))


def vocabulary_rewrites(t: Function, tp: int = 1, keep: Set[str] = frozenset()) -> tuple[int, ...]:
    """The positions in ``t.ops`` of the ops :func:`vocabulary_form` rewrites (for ``tp``,
    keeping the cross-entropies of ``keep`` whole): the form depends on them alone, so
    tensor degrees that rewrite the same ops have the same form (none: ``t`` itself)."""
    found = []
    for i, op in enumerate(t.ops):
        if _form(op) is None:
            continue
        kept = "vocabulary_classes" in get_op(op.op_type).extra and op.inputs[0].name in keep
        if not kept and _size(op) % tp == 0:
            found.append(i)
    return tuple(found)


def _size(op) -> int:
    """The op's vocabulary, as its record says: a table's ``vocabulary_rows`` or a
    cross-entropy's ``vocabulary_classes``."""
    extra = get_op(op.op_type).extra
    return (extra.get("vocabulary_rows") or extra["vocabulary_classes"])(op)


def undivided_vocabulary(t: Function, tp: int) -> str | None:
    """Why :func:`vocabulary_form` leaves an embedding table of ``t`` whole over ``tp``
    tensor ranks (its rows do not divide by ``tp``), or None."""
    for op in t.ops:
        extra = get_op(op.op_type).extra
        if "vocabulary_rows" in extra and (rows := extra["vocabulary_rows"](op)) % tp:
            return (
                f"tensor level: the vocabulary of {rows} rows ({op.op_type} making "
                f"{op.outputs[0].name!r}) does not split over tp={tp} ranks, so each rank "
                "would hold the whole embedding and head and repeat their work; pad it to a "
                f"multiple of {tp} as Megatron-LM does (--make-vocab-size-divisible-by), or "
                "pass allow_replication=True (or vocab_parallel=False) to keep them whole on "
                "every rank"
            )
    return None
