"""Clean-ups of an imported program that make it look like a hand-written one.

torch lowers a batched ``matmul`` of ``(B, H, M, K)`` and ``(B, H, K, N)`` tensors
to ``bmm``: both operands are reshaped to ``(B * H, M, K)`` and ``(B * H, K, N)``,
multiplied, and the product reshaped back to ``(B, H, M, N)``. Merging the batch
axis with the heads hides the heads from the parallelising transforms (a split by
heads is not a contiguous split of ``B * H``: tensor parallelism had to all-gather
around every attention), so :func:`fold_batched_matmuls` gives the registry's
``MatMul`` the four-dimensional operands directly, as the built-in GPT writes it.
"""

from __future__ import annotations

from ..builder import FunctionBuilder, rebuild_op
from ..function import Function
from ..op import Op
from ..types import TensorType
from ..value import Value
from ..verify import verify


def _merged_source(op: Op | None, rank: int) -> Value | None:
    """The operand of ``op`` if ``op`` is a Reshape that only merges leading axes into one
    of a rank-``rank`` result (the last two axes kept)."""
    if op is None or op.op_type != "Reshape":
        return None
    src, out = op.inputs[0], op.outputs[0]
    if not isinstance(src.type, TensorType) or src.type.rank <= rank:
        return None
    if src.type.shape[-2:] != out.type.shape[-2:]:
        return None
    return src


def _foldable(f: Function, op: Op) -> tuple[Value, Value, list[Op]] | None:
    """``(a, b, unmerges)`` when ``op`` is a MatMul of two merged-batch reshapes of
    ``a`` and ``b`` (same leading axes) whose every reader reshapes it back."""
    if op.op_type != "MatMul" or op.outputs[0].type.rank != 3:
        return None
    producers, consumers = f.producers, f.consumers
    a = _merged_source(producers.get(op.inputs[0]), 3)
    b = _merged_source(producers.get(op.inputs[1]), 3)
    if a is None or b is None or a.type.shape[:-2] != b.type.shape[:-2]:
        return None
    lead = a.type.shape[:-2]
    want = (*lead, *op.outputs[0].type.shape[-2:])
    readers = consumers.get(op.outputs[0], [])
    if op.outputs[0] in f.outputs or not readers:
        return None
    if not all(r.op_type == "Reshape" and r.outputs[0].type.shape == want for r in readers):
        return None
    return a, b, readers


def fold_batched_matmuls(f: Function) -> Function:
    """``f`` with every ``Reshape -> MatMul -> Reshape`` that merges and splits leading
    axes again replaced by one batched ``MatMul``; returns ``f`` itself when none is."""
    folds = {op: hit for op in f.ops if (hit := _foldable(f, op)) is not None}
    if not folds:
        return f
    # values that the folded program reads no more (the merging reshapes, the 3-d products)
    replaced: dict[Value, Op] = {}
    for op, (_, _, readers) in folds.items():
        for r in readers:
            replaced[r.outputs[0]] = op
    live = set(f.outputs)
    kept: list[Op] = []
    for op in reversed(f.ops):
        if op in folds:
            live.update(folds[op][:2])
            kept.append(op)
            continue
        if op.outputs[0] in replaced:
            continue  # becomes the folded MatMul's result
        if any(v in live for v in op.outputs):
            live.update(op.inputs)
            kept.append(op)
    b = FunctionBuilder(f.name)
    env: dict[Value, Value] = {v: b.input(v.name, v.type) for v in f.inputs}
    for op in reversed(kept):
        if op in folds:
            a, w, readers = folds[op]
            new = b.add_op(
                "MatMul", [env[a], env[w]], dict(op.attributes), names=[readers[0].outputs[0].name]
            )
            out = new.outputs[0]
            for r in readers:
                env[r.outputs[0]] = out
            continue
        for x, y in zip(op.outputs, rebuild_op(b, op, [env[v] for v in op.inputs])):
            env[x] = y
    return verify(b.finish([env[v] for v in f.outputs]))


# -- broadcasts that nothing needs -------------------------------------------------------
# torch materialises broadcasts (an ``expand`` of the token type ids to the batch, an
# all-true attention mask of the batch's shape) that the registry's broadcasting ops do
# for free. Such a value is "whole-batch" though it is made from no batch input, which
# the pipeline transforms cannot slice per microbatch; dropping it also saves its bytes.


def _broadcast_source(f: Function, v: Value):
    """``("value", s)`` when ``v`` is ``BroadcastTo(s)``, ``("constant", op)`` when a
    Constant makes it, else None."""
    op = f.producers.get(v)
    if op is None:
        return None
    if op.op_type == "BroadcastTo":
        return ("value", op.inputs[0])
    if op.op_type == "Constant" and op.outputs[0].type.rank:
        return ("constant", op)
    return None


