"""Builder, verifier and executor basics: types are inferred, bad programs are refused
with errors that name the op, and communication ops have their exact semantics."""

from __future__ import annotations

import numpy as np
import pytest

import ir
from ir import DeviceVar, DType, FunctionBuilder, TensorType, TupleType, VerifyError
from ir.function import Function
from ir.op import Op


def T(*shape, device=0, dtype=DType.float32):
    return TensorType(tuple(shape), dtype, device)


def test_types_print_like_the_seeds():
    assert str(T(8, 4, device=1)) == "Tensor[(8, 4), 1]"
    assert str(T(8, device=0)) == "Tensor[(8,), 0]"
    assert str(TensorType.scalar(device=DeviceVar("d"))) == "Float[d]"
    assert str(T(2, dtype=DType.float16, device=None)) == "Tensor[(2,), float16, ?]"
    pair = TupleType((T(2, device=1), T(2, device=2)))
    assert str(pair) == "Tuple[Tensor[(2,), 1], Tensor[(2,), 2]]"
    assert pair.size_bytes == 16
    assert T(3, 5, dtype=DType.bfloat16).size_bytes == 30


def test_tensor_type_rejects_bad_shapes():
    with pytest.raises(ValueError, match="negative"):
        TensorType((2, -1))
    with pytest.raises(ValueError, match="tuple of ints"):
        TensorType((2.5,))


def test_builder_infers_types_and_values_are_distinct():
    b = FunctionBuilder("f")
    x = b.input("x", T(4, 3))
    w = b.input("w", T(3, 5))
    y1 = b.call("MatMul", x, w, name="y")
    y2 = b.call("matmul", x, w, name="y")  # case-insensitive, same name hint
    f = b.finish([y1, y2])
    assert y1.type == T(4, 5) and y1 != y2
    text = str(f)
    assert "y: Tensor[(4, 5), 0] = MatMul(x, w)" in text
    assert "y_1: Tensor[(4, 5), 0] = MatMul(x, w)" in text
    assert f.ops[0].device == 0


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda b, x, w: b.call("Matmull", x, w), "unknown op 'Matmull'; did you mean MatMul"),
        (lambda b, x, w: b.call("MatMul", x), r"MatMul takes 2 operand\(s\) \(a, b\), got 1"),
        (lambda b, x, w: b.call("MatMul", w, w), r"contraction dimensions differ"),
        (
            lambda b, x, w: b.call("Add", x, w),
            r"Add: shapes \(4, 3\) and \(3, 5\) do not broadcast",
        ),
        (lambda b, x, w: b.call("Send", x, to_devic=1), "Send has no attribute 'to_devic'"),
        (lambda b, x, w: b.call("Send", x), "Send needs the attribute 'to_device'"),
        (
            lambda b, x, w: b.call("MatMul", x, b.call("Send", w, to_device=1)),
            "operands on different devices",
        ),
        (
            lambda b, x, w: b.call("Scatter", x, dim=0, devices=[0, 1, 2, 3, 4]),
            "axis of size 4 over 5 devices leaves empty shards",
        ),
        (lambda b, x, w: b.call("Scatter", x, dim=2, devices=[0, 1]), "dim 2 is out of range"),
    ],
)
def test_builder_refuses_bad_ops(build, message):
    b = FunctionBuilder("bad")
    x = b.input("x", T(4, 3))
    w = b.input("w", T(3, 5))
    with pytest.raises(VerifyError, match=message):
        build(b, x, w)


def test_undefined_operand_is_refused():
    other = FunctionBuilder("other")
    stray = other.input("stray", T(4, 3))
    b = FunctionBuilder("f")
    b.input("x", T(4, 3))
    with pytest.raises(VerifyError, match=r"\('stray'\) is not defined in function 'f'"):
        b.call("Relu", stray)
    with pytest.raises(VerifyError, match="returns 'stray', which it never defines"):
        b.finish([stray])


