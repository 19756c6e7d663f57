"""ir.transforms.training / gradients on the MLP: the seed's program, numpy, finite differences."""

from __future__ import annotations

import numpy as np
import pytest
from _gradcheck import check_gradients, float64_inputs, numeric_gradient

import ir
import ir.models
import ir.transforms
from ir import DType, FunctionBuilder, TensorType
from ir.transforms import AutodiffError

B, F, H, C = 6, 5, 4, 3
F64 = DType.float64


def mlp_inputs(f: ir.Function, seed: int = 0) -> dict[str, np.ndarray]:
    return float64_inputs(f, seed=seed, classes=C)


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


# -- every gradient rule, checked by finite differences ---------------------------------


def _check(f: ir.Function, seed: int = 0, classes: int = 3) -> None:
    args = float64_inputs(f, seed=seed, classes=classes)
    assert check_gradients(f, args)


def test_shape_and_elementwise_rules():
    b = FunctionBuilder("zoo")
    x = b.input("x", TensorType((4, 6), F64, 0))
    w = b.input("w", TensorType((6,), F64, 0))
    u = b.input("u", TensorType((1, 6), F64, 0))
    z = b.input("z", TensorType((4,), DType.int64, 0))
    a = b.call("Mul", x, w)  # broadcast over rows
    a = b.call("Sub", a, b.call("Tanh", u))
    a = b.call("Div", a, b.call("Add", b.call("Mul", u, u), b.call("Gelu", u)))
    a = b.call("Add", a, b.call("Neg", b.call("Relu", x)))
    t = b.call("Transpose", b.call("Reshape", a, shape=(2, 2, 6)), perm=(2, 0, 1))
    a = b.call("Reshape", b.call("Transpose", t, perm=(1, 2, 0)), shape=(4, 6))
    left = b.call("Slice", a, axis=1, start=0, end=2)
    mid = b.call("Slice", a, axis=1, start=1, end=4)
    parts = b.call("Split", a, partitions=3, dim=1)
    p0 = b.call("TupleGet", parts, index=0)
    p2 = b.call("TupleGet", parts, index=2)
    s = b.call("Sum", left, p0, p2)
    s = b.call("Sum", b.call("MakeTuple", s, s))
    r = b.call("ReduceSum", a, axes=(1,), keepdims=True)
    r = b.call("BroadcastTo", r, shape=(4, 2))
    c = b.call("Concat", s, mid, r, dim=1)
    c = b.call("Concat", b.call("MakeTuple", c, c), dim=0)
    c = b.call("Slice", c, axis=0, start=2, end=6)
    c = b.call("Cast", b.call("Identity", c), dtype="float64")
    c = b.call("Softmax", b.call("Scale", c, factor=0.5), axis=0)
    _check(b.finish([b.call("Loss", c, z)]), classes=7)


def test_mse_loss_and_a_loss_that_is_not_the_root():
    b = FunctionBuilder("two_losses")
    x = b.input("x", TensorType((3, 2), F64, 0))
    w = b.input("w", TensorType((2, 2), F64, 0))
    t = b.input("t", TensorType((3, 2), F64, 0))
    z = b.input("z", TensorType((3,), DType.int64, 0))
    y = b.call("MatMul", x, w)
    total = b.call("Add", b.call("Loss", y, t, kind="mse"), b.call("Loss", y, z))
    f = b.finish([b.call("Mul", total, total)])
    assert [p.name for p in ir.transforms.default_params(f)] == ["w"]
    _check(f, classes=2)


def _placed_mlp_pieces(b: FunctionBuilder):
    x = b.input("u", TensorType((5, 3), F64, 0))  # not named x: a parameter too
    w = b.input("w", TensorType((3, 4), F64, 0))
    z = b.input("z", TensorType((5,), DType.int64, 0))
    return x, w, z


def test_communication_rules_on_an_unrolled_distributed_program():
    b = FunctionBuilder("distributed")
    x, w, z = _placed_mlp_pieces(b)
    xs = b.call("Scatter", x, dim=0, devices=(1, 2))  # 3 and 2 rows
    ws = b.call("Broadcast", w, devices=(1, 2))
    ys = b.call(
        "MakeTuple",
        *[
            b.call("MatMul", b.call("TupleGet", xs, index=i), b.call("TupleGet", ws, index=i))
            for i in range(2)
        ],
    )
    y = b.call("Gather", ys, dim=0, to_device=0)  # (5, 4) on device 0
    halves = b.call(
        "MakeTuple",
        b.call("Send", b.call("Slice", y, axis=0, start=0, end=2), to_device=1),
        b.call("Send", b.call("Slice", y, axis=0, start=2, end=5), to_device=2),
    )
    g = b.call("Gather", halves, dim=0, to_device=0)  # uneven the other way: 2 then 3 rows
    sq = b.call("Broadcast", b.call("Slice", y, axis=0, start=0, end=4), devices=(1, 2))
    ar = b.call("AllReduce", sq)
    ag = b.call("AllGather", sq, dim=1)  # (4, 8) each
    rs = b.call("ReduceScatter", ag, dim=1)  # (4, 4) each
    a2a = b.call("AllToAll", rs, split_dim=0, concat_dim=1)  # (2, 8) each
    mean = b.call("Reduce", ar, to_device=0, op="mean")  # (4, 4)
    moved = b.call("Gather", a2a, dim=0, to_device=0)  # (4, 8)
    extra = b.call("Add", mean, b.call("Slice", moved, axis=1, start=2, end=6))
    pad = b.call("Concat", extra, b.call("Slice", y, axis=0, start=4, end=5), dim=0)
    out = b.call("Add", b.call("Add", y, g), pad)
    f = b.finish([b.call("Loss", out, z)])
    _check(f, classes=4)
    kinds = [op.op_type for op in ir.transforms.gradients(f).ops[len(f.ops) :]]
    for op in ("Gather", "Reduce", "AllReduce", "ReduceScatter", "AllGather", "Scatter"):
        assert op in kinds


