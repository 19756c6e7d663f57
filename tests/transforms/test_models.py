"""ir.models: the MLP and the GPT as forward and training programs, gradients checked."""

from __future__ import annotations

import numpy as np
import pytest
from _gradcheck import check_gradients, float64_inputs
from hypothesis import given, settings
from hypothesis import strategies as st

import ir
import ir.models
import ir.transforms
from ir.models import ModelError

F64 = ir.DType.float64


def test_mlp_layers_names_and_shapes():
    f = ir.models.mlp(8, 4, 6, 3, layers=3)
    assert [(v.name, v.type.shape) for v in f.inputs] == [
        ("wA", (4, 6)),
        ("wB", (6, 6)),
        ("wC", (6, 3)),
        ("x", (8, 4)),
        ("z", (8,)),
    ]
    assert [op.op_type for op in f.ops] == ["MatMul", "Relu", "MatMul", "Relu", "MatMul", "Loss"]
    assert f.devices == (0,)
    t = ir.models.mlp(8, 4, 6, 3, layers=3, training=True)
    assert [v.name for v in t.outputs] == ["wA1", "wB1", "wC1", "y", "l"]


def test_gpt_structure():
    f = ir.models.gpt(batch=2, seq=4, hidden=8, heads=2, vocab=11, layers=2)
    names = [v.name for v in f.inputs]
    assert names[:2] == ["wte", "wpe"] and names[-2:] == ["tokens", "labels"]
    assert "h1_attn_wq" in names and "h0_mlp_w2" in names
    assert f.value("h0_mlp_w1").type.shape == (8, 32)
    assert f.outputs[0].type.shape == (2, 4, 11)
    assert f.devices == (0,)
    kinds = {op.op_type for op in f.ops}
    assert {"Embedding", "LayerNorm", "Attention", "Gelu"} <= kinds  # fused by default
    assert not {"Softmax", "CausalMask", "Scale"} & kinds
    u = ir.models.gpt(batch=2, seq=4, hidden=8, heads=2, vocab=11, layers=2, attention="unfused")
    kinds = {op.op_type for op in u.ops}
    assert {"Softmax", "CausalMask", "Scale"} <= kinds and "Attention" not in kinds
    assert u.value("h0_probs").type.shape == (2, 2, 4, 4)  # the (B, heads, S, S) tensor
    assert [v.name for v in u.inputs] == names
    assert [p.name for p in ir.transforms.default_params(f)] == names[:-2]
    t = ir.models.gpt(batch=2, seq=4, hidden=8, heads=2, vocab=11, layers=2, training=True)
    assert [v.name for v in t.outputs] == [f"{n}1" for n in names[:-2]] + ["logits", "l"]


def test_gpt_heads_are_contiguous_column_blocks_of_wq():
    """Zeroing head 1's column block of wq/wk/wv leaves head 0's attention output unchanged."""
    f = ir.models.gpt(batch=1, seq=3, hidden=8, heads=2, vocab=5, layers=1, dtype=F64)
    probe = ir.FunctionBuilder("probe")
    env = {v: probe.input(v.name, v.type) for v in f.inputs}
    for op in f.ops:
        outs = ir.builder.rebuild_op(probe, op, [env[v] for v in op.inputs])
        env.update(zip(op.outputs, outs))
    g = probe.finish([env[f.value("h0_ctx")]])  # (B, heads, S, dh)
    args = float64_inputs(f, seed=2, classes=5)
    base = ir.execute(g, args)[0]
    changed = dict(args)
    for w in ("h0_attn_wq", "h0_attn_wk", "h0_attn_wv"):
        changed[w] = args[w].copy()
        changed[w][:, 4:] = 0.0
    out = ir.execute(g, changed)[0]
    np.testing.assert_allclose(out[:, 0], base[:, 0])
    assert not np.allclose(out[:, 1], base[:, 1])


