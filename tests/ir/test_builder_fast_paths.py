"""The builder's fast paths: ``add_inferred`` trusts inferred types, ``unpack`` a tuple's.

Both must build exactly what the checking path builds, and still refuse what is
cheap to check: undefined operands, wrong arity, a wrong number of names.
"""

from __future__ import annotations

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
