"""Values made from no batch input but broadcast to the batch, split per microbatch.

A ViT's class token (a ``(1, 1, H)`` weight broadcast to the batch and concatenated
with the patches) and RoBERTa's token type ids (a ``(1, S)`` buffer broadcast to the
batch and gathered at the positions) are whole-batch values made from no batch input.
Data parallelism sliced them; the pipeline and 3D transforms refused them ("slicing them
per microbatch is not supported yet"). The data plan now recognises the broadcast and
builds it split (``data_parallel.batch_broadcasts``): each device, each microbatch,
broadcasts to its own rows, as torch does when it runs a piece of the batch. A
whole-batch value that is no broadcast (a constant of the batch's rows) is split into
the microbatches' pieces by ``pipeline_parallel``; ``megatron`` refuses it by name.
Proven by execution in float64.
"""

from __future__ import annotations

import numpy as np
import pytest

import ir
from ir.transforms.data_parallel import data_plan, sliced

T = ir.transforms

F64 = ir.DType.float64
BATCH, PATCHES, HIDDEN = 8, 3, 4


def class_token() -> ir.Function:
    """A ViT in miniature: patches projected, a class token prepended, two layers."""
    b = ir.FunctionBuilder("vit")
    cls = b.input("cls", ir.TensorType((1, 1, HIDDEN), F64, 0))
    w0 = b.input("w0", ir.TensorType((5, HIDDEN), F64, 0))
    w1 = b.input("w1", ir.TensorType((HIDDEN, HIDDEN), F64, 0))
    w2 = b.input("w2", ir.TensorType((HIDDEN, 2), F64, 0))
    x = b.input("x", ir.TensorType((BATCH, PATCHES, 5), F64, 0))
    patches = b.call("MatMul", x, w0, name="patches")
    tokens = b.call("BroadcastTo", cls, shape=(BATCH, 1, HIDDEN), name="expand")
    h = b.call("Concat", tokens, patches, dim=1, name="cat")
    h = b.call("Tanh", b.call("MatMul", h, w1, name="h1"), name="a1")
    return b.finish(b.call("MatMul", h, w2, name="y"))


def token_types() -> ir.Function:
    """RoBERTa's token types: a buffer broadcast to the batch, gathered at positions
    computed from the ids, looked up in a table."""
    b = ir.FunctionBuilder("roberta")
    types = b.input("types", ir.TensorType((1, 6), ir.DType.int64, 0))
    table = b.input("table", ir.TensorType((2, HIDDEN), F64, 0))
    emb = b.input("emb", ir.TensorType((10, HIDDEN), F64, 0))
    w = b.input("w", ir.TensorType((HIDDEN, 3), F64, 0))
    ids = b.input("ids", ir.TensorType((BATCH, 6), ir.DType.int64, 0))
    four = b.call("Constant", value=4, dtype="int64", device=0)
    below = b.call("Compare", ids, four, kind="lt")
    positions = b.call("Cast", below, dtype="int64", name="positions")
    expanded = b.call("BroadcastTo", types, shape=(BATCH, 6), name="expand")
    picked = b.call("TakeAlongAxis", expanded, positions, axis=1, name="gather")
    h = b.call("Add", b.call("Embedding", emb, ids), b.call("Embedding", table, picked), name="h")
    h = b.call("Tanh", h, name="a")
    return b.finish(b.call("MatMul", h, w, name="y"))


def _step(f: ir.Function, params: list[str] | None = None) -> ir.Function:
    return T.training(ir.models.with_loss(f, kind="mse"), params=params)


def _assert_equal(g: ir.Function, t: ir.Function) -> None:
    xs = ir.random_inputs(t, 5)
    for i, v in enumerate(t.inputs):
        if v.name == "types":  # RoBERTa's buffer: a row of token types, 0 or 1
            xs[i] = np.array([[0, 1, 0, 1, 1, 0]])
    want = ir.execute(t, xs)
    got = ir.execute_step(g, xs, source=t)
    assert len(got) == len(want)
    for v, a, w in zip(t.outputs, got, want, strict=True):
        np.testing.assert_allclose(a, w, rtol=1e-12, atol=1e-14, err_msg=v.name)


