"""The builder's fast paths: ``add_inferred`` trusts inferred types, ``unpack`` a tuple's.

Both must build exactly what the checking path builds, and still refuse what is
cheap to check: undefined operands, wrong arity, a wrong number of names.
"""

from __future__ import annotations

import numpy as np
import pytest

import ir
from ir import FunctionBuilder, TensorType, TupleType, VerifyError
from ir.op import freeze_attributes
from ir.registry import get_op
from ir.verify import infer_types


def T(*shape, device=0):
    return TensorType(shape, device=device)


def test_add_inferred_builds_what_add_op_builds():
    def build(fast: bool) -> ir.Function:
        b = FunctionBuilder("f")
        x = b.input("x", T(2, 3, 4))
        attrs = {"perm": [2, 0, 1]}
        if fast:
            types, full = infer_types(get_op("Transpose"), [x.type], attrs)
            y = b.add_inferred("transpose", [x], freeze_attributes(full), types, ["y"]).outputs[0]
        else:
            y = b.add_op("Transpose", [x], attrs, names=["y"]).outputs[0]
        return b.finish([y])

    fast, checked = build(True), build(False)
    assert str(fast) == str(checked)
    (op,) = fast.ops
    assert op.op_type == "Transpose"  # the canonical name, whatever the spelling
    assert op.device == 0 and op.outputs[0].type == T(4, 2, 3)
    assert dict(op.attributes) == dict(checked.ops[0].attributes)
    ir.verify(fast)


def test_add_inferred_trusts_the_types_it_is_given_and_verify_catches_a_lie():
    b = FunctionBuilder("f")
    x = b.input("x", T(4, 3))
    y = b.add_inferred("Relu", [x], freeze_attributes({}), [T(4, 4)], ["y"]).outputs[0]
    f = b.finish([y])  # the contract was broken: only verify's full check sees it
    with pytest.raises(VerifyError, match=r"declared Tensor\[\(4, 4\), 0\]"):
        ir.verify(f)


def test_add_inferred_refuses_operands_not_defined_in_this_builder():
    other = FunctionBuilder("other")
    stray = other.input("stray", T(4, 3))
    b = FunctionBuilder("f")
    b.input("x", T(4, 3))
    with pytest.raises(VerifyError, match=r"operand 0 of Relu \('stray'\) is not defined in "):
        b.add_inferred("Relu", [stray], freeze_attributes({}), [T(4, 3)], ["y"])
    with pytest.raises(VerifyError, match="operand 0 of Relu is 'x', not a Value"):
        b.add_inferred("Relu", ["x"], freeze_attributes({}), [T(4, 3)], ["y"])
    assert b.ops == ()


def test_add_inferred_refuses_a_wrong_arity_or_name_count_or_unknown_op():
    b = FunctionBuilder("f")
    x = b.input("x", T(4, 3))
    with pytest.raises(VerifyError, match=r"MatMul takes 2 operand\(s\) \(a, b\), got 1"):
        b.add_inferred("MatMul", [x], freeze_attributes({}), [T(4, 3)], ["y"])
    with pytest.raises(VerifyError, match=r"Relu has 1 result\(s\), got 2 names"):
        b.add_inferred("Relu", [x], freeze_attributes({}), [T(4, 3)], ["y", "z"])
    with pytest.raises(VerifyError, match="unknown op 'Rleu'; did you mean Relu"):
        b.add_inferred("Rleu", [x], freeze_attributes({}), [T(4, 3)], ["y"])
    b.finish([x])
    with pytest.raises(VerifyError, match="is finished"):
        b.add_inferred("Relu", [x], freeze_attributes({}), [T(4, 3)], ["y"])


