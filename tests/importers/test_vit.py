"""A ViT from transformers (tiny config, random weights): its patch embedding (a
convolution whose kernel tiles the image) imports as a MatMul of flattened patches; the
program executes equal to torch, its gradients equal torch autograd's, and it
parallelises by data parallelism (and tensor parallelism: its attention and MLP are
Linear layers)."""

from __future__ import annotations

import numpy as np
import pytest

import ir
from ir.importers import weight_name

from .conftest import CLASSES, MeanSquare, pixels, torch, vit


def test_an_imported_vit_executes_equal_to_torch():
    model, x = vit(), pixels(2)
    f, args = ir.from_torch(model, (x,))
    convolutions = [v for v in f.inputs if v.type.rank == 4 and v.name.endswith("_weight")]
    assert [v.type.shape for v in convolutions] == [(32, 3, 4, 4)]  # Cout, Cin, 4 x 4 patch
    (logits,) = ir.execute(f, args)
    np.testing.assert_allclose(logits, model(x).detach().numpy(), rtol=1e-4, atol=1e-5)


def test_an_imported_vits_gradients_equal_torch_autograd():
    x = pixels(2)
    loss_module = MeanSquare(vit(), torch.randn(2, CLASSES))
    loss_module.zero_grad()
    loss_module(x).backward()
    want = {weight_name(k): p.grad.numpy() for k, p in loss_module.named_parameters()}
    f, args = ir.from_torch(loss_module, (x,))
    params = [v.name for v in f.inputs if v.name in want]
    assert len(params) == len(want)  # the patch embedding's weight and bias among them
    step = ir.transforms.training(f, params=params, return_gradients=True, lr=0.1)
    got = dict(zip(params, ir.execute(step, args)[-len(params) :]))
    for name in params:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-3, atol=1e-6, err_msg=name)


def test_an_imported_vit_parallelises_by_data_and_equals_torch():
    model, x = vit(), pixels(4)
    f, args = ir.from_torch(model, (x,))
    g = ir.transforms.data_parallel(f, 2)
    data = next(v for v in g.inputs if v.name == "pixels")
    assert [e.shape[0] for e in data.type.elements] == [2, 2]
    # the class token is broadcast to each replica's (and microbatch's) rows
    three_d = ir.transforms.parallelize(f, dp=2, pp=2, microbatches=2)
    for step in (g, three_d):
        (logits,) = ir.collect(step, ir.execute(step, ir.distribute(step, args, source=f)))
        np.testing.assert_allclose(logits, model(x).detach().numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("strategy", ["data", "tensor", "3d"])
def test_an_imported_vits_training_step_parallelises_and_equals_the_sequential_step(strategy):
    """Data: the class token, broadcast to the whole batch and concatenated with the
    patches, is broadcast to each replica's rows (no communication). Tensor: Megatron's
    split of the attention and MLP Linear layers. 3D: data x pipeline, the class token
    broadcast per microbatch."""
    model, x = vit(), pixels(4)
    f, args = ir.from_torch(model, (x,))
    f = ir.models.with_loss(f)
    args = [*args, np.random.default_rng(0).integers(0, CLASSES, (4,))]
    trained = {weight_name(k) for k, _ in model.named_parameters()}
    t = ir.transforms.training(f, params=[v.name for v in f.inputs if v.name in trained])
    if strategy == "data":
        g = ir.transforms.data_parallel(t, 2)
    elif strategy == "3d":
        g = ir.transforms.megatron(t, 2, 1, 2, 2)
    else:
        g = ir.transforms.megatron(t, 1, 2, 1, 1)
        layouts = dict(zip((v.name for v in g.inputs), g.input_layouts))
        for layer in (0, 1):
            prefix = f"classifier_vit_layers_{layer}_"
            for name in ("attention_q_proj", "attention_v_proj", "mlp_fc1"):
                assert layouts[prefix + name + "_weight"] == ("R@1", "S(0)@2")
                assert layouts[prefix + name + "_bias"] == ("R@1", "S(0)@2")
            for name in ("attention_o_proj", "mlp_fc2"):
                assert layouts[prefix + name + "_weight"] == ("R@1", "S(1)@2")
    want = ir.execute(t, args)
    got = ir.collect(g, ir.execute(g, ir.distribute(g, args, source=t)))
    assert len(got) == len(want)
    for v, o, w in zip(t.outputs, got, want, strict=True):
        np.testing.assert_allclose(o, w, rtol=1e-4, atol=1e-6, err_msg=v.name)
