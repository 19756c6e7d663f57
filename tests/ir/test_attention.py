"""The fused ``Attention`` op: equal to torch's scaled_dot_product_attention and to the
unfused ops, its bottom-right causal diagonal, rows with no key, its errors and its cost."""

from __future__ import annotations

import math

import numpy as np
import pytest

import ir
from ir import DType, TensorType, VerifyError
from ir.ops.attention import AttentionShape, attention_shape, causal_keep
from ir.registry import CostContext

F64 = DType.float64


def run(op_type: str, *arrays: np.ndarray, **attrs) -> list[np.ndarray]:
    b = ir.FunctionBuilder(op_type.lower())
    inputs = [
        b.input(f"x{i}", TensorType(a.shape, DType.from_numpy(a.dtype), 0))
        for i, a in enumerate(arrays)
    ]
    op = b.add_op(op_type, inputs, attrs)
    return list(ir.execute(b.finish(list(op.outputs)), list(arrays)))


def qkv(rng, b=2, hq=4, hkv=2, sq=5, sk=5, d=3, dv=4):
    return (
        rng.standard_normal((b, hq, sq, d)),
        rng.standard_normal((b, hkv, sk, d)),
        rng.standard_normal((b, hkv, sk, dv)),
    )


def reference(q, k, v, keep=None, bias=None, scale=None):
    """softmax(q k^T scale + bias) v per query head, each reading its kv head, in loops."""
    b, hq, sq, d = q.shape
    group = hq // k.shape[1]
    scale = 1 / math.sqrt(d) if scale is None else scale
    out = np.zeros((b, hq, sq, v.shape[-1]))
    for i in range(b):
        for h in range(hq):
            s = q[i, h] @ k[i, h // group].T * scale
            if bias is not None:
                s = s + np.broadcast_to(bias, (b, hq, *s.shape))[i, h]
            if keep is not None:
                s = np.where(np.broadcast_to(keep, (b, hq, *s.shape))[i, h], s, -np.inf)
            p = np.exp(s - s.max(-1, keepdims=True))
            out[i, h] = (p / p.sum(-1, keepdims=True)) @ v[i, h // group]
    return out


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(7)


@pytest.mark.parametrize(
    ("hq", "hkv", "sq", "sk"),
    [(4, 4, 5, 5), (4, 2, 5, 5), (4, 1, 1, 9), (2, 2, 3, 7)],
    ids=["mha", "gqa", "mqa-decode", "chunk-after-cache"],
)
def test_equals_torch_sdpa_causal_aligned_bottom_right(rng, hq, hkv, sq, sk):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    from torch.nn.attention.bias import causal_lower_right

    q, k, v = qkv(rng, hq=hq, hkv=hkv, sq=sq, sk=sk)
    (got,) = run("Attention", q, k, v, causal=True)
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    want = sdpa(tq, tk, tv, attn_mask=causal_lower_right(sq, sk), enable_gqa=hq != hkv)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-12, atol=1e-12)
    if sq == sk:  # torch's is_causal is the same diagonal for a square op
        want = sdpa(tq, tk, tv, is_causal=True, enable_gqa=hq != hkv)
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(got, reference(q, k, v, keep=causal_keep(sq, sk)), rtol=1e-12)


def test_equals_torch_sdpa_with_masks_and_a_scale(rng):
    torch = pytest.importorskip("torch", reason="torch is not installed")
    q, k, v = qkv(rng, sq=4, sk=6)
    keep = rng.random((2, 1, 1, 6)) < 0.7
    keep[..., 0] = True  # padding leaves each sequence a key
    bias = rng.standard_normal((4, 6))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    tq, tk, tv = (torch.from_numpy(x) for x in (q, k, v))
    for mask in (keep, bias):
        (got,) = run("Attention", q, k, v, mask, scale=0.3)
        want = sdpa(tq, tk, tv, attn_mask=torch.from_numpy(mask), scale=0.3, enable_gqa=True)
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-12, atol=1e-12)
    (got,) = run("Attention", q, k, v, bias, scale=0.3)
    np.testing.assert_allclose(got, reference(q, k, v, bias=bias, scale=0.3), rtol=1e-12)