def test_unpack_builds_what_tuple_get_calls_build():
    def build(fast: bool) -> ir.Function:
        b = FunctionBuilder("f")
        x = b.input("x", T(4, 3))
        xs = b.call("Scatter", x, dim=0, devices=[0, 1, 2], name="xs")
        names = [f"x_{d}" for d in range(3)]
        if fast:
            parts = b.unpack(xs, names)
        else:
            parts = [b.call("TupleGet", xs, index=i, name=n) for i, n in enumerate(names)]
        return b.finish(list(parts))

    fast, checked = build(True), build(False)
    assert str(fast) == str(checked)
    assert [op.device for op in fast.ops] == [None, 0, 1, 2]
    assert [v.type for v in fast.outputs] == [
        T(2, 3, device=0),
        T(1, 3, device=1),
        T(1, 3, device=2),
    ]
    assert [dict(op.attributes) for op in fast.ops[1:]] == [{"index": i} for i in range(3)]
    ir.verify(fast)


def test_unpack_of_nested_tuples_gives_device_none():
    b = FunctionBuilder("f")
    inner = TupleType((T(2, device=0), T(2, device=1)))
    xs = b.input("xs", TupleType((inner, T(3, device=2))))
    a, c = b.unpack(xs, ["a", "c"])
    assert a.type == inner and c.type == T(3, device=2)
    assert [op.device for op in b.ops] == [None, 2]
    ir.verify(b.finish([a, c]))


def test_unpack_refuses_what_it_cannot_unpack():
    b = FunctionBuilder("f")
    x = b.input("x", T(4, 3))
    with pytest.raises(VerifyError, match=r"cannot unpack 'x' of type Tensor\[\(4, 3\), 0\]"):
        b.unpack(x, ["a"])
    xs = b.call("Scatter", x, dim=0, devices=[0, 1], name="xs")
    with pytest.raises(VerifyError, match=r"'xs' has 2 element\(s\), got 3 names"):
        b.unpack(xs, ["a", "b", "c"])
    other = FunctionBuilder("other")
    stray = other.input("stray", TupleType((T(2), T(2, device=1))))
    with pytest.raises(VerifyError, match=r"operand 0 of TupleGet \('stray'\) is not defined"):
        b.unpack(stray, ["a", "b"])


def test_get_op_is_case_insensitive_and_names_unknown_ops():
    assert get_op("matmul") is get_op("MatMul")
    with pytest.raises(ir.errors.UnknownOpError, match="did you mean MatMul"):
        get_op("MatMull")


def _rows_program(batched: bool, devices=(0, 1, 2)) -> ir.Function:
    """MatMul then Split on per-device operands: one op per device, batched or one by one."""
    b = FunctionBuilder("f")
    xs = [b.input(f"x_{d}", T(4, 6, device=d)) for d in devices]
    ws = [b.input(f"w_{d}", T(6, 2, device=d)) for d in devices]
    sig = []
    for d in devices:
        types, full = infer_types(get_op("MatMul"), [T(4, 6, device=d), T(6, 2, device=d)], {})
        sig.append((freeze_attributes(full), types))
    rows = list(zip(xs, ws))
    names = [[f"y_{d}"] for d in devices]
    if batched:
        ys = [out[0] for out in b.add_inferred_rows("matmul", rows, sig, names)]
    else:
        ys = [
            b.add_inferred("matmul", list(r), a, t, n).outputs[0]
            for r, (a, t), n in zip(rows, sig, names)
        ]
    grads = []  # MatMulGrad: two results per op
    for x, w, y in zip(xs, ws, ys):
        types, full = infer_types(get_op("MatMulGrad"), [x.type, w.type, y.type], {})
        grads.append((freeze_attributes(full), types))
    two_names = [[f"dw_{d}", f"dx_{d}"] for d in devices]
    grad_rows = [[x, w, y] for x, w, y in zip(xs, ws, ys)]
    if batched:
        parts = b.add_inferred_rows("MatMulGrad", grad_rows, grads, two_names)
    else:
        parts = [
            b.add_inferred("MatMulGrad", r, a, t, n).outputs
            for r, (a, t), n in zip(grad_rows, grads, two_names)
        ]
    return b.finish([v for p in parts for v in p])


