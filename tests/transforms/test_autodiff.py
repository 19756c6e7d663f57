"""ir.transforms.training / gradients on the MLP: the seed's program, numpy, finite differences."""

from __future__ import annotations

import numpy as np
import pytest

import ir
import ir.models
import ir.transforms
from ir import DType, FunctionBuilder, TensorType
from ir.transforms import AutodiffError

B, F, H, C = 6, 5, 4, 3
F64 = DType.float64


def mlp_inputs(f: ir.Function, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for v in f.inputs:
        if v.type.dtype.is_float:
            out[v.name] = rng.standard_normal(v.type.shape)
        else:
            out[v.name] = rng.integers(0, C, v.type.shape)
    return out


def softmax_xent(y: np.ndarray, labels: np.ndarray) -> tuple[float, np.ndarray]:
    p = np.exp(y - y.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    n = len(labels)
    loss = -np.mean(np.log(p[np.arange(n), labels]))
    dy = p.copy()
    dy[np.arange(n), labels] -= 1.0
    return loss, dy / n


def test_training_program_has_the_seeds_shape():
    t = ir.transforms.training(ir.models.mlp(B, F, H, C, activation=None, dtype=F64))
    assert [op.op_type for op in t.ops] == [
        "MatMul",
        "MatMul",
        "Loss",
        "LossGrad",
        "MatMulGrad",
        "MatMulGrad",
        "SGDOptimizer",
        "SGDOptimizer",
    ]
    assert [v.name for v in t.outputs] == ["wA1", "wB1", "y", "l"]
    assert [v.name for v in t.inputs] == ["wA", "wB", "x", "z"]
    lines = str(t).splitlines()
    assert (
        "    (dwB, da): Tuple[Tensor[(4, 3), float64, 0], Tensor[(6, 4), float64, 0]] = "
        "MatMulGrad(a, wB, dl)" in lines
    )


@pytest.mark.parametrize("activation", [None, "relu"])
def test_mlp_training_matches_numpy(activation):
    lr = 0.1
    f = ir.models.mlp(B, F, H, C, activation=activation, dtype=F64)
    t = ir.transforms.training(f, lr=lr, return_gradients=True)
    args = mlp_inputs(f, seed=1)
    wA1, wB1, y, loss, dwA, dwB = ir.execute(t, args)
    wA, wB, x, z = args["wA"], args["wB"], args["x"], args["z"]
    a = x @ wA
    h = np.maximum(a, 0) if activation else a
    y_ref = h @ wB
    loss_ref, dy = softmax_xent(y_ref, z)
    dh = dy @ wB.T
    da = dh * (a > 0) if activation else dh
    np.testing.assert_allclose(y, y_ref)
    np.testing.assert_allclose(loss, loss_ref)
    np.testing.assert_allclose(dwB, h.T @ dy)
    np.testing.assert_allclose(dwA, x.T @ da)
    np.testing.assert_allclose(wA1, wA - lr * dwA)
    np.testing.assert_allclose(wB1, wB - lr * dwB)


def numeric_gradient(f: ir.Function, args: dict, name: str, eps: float = 1e-6) -> np.ndarray:
    """Central finite differences of f's last output (the loss) with respect to input ``name``."""
    base = args[name]
    grad = np.zeros_like(base)
    for idx in np.ndindex(base.shape):
        values = []
        for sign in (1, -1):
            w = base.copy()
            w[idx] += sign * eps
            values.append(float(ir.execute(f, {**args, name: w})[-1]))
        grad[idx] = (values[0] - values[1]) / (2 * eps)
    return grad


@pytest.mark.parametrize("layers, activation", [(1, None), (3, "relu"), (3, "tanh"), (2, "gelu")])
def test_mlp_gradients_match_finite_differences(layers, activation):
    f = ir.models.mlp(4, 3, 5, 3, layers=layers, activation=activation, dtype=F64)
    g = ir.transforms.gradients(f)
    args = mlp_inputs(f, seed=layers)
    params = ir.transforms.default_params(f)
    assert [p.name for p in params] == ["wA", "wB", "wC"][:layers]
    got = ir.execute(g, args)[len(f.outputs) :]
    for p, dp in zip(params, got):
        np.testing.assert_allclose(dp, numeric_gradient(f, args, p.name), rtol=1e-5, atol=1e-8)


def test_adam_matches_numpy_adam():
    f = ir.models.mlp(B, F, H, C, dtype=F64)
    lr, b1, b2, eps, step = 0.01, 0.8, 0.95, 1e-7, 3
    t = ir.transforms.training(
        f, "adam", lr=lr, beta1=b1, beta2=b2, epsilon=eps, step=step, return_gradients=True
    )
    assert [v.name for v in t.inputs] == ["wA", "wB", "x", "z", "m_wA", "v_wA", "m_wB", "v_wB"]
    assert [v.name for v in t.outputs][:6] == ["wA1", "wB1", "m_wA1", "v_wA1", "m_wB1", "v_wB1"]
    args = mlp_inputs(t, seed=3)
    args = {k: (np.abs(v) if k.startswith("v_") else v) for k, v in args.items()}
    out = ir.execute(t, args)
    grads = out[-2:]
    for i, w in enumerate(["wA", "wB"]):
        g, m, v = grads[i], args[f"m_{w}"], args[f"v_{w}"]
        m1 = b1 * m + (1 - b1) * g
        v1 = b2 * v + (1 - b2) * g * g
        w1 = args[w] - lr * (m1 / (1 - b1**step)) / (np.sqrt(v1 / (1 - b2**step)) + eps)
        np.testing.assert_allclose(out[i], w1)
        np.testing.assert_allclose(out[2 + 2 * i], m1)
        np.testing.assert_allclose(out[3 + 2 * i], v1)


def test_value_with_several_consumers_accumulates_with_add():
    b = FunctionBuilder("twice")
    w = b.input("w", TensorType((3, 3), F64, 0))
    x = b.input("x", TensorType((2, 3), F64, 0))
    z = b.input("z", TensorType((2,), DType.int64, 0))
    a = b.call("MatMul", x, w, name="a")
    y = b.call("MatMul", a, w, name="y")  # w used twice, a used twice
    y = b.call("Add", y, a, name="s")
    f = b.finish([b.call("Loss", y, z, name="l")])
    g = ir.transforms.gradients(f)
    assert "Add" in [op.op_type for op in g.ops[len(f.ops) :]]
    args = {
        "w": np.random.default_rng(0).standard_normal((3, 3)),
        "x": np.random.default_rng(1).standard_normal((2, 3)),
        "z": np.array([0, 2]),
    }
    (dw,) = ir.execute(g, args)[1:]
    np.testing.assert_allclose(dw, numeric_gradient(f, args, "w"), rtol=1e-5, atol=1e-8)


def test_params_override_and_labels_excluded():
    f = ir.models.mlp(B, F, H, C, dtype=F64)
    t = ir.transforms.training(f, params=["wB"])
    assert [v.name for v in t.outputs] == ["wB1", "y", "l"]
    # float labels reach the Loss only as its label operand: not a parameter
    b = FunctionBuilder("floatlabels")
    w = b.input("w", TensorType((3, 2), F64, 0))
    u = b.input("u", TensorType((4, 3), F64, 0))
    z = b.input("z", TensorType((4,), F64, 0))
    f2 = b.finish([b.call("Loss", b.call("MatMul", u, w), z)])
    assert [p.name for p in ir.transforms.default_params(f2)] == ["w", "u"]


def test_bad_input_errors_name_the_problem():
    f = ir.models.mlp(B, F, H, C)
    with pytest.raises(AutodiffError, match="unknown optimizer 'rmsprop'"):
        ir.transforms.training(f, "rmsprop")
    with pytest.raises(AutodiffError, match="param 'wQ' is not an input"):
        ir.transforms.training(f, params=["wQ"])
    with pytest.raises(AutodiffError, match="not a floating-point scalar"):
        ir.transforms.training(f, loss=0)
    with pytest.raises(AutodiffError, match="not an output index"):
        ir.transforms.training(f, loss=5)
    with pytest.raises(ir.DistIRError):
        ir.transforms.training(f, params=["z"])
