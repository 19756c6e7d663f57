"""``ir.from_torch``: imported modules execute equal to torch and train equal to autograd.

The subjects are tools nobody here wrote: a torch MLP and Hugging Face GPT-2, Llama
and BERT from tiny configs (random weights). Forward: ``ir.execute`` on the imported
program equals the module's output. Training: ``T.training``'s gradients of a
mean-square loss equal ``torch.autograd``'s for every parameter.
"""

from __future__ import annotations

import numpy as np
import pytest

import ir
from ir.importers import TorchImportError, UnsupportedOpsError, weight_name

from .conftest import MODELS, MeanSquare, torch


def _mlp(dtype=torch.float32) -> torch.nn.Module:
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(6, 16),
        torch.nn.GELU(),
        torch.nn.Linear(16, 16),
        torch.nn.SiLU(),
        torch.nn.LayerNorm(16),
        torch.nn.Linear(16, 3),
        torch.nn.Tanh(),
    )
    return net.to(dtype).eval()


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().numpy()


@pytest.mark.parametrize(
    ("dtype", "rtol"), [(torch.float32, 1e-5), (torch.float64, 1e-12)], ids=["f32", "f64"]
)
def test_mlp_executes_equal_to_torch(dtype, rtol):
    net = _mlp(dtype)
    x = torch.randn(5, 6, dtype=dtype)
    f, args = ir.from_torch(net, (x,))
    names = [weight_name(k) for k in net.state_dict()]
    assert [v.name for v in f.inputs] == [*names, "input"]
    for a, (k, t) in zip(args, net.state_dict().items()):
        np.testing.assert_array_equal(a, _np(t), err_msg=k)
    (y,) = ir.execute(f, args)
    np.testing.assert_allclose(y, _np(net(x)), rtol=rtol, atol=rtol)


@pytest.mark.parametrize("model", sorted(MODELS))
def test_transformer_executes_equal_to_torch(model: str, ids):
    lm = MODELS[model]()
    f, args = ir.from_torch(lm, (ids,))
    names = [v.name for v in f.inputs]
    assert args[names.index("ids")].dtype == np.int64
    assert all(n.startswith("const_") for n in names[names.index("ids") + 1 :])
    (logits,) = ir.execute(f, args)
    np.testing.assert_allclose(logits, _np(lm(ids)), rtol=1e-4, atol=1e-5)


def _torch_gradients(module: torch.nn.Module, inputs) -> dict[str, np.ndarray]:
    module.zero_grad()
    module(*inputs).backward()
    # parameters the output does not use (BERT's pooler) get no gradient
    return {weight_name(k): _np(p.grad) for k, p in module.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("model", ["mlp", *sorted(MODELS)])
def test_training_gradients_equal_torch_autograd(model: str, ids):
    if model == "mlp":
        inputs = (torch.randn(5, 6),)
        body = _mlp()
        target = torch.randn(5, 3)
    else:
        inputs = (ids,)
        body = MODELS[model]()
        target = torch.randn(body(ids).shape)
    loss_module = MeanSquare(body, target)
    want = _torch_gradients(loss_module, inputs)
    f, args = ir.from_torch(loss_module, inputs)
    assert set(want) <= {v.name for v in f.inputs}
    params = [v.name for v in f.inputs if v.name in want]
    step = ir.transforms.training(f, params=params, return_gradients=True, lr=0.1)
    results = ir.execute(step, args)
    (loss,) = ir.execute(f, args)
    np.testing.assert_allclose(loss, _np(loss_module(*inputs)), rtol=1e-5)
    got = dict(zip(params, results[-len(params) :]))
    for name in params:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-3, atol=1e-6, err_msg=name)


class _Unsupported(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cumprod(x, 0) + torch.cumprod(x, 1) + torch.atan(x)


def test_unsupported_ops_are_reported_together_with_counts_and_source_lines():
    with pytest.raises(UnsupportedOpsError) as caught:
        ir.from_torch(_Unsupported(), (torch.randn(3, 4),))
    ops = caught.value.ops
    assert ops["aten.cumprod.default"][0] == 2
    assert ops["aten.atan.default"][0] == 1
    message = str(caught.value)
    assert "aten.cumprod.default x2" in message and "aten.atan.default x1" in message
    assert "test_torch_export.py" in ops["aten.atan.default"][1]
    assert "torch.atan(x)" in message


class _DataDependent(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return x * 2
        return x


def test_an_untraceable_module_gets_torchs_reason_and_the_module_path():
    with pytest.raises(TorchImportError, match=r"_DataDependent") as caught:
        ir.from_torch(_DataDependent(), (torch.randn(3),))
    assert "torch.export could not trace" in str(caught.value)


class _ByteBuffer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("offsets", torch.arange(4, dtype=torch.uint8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.offsets


def test_an_input_dtype_distir_lacks_is_a_located_error():
    with pytest.raises(TorchImportError, match=r"input 'offsets' has dtype torch\.uint8"):
        ir.from_torch(_ByteBuffer(), (torch.randn(2, 4),))