def test_add_inferred_rows_builds_what_one_add_inferred_per_row_builds():
    batched, single = _rows_program(True), _rows_program(False)
    assert str(batched) == str(single)
    for a, c in zip(batched.ops, single.ops, strict=True):
        assert (a.op_type, a.device, a.name, a.subfunctions) == (
            c.op_type,
            c.device,
            c.name,
            c.subfunctions,
        )
        assert a.attributes is not None and dict(a.attributes) == dict(c.attributes)
        assert [(v.name, v.type) for v in a.outputs] == [(v.name, v.type) for v in c.outputs]
        assert [v.name for v in a.inputs] == [v.name for v in c.inputs]
    assert [op.device for op in batched.ops] == [0, 1, 2] * 2
    ir.verify(batched)


def _rows_error(batched: bool, rows, signatures, names, op_type="Relu") -> str:
    b = FunctionBuilder("f")
    x = b.input("x", T(4, 3))
    rows = [[x if v == "x" else v for v in row] for row in rows]
    with pytest.raises(VerifyError) as e:
        if batched:
            b.add_inferred_rows(op_type, rows, signatures, names)
        else:
            for row, (a, t), n in zip(rows, signatures, names):
                b.add_inferred(op_type, row, a, t, n)
    if batched:
        assert b.ops == ()  # a failed call adds nothing
    return str(e.value)


@pytest.mark.parametrize(
    "rows, names, op_type",
    [
        ([["x"], ["x", "x"]], [["y"], ["z"]], "Relu"),  # second row: wrong arity
        ([["x"], ["stray"]], [["y"], ["z"]], "Relu"),  # not a Value
        ([["x"], ["x"]], [["y"], ["z", "w"]], "Relu"),  # second row: two names
        ([["x"]], [["y"]], "Rleu"),  # unknown op
    ],
)
def test_add_inferred_rows_refuses_a_bad_row_as_its_add_inferred_would(rows, names, op_type):
    sig = [(freeze_attributes({}), [T(4, 3)])] * len(rows)
    assert _rows_error(True, rows, sig, names, op_type) == _rows_error(
        False, rows, sig, names, op_type
    )


def test_add_inferred_rows_refuses_operands_from_elsewhere_and_mismatched_rows():
    other = FunctionBuilder("other")
    stray = other.input("stray", T(4, 3))
    b = FunctionBuilder("f")
    x = b.input("x", T(4, 3))
    sig = (freeze_attributes({}), [T(4, 3)])
    with pytest.raises(VerifyError, match=r"operand 0 of Relu \('stray'\) is not defined in "):
        b.add_inferred_rows("Relu", [[x], [stray]], [sig, sig], [["y"], ["z"]])
    with pytest.raises(VerifyError, match="2 operand rows, 1 signatures and 2 name rows"):
        b.add_inferred_rows("Relu", [[x], [x]], [sig], [["y"], ["z"]])
    (y,) = b.add_inferred_rows("Relu", [[x]], [sig], [["y"]])[0]
    assert b.ops[-1].outputs == (y,) and len(b.ops) == 1
    b.finish([y])
    with pytest.raises(VerifyError, match="is finished"):
        b.add_inferred_rows("Relu", [[x]], [sig], [["z"]])


def _pmap_body() -> ir.Function:
    d = ir.DeviceVar("d")
    body = FunctionBuilder("body")
    x, w = body.input("x", T(4, 6, device=d)), body.input("w", T(6, 2, device=d))
    return body.finish([body.call("Relu", body.call("MatMul", x, w))])


