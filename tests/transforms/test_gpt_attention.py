"""``ir.models.gpt`` with the fused ``Attention`` op (the default) and the unfused teaching
form: the same forward and training step (numpy float64, and torch), grouped-query
attention, every parallel transform executing equal to the sequential step, the SPMD
engine splitting both forms by heads alike, and the memory the fused form saves."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from _gradcheck import check_gradients, float64_inputs

import ir
from ir import models, transforms
from ir.registry import OpKind, get_op

F64 = ir.DType.float64


def _gpt(attention: str, kv_heads: int | None = None, **sizes) -> ir.Function:
    # 14 words: the vocabulary splits over 2 tensor ranks (Megatron-LM's vocabulary split)
    shape = {"batch": 4, "seq": 6, "hidden": 16, "heads": 4, "vocab": 14, "layers": 2}
    shape.update(sizes)
    return models.gpt(**shape, dtype=F64, attention=attention, kv_heads=kv_heads)


def _inputs(t: ir.Function, seed: int = 0) -> list[np.ndarray]:
    # Adam's second moments are non-negative (random ones would make NaN updates)
    return [
        np.abs(x) if v.name.startswith("v_") else x
        for v, x in zip(t.inputs, ir.random_inputs(t, seed))
    ]


def _assert_step_equal(t: ir.Function, g: ir.Function, seed: int = 0) -> None:
    """``g`` given ``t``'s inputs laid out computes ``t``'s outputs."""
    xs = _inputs(t, seed)
    want = ir.execute(t, xs)
    got = ir.collect(g, ir.execute(g, ir.distribute(g, xs, source=t)), rtol=1e-9)
    assert len(got) == len(want)
    for v, w, o in zip(t.outputs, want, got):
        np.testing.assert_allclose(o, w, rtol=1e-7, atol=1e-10, err_msg=v.name)


@pytest.mark.parametrize("kv_heads", [None, 2, 1], ids=["mha", "gqa", "mqa"])
def test_fused_forward_and_adam_step_equal_the_unfused(kv_heads):
    fused, unfused = _gpt("fused", kv_heads), _gpt("unfused", kv_heads)
    assert [v.type for v in fused.inputs] == [v.type for v in unfused.inputs]
    ops = Counter(op.op_type for op in fused.ops)
    assert ops["Attention"] == 2 and not {"Softmax", "CausalMask", "Scale"} & set(ops)
    for f, u in ((fused, unfused), (transforms.training(fused, "adam"), None)):
        u = u or transforms.training(unfused, "adam")
        xs = _inputs(f, seed=3)
        for v, a, b in zip(f.outputs, ir.execute(f, xs), ir.execute(u, xs), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13, err_msg=v.name)


@pytest.mark.parametrize("kv_heads", [None, 2], ids=["mha", "gqa"])
def test_fused_gradients_match_finite_differences(kv_heads):
    f = _gpt("fused", kv_heads, batch=2, seq=4, hidden=8, heads=2 * (kv_heads or 1), layers=1)
    check_gradients(f, float64_inputs(f, seed=1, classes=13), elementwise=False)


def _torch_gpt(torch, w: dict, tokens, labels, heads: int, kv_heads: int, layers: int):
    """The GPT ``ir.models.gpt`` builds, written with torch's scaled_dot_product_attention."""
    fn = torch.nn.functional
    b, s = tokens.shape
    h = w["wte"][tokens] + w["wpe"]
    hidden = h.shape[-1]
    dh = hidden // heads

    def norm(x, p):
        return fn.layer_norm(x, (hidden,), w[f"{p}_g"], w[f"{p}_b"], eps=1e-5)

    def split(x, n):
        return x.reshape(b, s, n, dh).transpose(1, 2)

    for i in range(layers):
        p = f"h{i}"
        xn = norm(h, f"{p}_ln1")
        q = split(xn @ w[f"{p}_attn_wq"], heads)
        k = split(xn @ w[f"{p}_attn_wk"], kv_heads)
        v = split(xn @ w[f"{p}_attn_wv"], kv_heads)
        o = fn.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        h = h + o.transpose(1, 2).reshape(b, s, hidden) @ w[f"{p}_attn_wo"]
        xn = norm(h, f"{p}_ln2")
        h = h + fn.gelu(xn @ w[f"{p}_mlp_w1"], approximate="tanh") @ w[f"{p}_mlp_w2"]
    logits = norm(h, "lnf") @ w["w_head"]
    return logits, fn.cross_entropy(logits.reshape(b * s, -1), labels.reshape(-1))