BUILDS = {
    "data_parallel": lambda t: T.data_parallel(t, 2),
    "pipeline_parallel": lambda t: T.pipeline_parallel(t, 2, 2),
    "pipeline_1f1b": lambda t: T.pipeline_parallel(t, 2, 4, "1f1b"),
    "megatron_dp2": lambda t: T.megatron(t, 2, 1, 1, 1),
    "megatron_pp2": lambda t: T.megatron(t, 1, 1, 2, 2),
    "megatron_dp2_pp2": lambda t: T.megatron(t, 2, 1, 2, 2),
}


@pytest.mark.parametrize("model", [class_token, token_types], ids=["class_token", "token_types"])
@pytest.mark.parametrize("how", list(BUILDS))
def test_a_broadcast_to_the_batch_is_built_per_microbatch(model, how: str) -> None:
    t = _step(model())
    _assert_equal(BUILDS[how](t), t)


@pytest.mark.parametrize("model", [class_token, token_types], ids=["class_token", "token_types"])
def test_the_data_plan_builds_the_broadcast_split_and_slices_nothing(model) -> None:
    f = model()
    plan = data_plan(f, 2)
    expand = next(op for op in f.ops if op.op_type == "BroadcastTo")
    assert plan.born == {expand: ir.transforms._spmd.S(0)}
    assert sliced(plan) == []
    local = next(op for op in plan.local.step_ops.values() if op.op_type == "BroadcastTo")
    assert local.outputs[0].type.shape[0] == BATCH // 2  # each device broadcasts to its rows


def _broadcasts_in(g: ir.Function) -> list[ir.Op]:
    found = []
    for op in g.ops:
        if op.op_type == "BroadcastTo":
            found.append(op)
        for body in op.subfunctions:
            found += _broadcasts_in(body)
    return found


@pytest.mark.parametrize("how", ["pipeline_parallel", "megatron_pp2", "megatron_dp2_pp2"])
def test_each_microbatch_broadcasts_the_class_token_to_its_own_rows(how: str) -> None:
    t = _step(class_token())
    g = BUILDS[how](t)
    pieces = BATCH // 2 // (2 if "dp2" in how else 1)  # microbatches of 4, replicas of 2
    tokens = [op for op in _broadcasts_in(g) if op.inputs[0].type.shape == (1, 1, HIDDEN)]
    assert tokens
    assert {op.outputs[0].type.shape for op in tokens} == {(pieces, 1, HIDDEN)}
    assert not any(op.op_type == "Split" and op.inputs[0].name.startswith("expand") for op in g.ops)


def merged_constant() -> ir.Function:
    """A whole-batch constant that is no broadcast: a bias of ``batch * heads`` rows (BLOOM's
    ALiBi as a folded constant), added to scores whose batch is merged with the heads."""
    b = ir.FunctionBuilder("merged")
    w = b.input("w", ir.TensorType((4, 4), F64, 0))
    x = b.input("x", ir.TensorType((BATCH, 2, 4), F64, 0))
    bias = b.input("bias", ir.TensorType((BATCH * 2, 4), F64, 0))
    h = b.call("Reshape", b.call("MatMul", x, w, name="h"), shape=(BATCH * 2, 4), name="merged")
    y = b.call("Add", h, bias, name="biased")
    return b.finish(b.call("Reshape", y, shape=(BATCH, 2, 4), name="y"))


def test_a_whole_batch_constant_is_cut_into_the_microbatches_pieces_by_the_pipeline() -> None:
    t = _step(merged_constant(), params=["w"])  # the bias is a constant: not trained
    plan = data_plan(t, 2)
    assert [v.name for v in sliced(plan)] == ["bias"]  # sliced where it meets the batch
    _assert_equal(T.pipeline_parallel(t, 1, 2), t)
    _assert_equal(T.data_parallel(t, 2), t)


def test_megatron_names_a_whole_batch_constant_it_cannot_cut() -> None:
    t = _step(merged_constant(), params=["w"])
    with pytest.raises(T.TransformError, match=r"\['bias'\] are whole-batch values"):
        T.megatron(t, 2, 1, 1, 1)
