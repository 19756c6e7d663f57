"""``ir.from_torch`` on modules written as people write them: torch's fused attention in
all its forms, position ids and masks computed from the inputs, a default-configured
Hugging Face model with its key/value cache, depthwise, dilated and transposed
convolutions with ``ceil_mode`` pooling; every unsupported op listed at once; weights
taken without a copy."""

from __future__ import annotations

import numpy as np
import pytest

import ir
from ir.importers import UnsupportedOpsError, weight_name

from .conftest import torch, transformers

F = torch.nn.functional


def _np(t) -> np.ndarray:
    return t.detach().numpy()


class _Squared(torch.nn.Module):
    """``mean((module(*inputs) - target) ** 2)``: a scalar loss of a many-input module."""

    def __init__(self, module: torch.nn.Module, target: torch.Tensor) -> None:
        super().__init__()
        self.module = module
        self.register_buffer("target", target)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return ((self.module(*inputs) - self.target) ** 2).mean()


def _gradients_equal(module, inputs) -> None:
    """The imported program's parameter gradients of ``module``'s scalar output equal
    torch's autograd."""
    module.zero_grad()
    module(*inputs).backward()
    want = {weight_name(k): _np(p.grad) for k, p in module.named_parameters()}
    f, args = ir.from_torch(module, inputs)
    params = [v.name for v in f.inputs if v.name in want]
    assert len(params) == len(want)
    step = ir.transforms.training(f, params=params, return_gradients=True, lr=0.1)
    got = dict(zip(params, ir.execute(step, args)[-len(params) :]))
    for name in params:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-3, atol=1e-6, err_msg=name)


class _Attention(torch.nn.Module):
    """q, k, v projections and torch's fused attention, as ``kind`` asks."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.q = torch.nn.Linear(16, 16)
        self.kv = torch.nn.Linear(16, 16 if kind != "gqa" else 8)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        heads_kv = 4 if self.kind != "gqa" else 2
        q = self.q(x).reshape(b, x.shape[1], 4, 4).transpose(1, 2)
        k = self.kv(y).reshape(b, y.shape[1], heads_kv, 4).transpose(1, 2)
        v = (self.kv(y) * 0.5).reshape(b, y.shape[1], heads_kv, 4).transpose(1, 2)
        if self.kind == "causal":  # 3 queries over 5 keys: torch's mask is top-left
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif self.kind == "bool":
            keep = torch.arange(y.shape[1]) < y.shape[1] - 1
            mask = keep.reshape(1, 1, 1, -1) & (x.sum(-1) > -100).reshape(b, 1, -1, 1)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        elif self.kind == "float":
            bias = torch.linspace(-1, 1, y.shape[1]).reshape(1, 1, 1, -1)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=0.3)
        elif self.kind == "gqa":
            out = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        else:
            out = F.scaled_dot_product_attention(q, k, v)
        return out.transpose(1, 2).reshape(b, x.shape[1], 16)


@pytest.mark.parametrize("kind", ["plain", "causal", "bool", "float", "gqa"])
def test_fused_attention_in_every_form_equals_torch_and_trains(kind: str):
    torch.manual_seed(0)
    module = _Attention(kind).eval()
    x, y = torch.randn(2, 3, 16), torch.randn(2, 5, 16)
    f, args = ir.from_torch(module, (x, y))
    assert [op.op_type for op in f.ops].count("Attention") == 1  # the registry's fused op
    np.testing.assert_allclose(ir.execute(f, args)[0], _np(module(x, y)), rtol=1e-5, atol=1e-6)
    _gradients_equal(_Squared(module, torch.randn(2, 3, 16)), (x, y))


class _PositionsFromIds(torch.nn.Module):
    """RoBERTa's position ids (a cumulative sum of the non-padding mask), a padding mask
    filled with the dtype's lowest value, a clamp, and tensors like the input."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(16, 8, padding_idx=1)
        self.positions = torch.nn.Embedding(12, 8)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        keep = ids.ne(1).int()
        positions = (torch.cumsum(keep, dim=1) * keep).long() + 1
        h = self.embed(ids) + self.positions(positions)
        scores = h @ h.transpose(1, 2) / 8**0.5
        blocked = (~ids.ne(1)).unsqueeze(1) | torch.zeros_like(ids, dtype=torch.bool).unsqueeze(2)
        scores = scores.masked_fill(blocked, torch.finfo(h.dtype).min)
        out = torch.softmax(scores, -1) @ h
        return torch.clamp(out, min=-0.5, max=0.5) + torch.full_like(out, 0.25) * (
            ids > 3
        ).unsqueeze(-1)