def test_pmap_forward_is_differentiated_through_its_body():
    from ir.types import DeviceVar

    d = DeviceVar("d")
    body = FunctionBuilder("body")
    xi = body.input("xi", TensorType((2, 3), F64, d))
    wi = body.input("wi", TensorType((3, 4), F64, d))
    hi = body.call("Relu", body.call("MatMul", xi, wi))
    body_f = body.finish([hi, body.call("Tanh", hi)])
    b = FunctionBuilder("dp")
    x = b.input("u", TensorType((4, 3), F64, 0))
    w = b.input("w", TensorType((3, 4), F64, 0))
    z = b.input("z", TensorType((4,), DType.int64, 0))
    xs = b.call("Scatter", x, dim=0, devices=(1, 2))
    ws = b.call("Broadcast", w, devices=(1, 2))
    hs, ts = b.call("Pmap", xs, ws, device_var="d", subfunctions=[body_f])
    del ts  # the second body output gets no gradient
    y = b.call("Gather", hs, dim=0, to_device=0)
    f = b.finish([b.call("Loss", y, z)])
    g = ir.transforms.gradients(f)
    assert [op.op_type for op in g.ops].count("Pmap") == 2
    _check(f, classes=4)


def test_max_reduction_has_no_gradient():
    b = FunctionBuilder("maxed")
    x, w, z = _placed_mlp_pieces(b)
    y = b.call("MatMul", x, w)
    m = b.call("Reduce", b.call("Broadcast", y, devices=(1, 2)), to_device=0, op="max")
    f = b.finish([b.call("Loss", m, z)])
    with pytest.raises(ir.DistIRError, match="only sum and mean"):
        ir.transforms.gradients(f)


def test_op_without_rule_is_named():
    b = FunctionBuilder("second_order")
    x, w, z = _placed_mlp_pieces(b)
    y = b.call("MatMul", x, w)
    y = b.call("ReluGrad", y, y)
    f = b.finish([b.call("Loss", y, z)])
    with pytest.raises(AutodiffError, match="ReluGrad has no gradient rule"):
        ir.transforms.gradients(f)


# -- differentiating programs another transform already distributed ---------------------


def _first(x):
    return x[0] if isinstance(x, tuple) else x


@pytest.mark.parametrize(
    "model, transform",
    [
        ("mlp", "data_parallel"),
        ("mlp", "horizontal"),
        ("gpt", "horizontal"),
        ("gpt", "data_parallel"),
    ],
)
def test_training_of_a_distributed_forward_equals_sequential_training(model, transform):
    from ir.transforms.data_parallel import data_parallel
    from ir.transforms.horizontal import horizontal_parallel

    f = (
        ir.models.mlp(6, 4, 5, 3, dtype=F64)
        if model == "mlp"
        else ir.models.gpt(4, 3, 8, 2, 7, 1, dtype=F64)
    )
    apply = {"data_parallel": data_parallel, "horizontal": horizontal_parallel}[transform]
    params = [p.name for p in ir.transforms.default_params(f)]
    # Differentiating a distributed forward needs whole weights: the distributing form.
    t = ir.transforms.training(
        apply(f, 2, inputs="distribute"), params=params, return_gradients=True
    )
    args = float64_inputs(f, seed=1)
    got = ir.execute(t, args)
    want = ir.execute(ir.transforms.training(f, return_gradients=True), args)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_allclose(_first(a), b, rtol=1e-10, atol=1e-12)


def test_unrolled_data_parallel_program_trains_with_linear_gradient_bookkeeping():
    from ir.transforms.data_parallel import data_parallel
    from ir.transforms.unroll import unroll_pmap

    f = ir.models.mlp(16, 4, 5, 3, dtype=F64)
    want = ir.execute(ir.transforms.training(f, return_gradients=True), float64_inputs(f, 2))
    sizes = []
    for n in (2, 8):
        g = unroll_pmap(data_parallel(f, n, inputs="distribute"))
        t = ir.transforms.training(g, params=["wA", "wB"], return_gradients=True)
        got = ir.execute(t, float64_inputs(f, 2))
        for a, b in zip(got, want, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
        # per-device TupleGet gradients are assembled once per tuple, never padded with zeros
        assert [op.op_type for op in t.ops].count("Constant") <= 1
        sizes.append(len(t.ops) - len(g.ops))
    assert sizes[1] <= 4 * sizes[0] + 8  # backward ops grow linearly with the devices