def _repeated_steps(like: bool) -> ir.Function:
    """Two 'microbatches' of one pmap and one grouped all-reduce on two devices."""
    b = FunctionBuilder("f")
    ws = b.input("ws", TupleType((T(6, 2, device=0), T(6, 2, device=1))))
    xs = [b.input(f"x{m}", TupleType((T(4, 6, device=0), T(4, 6, device=1)))) for m in (0, 1)]
    body, out = _pmap_body(), []
    first_pmap = first_sum = None
    for m, x in enumerate(xs):
        if like and first_pmap is not None:
            y = b.add_like(first_pmap, [x, ws], [f"y{m}"]).outputs[0]
            out.append(b.add_like(first_sum, [y], [f"s{m}"]).outputs[0])
            continue
        first_pmap = b.add_op(
            "Pmap", [x, ws], {"device_var": "d"}, names=[f"y{m}"], subfunctions=[body]
        )
        y = first_pmap.outputs[0]
        first_sum = b.add_op("AllReduce", [y], {"op": "sum", "groups": [[0, 1]]}, names=[f"s{m}"])
        out.append(first_sum.outputs[0])
    return b.finish(out)


def test_add_like_builds_what_add_op_builds_and_shares_the_first_ops_answer():
    fast, checked = _repeated_steps(True), _repeated_steps(False)
    assert str(fast) == str(checked)
    ir.verify(fast)
    inputs = ir.random_inputs(checked)
    for a, c in zip(ir.execute(fast, inputs), ir.execute(checked, inputs), strict=True):
        for x, y in zip(a, c, strict=True):
            np.testing.assert_array_equal(x, y)
    pmap0, sum0, pmap1, sum1 = fast.ops
    assert pmap1.subfunctions == pmap0.subfunctions and pmap1.device == pmap0.device
    assert pmap1.attributes is pmap0.attributes  # typed once: the first op's answer
    assert pmap1.outputs[0].type is pmap0.outputs[0].type
    assert sum1.attributes is sum0.attributes and dict(sum1.attributes)["groups"] == ((0, 1),)


def test_add_like_on_other_operand_types_asks_the_type_rule():
    b = FunctionBuilder("f")
    x, z = b.input("x", T(4, 3)), b.input("z", T(2, 5, device=1))
    relu = b.add_op("Relu", [x], names=["y"])
    again = b.add_like(relu, [z], ["y2"])
    assert again.outputs[0].type == T(2, 5, device=1) and again.device == 1
    ws = b.input("ws", TupleType((T(6, 2, device=0), T(6, 2, device=1))))
    xs = b.input("xs", TupleType((T(4, 6, device=0), T(4, 6, device=1))))
    bad = b.input("bad", TupleType((T(4, 5, device=0), T(4, 5, device=1))))
    pmap = b.add_op("Pmap", [xs, ws], {"device_var": "d"}, subfunctions=[_pmap_body()])
    with pytest.raises(VerifyError, match="element 0 of pmap operand 0 is Tensor"):
        b.add_like(pmap, [bad, ws], ["y3"])
    with pytest.raises(VerifyError, match="the body takes 2 inputs but pmap maps over 1 tuples"):
        b.add_like(pmap, [xs], ["y3"])
    ir.verify(b.finish([again.outputs[0], pmap.outputs[0]]))


def test_add_like_refuses_operands_from_elsewhere_a_wrong_name_count_and_a_closed_builder():
    other = FunctionBuilder("other")
    stray = other.input("stray", T(4, 3))
    b = FunctionBuilder("f")
    x = b.input("x", T(4, 3))
    relu = b.add_op("Relu", [x], names=["y"])
    with pytest.raises(VerifyError, match=r"operand 0 of Relu \('stray'\) is not defined in "):
        b.add_like(relu, [stray], ["z"])
    with pytest.raises(VerifyError, match="operand 0 of Relu is 'x', not a Value"):
        b.add_like(relu, ["x"], ["z"])
    with pytest.raises(VerifyError, match=r"Relu has 1 result\(s\), got 2 names"):
        b.add_like(relu, [x], ["z", "w"])
    with pytest.raises(VerifyError, match=r"add_like copies an Op .*, got 'Relu'"):
        b.add_like("Relu", [x], ["z"])
    assert b.ops == (relu,)
    b.finish(relu.outputs)
    with pytest.raises(VerifyError, match="is finished"):
        b.add_like(relu, [x], ["z"])