def test_position_ids_and_masks_computed_from_the_input_ids_equal_torch():
    module = _PositionsFromIds().eval()
    ids = torch.tensor([[5, 6, 7, 1, 1, 1], [3, 4, 1, 2, 8, 1]])
    f, args = ir.from_torch(module, (ids,))
    np.testing.assert_allclose(ir.execute(f, args)[0], _np(module(ids)), rtol=1e-5, atol=1e-6)


def test_a_default_llama_imports_with_its_cache_as_outputs():
    """use_cache=True (the default): the logits, then each layer's keys and values."""
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        vocab_size=64,
        max_position_embeddings=32,
    )
    lm = transformers.LlamaForCausalLM(config).eval()
    assert lm.config._attn_implementation == "sdpa"
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    f, args = ir.from_torch(lm, (ids,))
    out = lm(ids)
    want = [out.logits] + [
        t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)
    ]
    got = ir.execute(f, args)
    assert [op.op_type for op in f.ops].count("Attention") == 2  # one fused op per layer
    assert len(got) == len(want) == 5
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, _np(w), rtol=1e-4, atol=1e-5)


class _ConvNet(torch.nn.Module):
    """Depthwise, dilated, transposed and 1-d convolutions, ReLU6 and hardswish, ceil_mode
    pooling with and without the padding counted."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.depthwise = torch.nn.Conv2d(8, 8, 3, padding=2, dilation=2, groups=8)
        self.norm = torch.nn.BatchNorm2d(8)
        self.grouped = torch.nn.Conv2d(8, 8, 1, groups=2)
        self.up = torch.nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1)
        self.line = torch.nn.Conv1d(4, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu6(self.norm(self.depthwise(self.stem(x))))
        h = F.avg_pool2d(h, 3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)
        h = F.hardswish(self.up(self.grouped(h)))
        h = F.max_pool2d(h, 3, stride=2, ceil_mode=True)
        n, c, rows, cols = h.shape
        return self.line(h.reshape(n, c, rows * cols))


def test_a_conv_net_of_modern_layers_equals_torch_and_trains():
    torch.manual_seed(0)
    net = _ConvNet().eval()
    net.norm.running_var.uniform_(0.5, 1.5)
    x = torch.randn(2, 3, 9, 7)
    f, args = ir.from_torch(net, (x,))
    np.testing.assert_allclose(ir.execute(f, args)[0], _np(net(x)), rtol=1e-4, atol=1e-5)
    assert {"Conv2D", "ConvTranspose2D", "AvgPool2D", "MaxPool2D"} <= {op.op_type for op in f.ops}
    _gradients_equal(_Squared(net, torch.randn(net(x).shape)), (x,))


class _Unsupported(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.cumprod(x, 0)  # no registry op
        return torch.atan(y) + torch.cumprod(torch.relu(y), 1)  # after it: still checked


def test_every_unsupported_op_is_listed_even_after_another():
    with pytest.raises(UnsupportedOpsError) as caught:
        ir.from_torch(_Unsupported(), (torch.randn(3, 4),))
    ops = caught.value.ops
    assert ops["aten.cumprod.default"][0] == 2
    assert ops["aten.atan.default"][0] == 1
    assert "torch.atan(y)" in ops["aten.atan.default"][1]
    assert "2 ATen op(s) have no registry translation" in str(caught.value)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_weights_are_the_modules_own_memory(dtype):
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))
    net = net.to(dtype).eval()
    x = torch.randn(2, 8).to(dtype)
    f, args = ir.from_torch(net, (x,))
    for (name, p), a in zip(net.state_dict().items(), args):
        assert a.ctypes.data == p.data_ptr(), name  # a view, not a copy
        assert a.dtype == (ir.DType.bfloat16 if dtype is torch.bfloat16 else ir.DType.float32).numpy
    (y,) = ir.execute(f, args)
    np.testing.assert_allclose(y.astype(np.float32), _np(net(x).float()), rtol=2e-2, atol=2e-2)