def _needless(f: Function, v: Value, shape: tuple[int, ...]) -> bool:
    """Every reader of ``v`` broadcasts and keeps its result shape with ``shape`` for ``v``."""
    import numpy as np

    from ..registry import get_op

    readers = f.consumers.get(v, [])
    if not readers or v in f.outputs:
        return False
    for r in readers:
        if r.op_type == "Attention" and r.inputs.index(v) == 3:  # its mask broadcasts
            q, k = r.inputs[0].type.shape, r.inputs[1].type.shape
            full = (*q[:3], k[2])
            try:
                if tuple(np.broadcast_shapes(shape, full)) != full:
                    return False
            except ValueError:
                return False
            continue
        if not get_op(r.op_type).extra.get("broadcasting"):
            return False
        shapes = [shape if u is v else u.type.shape for u in r.inputs]
        try:
            if tuple(np.broadcast_shapes(*shapes)) != r.outputs[0].type.shape:
                return False
        except ValueError:
            return False
    return True


def drop_broadcasts(f: Function) -> Function:
    """``f`` without the broadcasts its broadcasting ops make anyway: a ``BroadcastTo``
    read only by such ops (or as an ``Attention``'s mask) is dropped, a uniform
    ``Constant`` becomes a scalar, an ``Embedding`` of broadcast ids looks up the ids once
    and broadcasts the rows, a ``Where`` on a uniform condition is the operand it picks,
    and an ``Attention`` whose mask keeps every key has none."""
    for _ in range(3):  # an Embedding's new broadcast may be dropped on the next pass
        g = _drop_once(f)
        if g is f:
            return f
        f = g
    return f


def _drop_once(f: Function) -> Function:
    dropped: dict[Value, tuple] = {}
    for v in (op.outputs[0] for op in f.ops if len(op.outputs) == 1):
        src = _broadcast_source(f, v)
        if src is None or not isinstance(v.type, TensorType):
            continue
        shape = src[1].type.shape if src[0] == "value" else ()
        if _needless(f, v, shape):
            dropped[v] = src
    lookups = {
        op
        for op in f.ops
        if op.op_type == "Embedding"
        and (src := _broadcast_source(f, op.inputs[1])) is not None
        and src[0] == "value"
    }
    picks = {
        op: op.inputs[1] if src.attributes["value"] else op.inputs[2]
        for op in f.ops
        if op.op_type == "Where"
        and (src := f.producers.get(op.inputs[0])) is not None
        and src.op_type == "Constant"
    }
    unmasked = {  # a mask that keeps every key (all true, or adding 0): no mask
        op
        for op in f.ops
        if op.op_type == "Attention"
        and len(op.inputs) == 4
        and (src := f.producers.get(op.inputs[3])) is not None
        and src.op_type == "Constant"
        and src.attributes["value"] == (True if op.inputs[3].type.dtype.value == "bool" else 0)
    }
    if not dropped and not lookups and not picks and not unmasked:
        return f
    b = FunctionBuilder(f.name)
    env: dict[Value, Value] = {v: b.input(v.name, v.type) for v in f.inputs}
    for op in f.ops:
        out = op.outputs[0] if len(op.outputs) == 1 else None
        if out in dropped:
            kind, src = dropped[out]
            if kind == "value":
                env[out] = env[src]
            else:
                attrs = {**dict(src.attributes), "shape": ()}
                env[out] = b.add_op("Constant", [], attrs, names=[out.name]).outputs[0]
            continue
        if op in picks:
            chosen = env[picks[op]]
            if chosen.type.shape == out.type.shape:
                env[out] = chosen
            else:
                env[out] = b.call("BroadcastTo", chosen, shape=out.type.shape, name=out.name)
            continue
        if op in unmasked:
            operands = [env[v] for v in op.inputs[:3]]
            env[out] = b.add_op("Attention", operands, op.attributes, names=[out.name]).outputs[0]
            continue
        if op in lookups:
            ids = f.producers[op.inputs[1]].inputs[0]
            rows = b.call("Embedding", env[op.inputs[0]], env[ids], **op.attributes, name="rows")
            env[out] = b.call("BroadcastTo", rows, shape=out.type.shape, name=out.name)
            continue
        for x, y in zip(op.outputs, rebuild_op(b, op, [env[v] for v in op.inputs])):
            env[x] = y
    return verify(b.finish([env[v] for v in f.outputs]))


__all__ = ["drop_broadcasts", "fold_batched_matmuls"]