def test_equals_the_unfused_ops(rng):
    q, k, v = qkv(rng, hq=2, hkv=2, sq=6, sk=6)
    (fused,) = run("Attention", q, k, v, causal=True)
    (s,) = run("MatMul", q, np.swapaxes(k, -1, -2))
    (s,) = run("Scale", s, factor=1 / math.sqrt(3))
    (s,) = run("CausalMask", s)
    (p,) = run("Softmax", s)
    (unfused,) = run("MatMul", p, v)
    np.testing.assert_allclose(fused, unfused, rtol=1e-12, atol=1e-12)


def test_a_query_with_no_key_gets_zeros_not_nan(rng):
    q, k, v = qkv(rng, sq=5, sk=3)
    (out,) = run("Attention", q, k, v, causal=True)  # queries 0, 1 see no key
    assert np.all(out[:, :, :2] == 0) and np.isfinite(out).all()
    np.testing.assert_allclose(out[:, :, 2:], run("Attention", q[:, :, 2:], k, v, causal=True)[0])
    keep = np.ones((5, 3), dtype=bool)
    keep[3] = False
    (out,) = run("Attention", q, k, v, keep)
    assert np.all(out[:, :, 3] == 0) and np.isfinite(out).all()
    dout = rng.standard_normal(out.shape)
    grads = run("AttentionGrad", q, k, v, out, dout, keep)
    assert all(np.isfinite(g).all() for g in grads)
    assert np.all(grads[0][:, :, 3] == 0)


def T(*shape, dtype=DType.float32) -> TensorType:
    return TensorType(shape, dtype, 0)


@pytest.mark.parametrize(
    ("types", "attrs", "message"),
    [
        ((T(2, 3, 4, 8), T(2, 2, 4, 8), T(2, 2, 4, 8)), {}, "q has 3 heads and k, v have 2"),
        ((T(2, 4, 8), T(2, 4, 8), T(2, 4, 8)), {}, r"q must be \(batch, heads, query_seq"),
        ((T(2, 2, 4, 8), T(2, 2, 4, 6), T(2, 2, 4, 8)), {}, "q's head_dim 8 differs from k's 6"),
        ((T(2, 2, 4, 8), T(2, 2, 5, 8), T(2, 2, 4, 8)), {}, "must have the same kv_heads and"),
        ((T(2, 2, 4, 8), T(3, 2, 4, 8), T(3, 2, 4, 8)), {}, "one batch size"),
        ((T(1, 2, 4, 8), T(1, 2, 4, 8), T(1, 2, 4, 8, dtype=F64)), {}, "one dtype"),
        ((T(1, 2, 4, 8),) * 3 + (T(3, 4),), {}, r"mask has shape \(3, 4\), which does not"),
        ((T(1, 2, 4, 8),) * 3 + (T(4, 4, dtype=DType.int64),), {}, "mask must be bool"),
        ((T(1, 2, 4, 8),) * 5, {}, "takes 3 operands and an optional mask, got 5"),
        ((T(1, 2, 4, 8),) * 3, {"scale": "big"}, "attribute scale='big' is not None or a"),
    ],
)
def test_bad_operands_are_refused_with_what_and_where(types, attrs, message):
    b = ir.FunctionBuilder("bad")
    inputs = [b.input(f"x{i}", t) for i, t in enumerate(types)]
    with pytest.raises(VerifyError, match=message):
        b.add_op("Attention", inputs, attrs)


def test_attention_grad_checks_out_and_dout():
    b = ir.FunctionBuilder("bad")
    types = (T(1, 2, 4, 8), T(1, 2, 4, 8), T(1, 2, 4, 6), T(1, 2, 4, 6), T(1, 2, 4, 8))
    inputs = [b.input(f"x{i}", t) for i, t in enumerate(types)]
    with pytest.raises(VerifyError, match=r"AttentionGrad: dout must be like Attention's"):
        b.add_op("AttentionGrad", inputs, {})


def _cost(op_type: str, types, **attrs) -> ir.Cost:
    opdef = ir.get_op(op_type)
    full = opdef.complete_attributes(attrs)
    ctx = ir.registry.TypeContext(tuple(types), full)
    return opdef.cost_rule(CostContext(tuple(types), tuple(opdef.type_rule(ctx)), full))