def test_declared_type_must_match_the_rule():
    b = FunctionBuilder("f")
    x = b.input("x", T(4, 3))
    with pytest.raises(VerifyError, match=r"declared Tensor\[\(4, 4\), 0\]"):
        b.add_op("Relu", [x], output_types=[T(4, 4)])


def test_verify_catches_out_of_order_and_double_definition():
    b = FunctionBuilder("f")
    x = b.input("x", T(2, 2))
    a = b.call("Relu", x, name="a")
    c = b.call("Relu", a, name="c")
    good = b.finish([c])
    swapped = Function("f", good.inputs, (good.ops[1], good.ops[0]), good.outputs)
    with pytest.raises(VerifyError, match="not defined before this op"):
        ir.verify(swapped)
    twice = Function("f", good.inputs, (good.ops[0], good.ops[0]), (a,))
    with pytest.raises(VerifyError, match="defined more than once"):
        ir.verify(twice)
    wrong = Op("Relu", (x,), (ir.Value("z", T(9)),))
    with pytest.raises(VerifyError, match=r"declared Tensor\[\(9,\), 0\] but the op's type rule"):
        ir.verify(Function("f", (x,), (wrong,), ()))
    assert ir.verify(good) is good


def test_builder_cannot_be_reused_after_finish():
    b = FunctionBuilder("f")
    x = b.input("x", T(2))
    b.finish([x])
    with pytest.raises(VerifyError, match="finished"):
        b.call("Relu", x)


def _run(build, *inputs):
    b = FunctionBuilder("f")
    vals = [b.input(f"i{k}", t) for k, (t, _) in enumerate(inputs)]
    out = build(b, *vals)
    f = b.finish(out if isinstance(out, (list, tuple)) else [out])
    return ir.execute(f, [a for _, a in inputs])


def test_scatter_uneven_gives_first_shards_one_more_row():
    x = np.arange(10, dtype=np.float32).reshape(5, 2)
    (xs,) = _run(lambda b, v: b.call("Scatter", v, dim=0, devices=[1, 2, 3]), (T(5, 2), x))
    assert [p.shape for p in xs] == [(2, 2), (2, 2), (1, 2)]
    np.testing.assert_array_equal(np.concatenate(xs), x)


def test_collectives_have_exact_semantics():
    rng = np.random.default_rng(0)
    parts = [rng.standard_normal((4, 6)).astype(np.float32) for _ in range(2)]
    tt = TupleType((T(4, 6, device=1), T(4, 6, device=2)))

    (ar,) = _run(lambda b, v: b.call("AllReduce", v), (tt, parts))
    for p in ar:
        np.testing.assert_allclose(p, parts[0] + parts[1])
    (rs,) = _run(lambda b, v: b.call("ReduceScatter", v, dim=1), (tt, parts))
    np.testing.assert_allclose(np.concatenate(rs, axis=1), parts[0] + parts[1])
    (ag,) = _run(lambda b, v: b.call("AllGather", v, dim=0), (tt, parts))
    assert ag[0].shape == (8, 6)
    np.testing.assert_array_equal(ag[1], np.concatenate(parts))
    (a2a,) = _run(lambda b, v: b.call("AllToAll", v, split_dim=1, concat_dim=0), (tt, parts))
    np.testing.assert_array_equal(a2a[0], np.concatenate([parts[0][:, :3], parts[1][:, :3]]))
    np.testing.assert_array_equal(a2a[1], np.concatenate([parts[0][:, 3:], parts[1][:, 3:]]))
    (mx,) = _run(lambda b, v: b.call("Reduce", v, to_device=0, op="max"), (tt, parts))
    np.testing.assert_array_equal(mx, np.maximum(parts[0], parts[1]))