def test_gpt_gradients_match_finite_differences():
    f = ir.models.gpt(batch=2, seq=4, hidden=8, heads=2, vocab=7, layers=2, dtype=F64)
    args = float64_inputs(f, seed=0, classes=7)
    checked = check_gradients(f, args, elementwise=False)
    assert len(checked) == 2 + 10 * 2 + 3  # wte, wpe; 10 per block; lnf, head


def test_gpt_small_gradients_elementwise():
    f = ir.models.gpt(batch=1, seq=3, hidden=4, heads=2, vocab=5, layers=1, dtype=F64)
    check_gradients(f, float64_inputs(f, seed=4, classes=5))


def test_gpt_training_sgd_step():
    f = ir.models.gpt(batch=2, seq=3, hidden=4, heads=2, vocab=5, layers=1, dtype=F64)
    t = ir.transforms.training(f, lr=0.5, return_gradients=True)
    args = float64_inputs(f, seed=5, classes=5)
    out = ir.execute(t, args)
    params = ir.transforms.default_params(f)
    n = len(params)
    updated, forward, grads = out[:n], out[n : n + 2], out[n + 2 :]
    np.testing.assert_allclose(forward[1], ir.execute(f, args)[1])
    for p, w1, g in zip(params, updated, grads):
        np.testing.assert_allclose(w1, args[p.name] - 0.5 * g)
    # one step of gradient descent with a small rate lowers the loss
    small = ir.transforms.training(f, lr=1e-3)
    stepped = dict(args)
    stepped.update({p.name: w for p, w in zip(params, ir.execute(small, args)[:n])})
    assert ir.execute(f, stepped)[1] < forward[1]


def test_model_errors():
    with pytest.raises(ModelError, match="hidden 10 is not divisible by heads 3"):
        ir.models.gpt(2, 4, 10, 3, 7, 1)
    with pytest.raises(ModelError, match="layers must be a positive integer"):
        ir.models.mlp(2, 3, 4, 5, layers=0)
    with pytest.raises(ModelError, match="activation"):
        ir.models.mlp(2, 3, 4, 5, activation="swish")


@pytest.mark.parametrize("model", ["mlp", "gpt"])
@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_programs_print_and_parse_back(model, optimizer):
    f = ir.models.mlp(8, 4, 6, 4, layers=3) if model == "mlp" else ir.models.gpt(2, 4, 8, 2, 7, 1)
    t = ir.transforms.training(f, optimizer)
    for program in (f, t, ir.transforms.recompute(t)):
        assert ir.parse(str(program)).is_equivalent(program)


@settings(max_examples=12, deadline=None)
@given(
    batch=st.integers(1, 4),
    seq=st.integers(1, 4),
    heads=st.integers(1, 3),
    head_dim=st.integers(1, 3),
    vocab=st.integers(2, 6),
    layers=st.integers(1, 2),
    seed=st.integers(0, 2**16),
)
def test_gpt_gradients_over_drawn_shapes(batch, seq, heads, head_dim, vocab, layers, seed):
    f = ir.models.gpt(batch, seq, heads * head_dim, heads, vocab, layers, dtype=F64)
    check_gradients(f, float64_inputs(f, seed=seed, classes=vocab), elementwise=False, seed=seed)


@settings(max_examples=15, deadline=None)
@given(
    batch=st.integers(1, 6),
    features=st.integers(1, 5),
    hidden=st.integers(1, 6),
    classes=st.integers(2, 5),
    layers=st.integers(1, 4),
    activation=st.sampled_from([None, "relu", "gelu", "tanh"]),
    seed=st.integers(0, 2**16),
)
def test_mlp_gradients_drawn(batch, features, hidden, classes, layers, activation, seed):
    f = ir.models.mlp(batch, features, hidden, classes, layers, activation=activation, dtype=F64)
    args = float64_inputs(f, seed=seed, classes=classes)
    check_gradients(f, args, elementwise=False, seed=seed)
