"""A torch conv net (Conv2d with padding and stride 2, eval-mode BatchNorm2d, ReLU,
MaxPool2d, AvgPool2d, Linear) imports (NCHW around the registry's NHWC ops), executes
equal to torch, and parallelises: data, pipeline, both, horizontal (a conv's output
channels, then the classifier's inputs), and spatially by annotation (height or width
split, halo exchanges through both convolutions and both poolings)."""

from __future__ import annotations

import numpy as np
import pytest

import ir
from ir.importers import weight_name
from ir.sharding import Mesh, S, propagate

from .conftest import MeanSquare, torch

CLASSES = 5


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 8, 3, stride=2, padding=1),
        torch.nn.ReLU(),
        torch.nn.AvgPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(8 * 2 * 2, CLASSES),
    )
    with torch.no_grad():  # statistics other than the initial 0 and 1
        net[1].running_mean.uniform_(-1, 1)
        net[1].running_var.uniform_(0.5, 2)
    return net.eval()


def _imported():
    net = _net()
    x = torch.randn((4, 3, 16, 16), generator=torch.Generator().manual_seed(1))
    f, args = ir.from_torch(net, (x,))
    return f, args, net(x).detach().numpy()


def test_a_conv_net_imports_and_executes_equal_to_torch():
    f, args, want = _imported()
    kinds = [op.op_type for op in f.ops]
    assert kinds.count("Conv2D") == 2 and "MaxPool2D" in kinds and "AvgPool2D" in kinds
    strides = [op.attributes["stride"] for op in f.ops if op.op_type == "Conv2D"]
    assert [tuple(s) for s in strides] == [(1, 1), (2, 2)]
    (y,) = ir.execute(f, args)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "degrees",
    [{"dp": 2}, {"pp": 2, "microbatches": 2}, {"dp": 2, "pp": 2, "microbatches": 2}, {"hp": 2}],
)
def test_the_ready_transforms_parallelise_a_conv_net(degrees):
    f, args, want = _imported()
    if "hp" in degrees:
        g = ir.transforms.horizontal_parallel(f, degrees["hp"])
        layouts = dict(zip((v.name for v in g.inputs), g.input_layouts))
        # Megatron's pair: the second conv by output channels, the classifier by its inputs
        assert layouts["_4_weight"] == layouts["_4_bias"] == ("S(0)",)
        assert layouts["_8_weight"] == ("S(1)",)
    else:
        g = ir.transforms.parallelize(f, **degrees)
        data = next(v for v in g.inputs if v.name == "input")
        assert "S(0)" in g.input_layouts[g.inputs.index(data)][0]  # the batch, not a buffer
    (y,) = ir.collect(g, ir.execute(g, ir.distribute(g, args, source=f)))
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("axis", "name"), [(2, "height"), (3, "width")])
def test_a_conv_net_splits_spatially_with_halo_exchanges(axis, name):
    f, args, want = _imported()
    g, report = propagate(f, {"input": (Mesh((2,)), [S(axis)])})
    (y,) = ir.execute_step(g, args, rtol=1e-5)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)
    nhwc = axis - 1  # NCHW height/width is NHWC axis 1/2
    halos = [how for _, how in report.strategies if "halo" in how]
    assert halos == [f"axis 0: halo exchange along tensor axis {nhwc}"] * 4, name
    # only the flatten before the classifier needs the whole image
    assert [c.kind for c in report.collectives] == ["allgather"]


def test_a_conv_nets_gradients_equal_torch_autograd():
    """Conv2DGrad (padding, stride 2) and Pool2DGrad (max: to each window's first largest
    element; avg) against torch.autograd, through the eval-mode batch norm."""
    net = _net()
    x = torch.randn((4, 3, 16, 16), generator=torch.Generator().manual_seed(1))
    loss_module = MeanSquare(net, torch.randn(4, CLASSES))
    loss_module.zero_grad()
    loss_module(x).backward()
    want = {weight_name(k): p.grad.numpy() for k, p in loss_module.named_parameters()}
    f, args = ir.from_torch(loss_module, (x,))
    params = [v.name for v in f.inputs if v.name in want]
    assert len(params) == len(want) == 8
    step = ir.transforms.training(f, params=params, return_gradients=True, lr=0.1)
    assert {"Conv2DGrad", "Pool2DGrad"} <= {op.op_type for op in step.ops}
    got = dict(zip(params, ir.execute(step, args)[-len(params) :]))
    for name in params:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-3, atol=1e-6, err_msg=name)


@pytest.mark.parametrize(("dp", "tp", "pp", "m"), [(2, 1, 1, 1), (1, 1, 2, 2), (2, 2, 1, 1)])
def test_a_conv_nets_training_step_parallelises_and_equals_the_sequential_step(dp, tp, pp, m):
    f, args, _ = _imported()
    f = ir.models.with_loss(f)
    args = [*args, np.random.default_rng(0).integers(0, CLASSES, (4,))]
    trained = {weight_name(k) for k, _ in _net().named_parameters()}
    t = ir.transforms.training(f, params=[v.name for v in f.inputs if v.name in trained])
    g = ir.transforms.megatron(t, dp, tp, pp, m)
    want = ir.execute(t, args)
    got = ir.collect(g, ir.execute(g, ir.distribute(g, args, source=t)))
    assert len(got) == len(want)
    for v, o, w in zip(t.outputs, got, want, strict=True):
        np.testing.assert_allclose(o, w, rtol=1e-4, atol=1e-6, err_msg=v.name)


def test_a_conv_net_runs_in_onnxruntime_equal_to_torch(tmp_path):
    """``to_onnx`` writes Conv2D and the poolings as ONNX's NCHW ``Conv``, ``MaxPool`` and
    ``AveragePool`` between Transposes (reading them back is not implemented yet)."""
    ort = pytest.importorskip("onnxruntime", reason="the importers extra is not installed")
    f, args, want = _imported()
    names = [v.name for v in f.inputs]
    weights = {n: a for n, a in zip(names, args) if n != "input"}
    path = tmp_path / "convnet.onnx"
    ir.to_onnx(f, path, weights=weights)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"input": args[names.index("input")]})
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)