def test_cost_is_the_fused_kernels_flops_and_io():
    B, H, S, D = 2, 4, 16, 8
    q = T(B, H, S, D)
    full = _cost("Attention", (q, q, q))
    assert full.flops == full.matrix_flops == 4 * B * H * S * S * D
    assert full.bytes_read == 3 * q.size_bytes and full.bytes_written == q.size_bytes
    causal = _cost("Attention", (q, q, q), causal=True)
    assert causal.flops == full.flops / 2  # FlashAttention's count for a square causal op
    # a decode step attends every cached key: no halving
    k = T(B, 1, 100, D)
    decode = _cost("Attention", (T(B, H, 1, D), k, k), causal=True)
    assert decode.flops == 4 * B * H * 1 * 100 * D
    assert decode.bytes_read == T(B, H, 1, D).size_bytes + 2 * k.size_bytes  # the cache once
    # three queries after 5 cached keys attend 6, 7, 8 keys
    chunk = _cost("Attention", (T(1, 1, 3, D), T(1, 1, 8, D), T(1, 1, 8, D)), causal=True)
    assert chunk.flops == 4 * D * (6 + 7 + 8)
    mask = T(B, 1, S, S, dtype=DType.bool)
    assert _cost("Attention", (q, q, q, mask)).bytes_read == 3 * q.size_bytes + mask.size_bytes
    grad = _cost("AttentionGrad", (q,) * 5, causal=True)
    assert grad.flops == grad.matrix_flops == 2.5 * causal.flops  # five products, not two
    assert grad.bytes_read == 5 * q.size_bytes and grad.bytes_written == 3 * q.size_bytes


def test_the_cost_names_the_fused_kernel_for_the_efficiency_model():
    q, k = T(2, 8, 1, 64, dtype=DType.float16), T(2, 2, 512, 64, dtype=DType.float16)
    v = T(2, 2, 512, 32, dtype=DType.float16)
    ctx = CostContext((q, k, v), (T(2, 8, 1, 32),), {"causal": True, "scale": None})
    assert attention_shape(ctx) == AttentionShape(16, 1, 512, 64, 32, True)
    forward = _cost("Attention", (q, k, v), causal=True)
    assert (forward.kernel, forward.gemms, forward.launches) == (
        "attention",
        ((16, 1, 512, 64),),
        1,
    )
    out = T(2, 8, 1, 32, dtype=DType.float16)
    backward = _cost("AttentionGrad", (q, k, v, out, out), causal=True)
    assert (backward.kernel, backward.gemms) == ("attention_grad", ((16, 1, 512, 64),))
    # on a preset with the kernel efficiency model, the fused kernels run below the matrix
    # peak (FlashAttention's achieved fraction), the backward further below than the forward
    gpu = ir.Topology.preset("a100-hgx", 1).devices[0]
    ideal = ir.Topology.preset("a100-hgx", 1, ideal=True).devices[0]
    big = T(4, 16, 1024, 64, dtype=DType.float16)
    for op_type, types in (("Attention", (big,) * 3), ("AttentionGrad", (big,) * 5)):
        cost = _cost(op_type, types, causal=True)
        modelled, roofline = gpu.op_time_s(cost, "float16"), ideal.op_time_s(cost, "float16")
        assert 1.3 * roofline < modelled < 4 * roofline, (op_type, modelled, roofline)
    fwd, bwd = (
        gpu.op_time_s(_cost(o, t, causal=True), "float16") / _cost(o, t, causal=True).flops
        for o, t in (("Attention", (big,) * 3), ("AttentionGrad", (big,) * 5))
    )
    assert bwd > fwd  # seconds per FLOP


def test_propagation_splits_heads_in_proportion_only():
    """Six query heads over three kv heads: on three devices each keeps 2 + 1 heads and no
    collective is needed; on two the kv heads would split 2 + 1 against 3 + 3 query heads,
    which the local op's type rule refuses, so propagation runs it another way."""
    from ir.sharding import Mesh, S, propagate

    b = ir.FunctionBuilder("gqa")
    q = b.input("q", T(2, 6, 5, 4, dtype=F64))
    k, v = (b.input(n, T(2, 3, 5, 4, dtype=F64)) for n in "kv")
    f = b.finish([b.call("Attention", q, k, v, causal=True, name="o")])
    xs = ir.random_inputs(f)
    (want,) = ir.execute(f, xs)
    for n, collectives in ((3, 0), (2, 3)):
        mesh = Mesh((n,))
        g, report = propagate(f, {"q": (mesh, [S(1)]), "k": (mesh, [S(1)])})
        assert len(report.collectives) == collectives
        split = [how for _, how in report.strategies] == ["axis 0: split h"]
        assert split == (n == 3)
        np.testing.assert_allclose(ir.execute_step(g, xs)[0], want, rtol=1e-12)