def test_pmap_runs_body_per_device_and_matches_sequential():
    b = FunctionBuilder("dp")
    x = b.input("x", T(6, 4))
    w = b.input("w", T(4, 3))
    xs = b.call("Scatter", x, dim=0, devices=[1, 2], name="xs")
    ws = b.call("Broadcast", w, devices=[1, 2], name="ws")
    body = FunctionBuilder("body")
    xi = body.input("xi", T(3, 4, device=DeviceVar("d")))
    wi = body.input("wi", T(4, 3, device=DeviceVar("d")))
    yi = body.call("Relu", body.call("MatMul", xi, wi, name="ai"), name="yi")
    ys = b.call("Pmap", xs, ws, subfunctions=[body.finish([yi])], name="ys")
    y = b.call("Gather", ys, dim=0, to_device=0, name="y")
    f = b.finish([y])
    assert ys.type.devices == (1, 2)
    xv, wv = ir.random_inputs(f, seed=3)
    (got,) = ir.execute(f, [xv, wv])
    np.testing.assert_allclose(got, np.maximum(xv @ wv, 0), rtol=1e-6)


def test_nested_pmap_resolves_sub_devices_through_the_device_map():
    d, dd = DeviceVar("d"), DeviceVar("dd")
    inner = FunctionBuilder("inner")
    a = inner.input("a", T(2, 2, device=dd))
    inner_f = inner.finish([inner.call("Relu", a, name="r")])
    outer = FunctionBuilder("outer")
    xi = outer.input("xi", T(2, 2, device=d))
    xis = outer.call("Broadcast", xi, devices=[DeviceVar("d", (0,)), DeviceVar("d", (1,))])
    rs = outer.call("Pmap", xis, device_var="dd", subfunctions=[inner_f], name="rs")
    back = outer.call("Reduce", rs, to_device=d, name="back")
    outer_f = outer.finish([back])
    b = FunctionBuilder("nested")
    x = b.input("x", T(2, 2))
    xs = b.call("Broadcast", x, devices=[1, 2])
    out = b.call("Pmap", xs, device_map={1: [1, 3], 2: [2, 4]}, subfunctions=[outer_f])
    f = b.finish([out])
    assert out.type.devices == (1, 2)
    xv = np.array([[1.0, -1.0], [2.0, -2.0]], dtype=np.float32)
    (res,) = ir.execute(f, [xv])
    for r in res:
        np.testing.assert_array_equal(r, 2 * np.maximum(xv, 0))
    assert f.is_equivalent(f) and not f.is_equivalent(outer_f)


def test_execute_checks_inputs():
    b = FunctionBuilder("f")
    x = b.input("x", T(2, 2))
    f = b.finish([b.call("Relu", x)])
    with pytest.raises(ir.ExecutionError, match=r"has shape \(3,\), the function wants \(2, 2\)"):
        ir.execute(f, [np.zeros(3)])
    with pytest.raises(ir.ExecutionError, match="takes 1 inputs"):
        ir.execute(f, [])
    with pytest.raises(ir.ExecutionError, match=r"inputs gives no value for \['x'\]"):
        ir.execute(f, {})


def test_topology_validates_links_and_devices():
    topo = ir.Topology.uniform(4, link_bandwidth_bytes_per_s=5e9)
    assert topo.bandwidth(0, 3) == 5e9
    with pytest.raises(ir.TopologyError, match="device 7 is not in topology"):
        topo.device(7)
    with pytest.raises(ir.TopologyError, match="link 0 -> 1 has bandwidth 0"):
        ir.Topology(topo.devices[:2], ((0, 0), (1, 0)), ((0, 0), (0, 0)))
    with pytest.raises(ir.TopologyError, match="peak_flops must be positive"):
        ir.Device(0, peak_flops=-1)


def test_registry_refuses_duplicates_and_suggests_names():
    from ir.registry import get_op, register_op

    with pytest.raises(ir.RegistryError, match="already registered"):
        register_op(get_op("MatMul"))
    with pytest.raises(ir.UnknownOpError, match="did you mean AllReduce"):
        get_op("AllReduse")