@pytest.mark.parametrize("kv_heads", [None, 2], ids=["mha", "gqa"])
def test_fused_forward_and_gradients_equal_torch(kv_heads):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    f = _gpt("fused", kv_heads)
    args = float64_inputs(f, seed=2, classes=13)
    g = transforms.gradients(f)
    out = ir.execute(g, args)
    params = transforms.default_params(f)
    w = {p.name: torch.tensor(args[p.name], requires_grad=True) for p in params}
    tokens, labels = (torch.tensor(args[n]) for n in ("tokens", "labels"))
    logits, loss = _torch_gpt(torch, w, tokens, labels, 4, kv_heads or 4, 2)
    loss.backward()
    np.testing.assert_allclose(out[0], logits.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(out[1], loss.item(), rtol=1e-12)
    for p, dp in zip(params, out[len(f.outputs) :], strict=True):
        np.testing.assert_allclose(dp, w[p.name].grad.numpy(), rtol=1e-8, atol=1e-12)


def _communication(g: ir.Function) -> Counter:
    return Counter(op.op_type for op in g.ops if get_op(op.op_type).kind is OpKind.COMMUNICATION)


def _local_ops(g: ir.Function, op_type: str) -> list[ir.Op]:
    return [o for op in g.ops for body in op.subfunctions for o in body.ops if o.op_type == op_type]


@pytest.mark.parametrize("kv_heads", [None, 2], ids=["mha", "gqa"])
def test_tensor_parallelism_splits_both_forms_by_heads_alike(kv_heads):
    fused = transforms.training(_gpt("fused", kv_heads))
    unfused = transforms.training(_gpt("unfused", kv_heads))
    g, u = transforms.horizontal_parallel(fused, 2), transforms.horizontal_parallel(unfused, 2)
    assert _communication(g) == _communication(u) == Counter({"AllReduce": 8})
    assert g.input_layouts == u.input_layouts  # wq, wk, wv by columns, wo by rows, ...
    (att, *_), (probs, *_) = _local_ops(g, "Attention"), _local_ops(u, "Softmax")
    q, k, _ = (v.type.shape for v in att.inputs)
    assert q == (4, 2, 6, 4) and k == (4, (kv_heads or 4) // 2, 6, 4)  # half the heads each
    assert probs.inputs[0].type.shape == (4, 2, 6, 6)
    _assert_step_equal(fused, g)


def test_mqa_splits_the_query_heads_and_keeps_the_kv_head_whole():
    t = transforms.training(_gpt("fused", 1))
    g = transforms.horizontal_parallel(t, 2)
    (att, *_) = _local_ops(g, "Attention")
    assert [v.type.shape[1] for v in att.inputs] == [2, 1, 1]
    _assert_step_equal(t, g)


def test_every_parallel_transform_of_the_fused_gpt_equals_the_sequential_step():
    t = transforms.training(_gpt("fused", 2), "adam")
    for g in (
        transforms.data_parallel(t, 2),
        transforms.horizontal_parallel(t, 2),
        transforms.pipeline_parallel(t, 2, 2, "1f1b"),
        transforms.megatron(t, 2, 2, 2, 2, "1f1b"),
        transforms.megatron(t, 1, 2, 1, sequence_parallel=True),
    ):
        _assert_step_equal(t, g)


@pytest.mark.parametrize("attention", ["fused", "unfused"])
def test_per_layer_recomputation_keeps_the_step(attention):
    t = transforms.training(_gpt(attention, 2))
    chosen = models.gpt_layer_activations(t)
    assert {v.name for v in chosen} >= {"h0_ctx", "h1_ctx", "h0_q_h"}
    r = transforms.recompute(t, chosen)
    assert sum(op.op_type in ("Attention", "Softmax") for op in r.ops) == 4  # each layer twice
    xs = _inputs(t)
    for a, b in zip(ir.execute(t, xs), ir.execute(r, xs), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-13)
    _assert_step_equal(t, transforms.megatron(r, 2, 2, 1, 1))


def test_the_fused_step_keeps_no_scores_and_peaks_lower():
    """No (batch, heads, seq, seq) value exists in the fused step; the unfused step keeps
    each layer's probabilities for its backward, and peaks at least that much higher."""
    b, s, heads, layers = 2, 128, 4, 2

    def step(attention):
        f = models.gpt(b, s, 32, heads, 64, layers, attention=attention)
        return transforms.training(f)

    def scores(t):
        return [v.name for op in t.ops for v in op.outputs if v.type.shape == (b, heads, s, s)]

    fused, unfused = step("fused"), step("unfused")
    assert scores(fused) == [] and "h0_probs" in scores(unfused)
    topology = ir.Topology.uniform(1)
    peak_fused = ir.simulate(fused, topology).peak_memory_bytes[0]
    peak_unfused = ir.simulate(unfused, topology).peak_memory_bytes[0]
    probs_bytes = b * heads * s * s * 4  # float32
    assert peak_unfused - peak_fused >= layers * probs_bytes


def test_bad_attention_options_are_refused():
    with pytest.raises(models.ModelError, match="attention must be one of"):
        models.gpt(2, 4, 8, 2, 7, 1, attention="flash")
    with pytest.raises(models.ModelError, match="heads 4 is not a multiple of kv_heads 3"):
        models.gpt(2, 4, 8, 4, 7, 1, kv_heads=3)
    with pytest.raises(models.ModelError, match="kv_heads must be a positive integer"):
        models.gpt(2, 4, 8, 4, 7, 1, kv_heads=0)
