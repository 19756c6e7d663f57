"""Bad operands are refused by the op's type rule with a plain sentence naming the op.

The rules raise ``TypeRuleError``; the builder reports it as a ``VerifyError``
prefixed with the op type. Also: dtype rules (binary ops need equal dtypes,
Loss keeps y's float dtype, integer ids stay integer).
"""

from __future__ import annotations

import pytest

import ir
from ir import DType, TensorType, TupleType, VerifyError
from ir.registry import TypeContext

I64, F16 = DType.int64, DType.float16


def T(*shape: int, dtype: DType = DType.float32, device=0) -> TensorType:
    return TensorType(shape, dtype, device)


def add(op_type: str, *types: ir.Type, **attrs):
    """Add one op reading inputs of ``types``; returns its result values."""
    b = ir.FunctionBuilder("bad")
    inputs = [b.input(f"x{i}", t) for i, t in enumerate(types)]
    return b.add_op(op_type, inputs, attrs).outputs


CASES = [
    ("Softmax", (T(2, 3),), {"axis": 2}, "axis 2 is out of range for a rank-2 tensor"),
    ("Transpose", (T(2, 3),), {"perm": (0, 0)}, r"perm \[0, 0\] is not a permutation of the 2"),
    ("Transpose", (T(2, 3),), {"perm": (1, 0, 2)}, "is not a permutation"),
    ("Reshape", (T(2, 3),), {"shape": (4, 2)}, r"cannot reshape \(2, 3\) \(6 elements\) to"),
    ("Reshape", (T(2, 3),), {"shape": (-1, 4)}, r"cannot reshape \(2, 3\)"),
    ("Reshape", (T(2, 3),), {"shape": (-1, -1)}, "more than one -1"),
    ("Slice", (T(4, 3),), {"axis": 0, "start": 2, "end": 6}, r"slice \[2:6\] does not fit"),
    ("Slice", (T(4, 3),), {"axis": 2, "start": 0}, "axis 2 is out of range"),
    ("Concat", (T(2, 3), T(2, 4)), {"dim": 0}, r"shapes \(2, 3\) and \(2, 4\) differ off dim 0"),
    (
        "Concat",
        (TupleType((T(2, 3), T(2, 3, device=1))),),
        {},
        r"tensors live on different devices \(0, 1\); use Gather or Reduce",
    ),
    ("Split", (T(3, 2),), {"partitions": 4}, "size 3 into 4 parts leaves empty parts"),
    ("Split", (T(3, 2),), {"partitions": 0}, "attribute partitions=0 is not an integer >= 1"),
    ("Sum", (T(2, 3), T(3, 2)), {}, r"tensor 1 has shape \(3, 2\), tensor 0 has \(2, 3\)"),
    ("Sum", (T(2), T(2, dtype=I64)), {}, "different dtypes"),
    ("ReduceSum", (T(2, 3),), {"axes": (1, -1)}, "name an axis twice"),
    ("BroadcastTo", (T(2, 3),), {"shape": (4, 3)}, r"shape \(2, 3\) does not broadcast"),
    ("Cast", (T(2),), {"dtype": "float8"}, "attribute dtype='float8' is not a dtype"),
    ("Add", (T(2, 3), T(2, 3, dtype=F16)), {}, "different dtypes .*cast them first"),
    ("Mul", (T(2, 3), T(4, 3)), {}, r"shapes \(2, 3\) and \(4, 3\) do not broadcast"),
    (
        "Loss",
        (T(4, 3), T(3)),
        {},
        r"labels z have shape \(3,\), but logits of shape \(4, 3\) need labels of shape \(4,\)",
    ),
    ("Loss", (T(4, 3), T(4, 2)), {"kind": "mse"}, r"mse targets z have shape \(4, 2\)"),
    (
        "Loss",
        (T(4, 3), T(4)),
        {"kind": "hinge"},
        'attribute kind=\'hinge\' is not one of "cross_entropy", "mse"',
    ),
    ("Loss", (T(4, 3, dtype=I64), T(4)), {}, "y must hold floating-point values"),
    (
        "LossGrad",
        (T(4, 3), T(4)),
        {"denominator": -1},
        "attribute denominator=-1 is not a finite number >= 0",
    ),
    ("Embedding", (T(5, 3), T(4)), {}, "ids must be int64 or int32, got float32"),
    ("Embedding", (T(5), T(4, dtype=I64)), {}, r"table must be \(num_embeddings, hidden\)"),
    (
        "EmbeddingGrad",
        (T(4, dtype=I64), T(3, 2)),
        {"num_embeddings": 5},
        r"dy has shape \(3, 2\), ids of shape \(4,\) need",
    ),
    ("LayerNorm", (T(2, 3), T(2), T(2)), {}, r"gamma has shape \(2,\), it must be \(3,\)"),
    ("LayerNorm", (T(2, 3), T(3), T(3)), {"axis": 0}, "normalises the last axis only"),
    ("LayerNormGrad", (T(2, 3), T(3), T(2, 4)), {}, r"dy has shape \(2, 4\), x has \(2, 3\)"),
    ("SoftmaxGrad", (T(2, 3), T(3, 2)), {}, r"dy has shape \(3, 2\), y has \(2, 3\)"),
    ("CausalMask", (T(4),), {}, "needs a tensor of rank >= 2"),
    ("Scale", (T(4),), {"factor": "two"}, "attribute factor='two' is not a finite number"),
    ("SGDOptimizer", (T(2, 3), T(3, 2)), {}, r"dw has shape \(3, 2\), the parameter has"),
    ("Adam", (T(2), T(2), T(2), T(2)), {"step": 0}, "attribute step=0 is not an integer >= 1"),
    ("Adam", (T(2), T(2), T(3), T(2)), {}, r"m has shape \(3,\)"),
    ("MatMulGrad", (T(2, 3), T(3, 4), T(2, 5)), {}, r"dy has shape \(2, 5\), but a @ b"),
]


@pytest.mark.parametrize(
    ("op_type", "types", "attrs", "message"),
    CASES,
    ids=[f"{case[0]}-{i}" for i, case in enumerate(CASES)],
)
def test_bad_operands_raise_a_sentence_naming_the_op(op_type, types, attrs, message):
    with pytest.raises(VerifyError, match=rf"^{op_type}: (.*)?{message}"):
        add(op_type, *types, **attrs)


def test_type_rules_raise_type_rule_error_directly():
    rule = ir.get_op("Reshape").type_rule
    with pytest.raises(ir.TypeRuleError, match="cannot reshape"):
        rule(TypeContext((T(2, 3),), {"shape": (5,)}))


def test_missing_and_unknown_attributes_are_named():
    with pytest.raises(VerifyError, match="Split needs the attribute 'partitions'"):
        add("Split", T(4))
    with pytest.raises(VerifyError, match="Loss has no attribute 'kinds'"):
        add("Loss", T(4, 3), T(4), kinds="mse")


def test_dtype_rules():
    (loss,) = add("Loss", T(4, 3, dtype=F16), T(4, dtype=I64))
    assert loss.type == TensorType((), F16, 0)
    (dy,) = add("LossGrad", T(4, 3, dtype=F16), T(4, dtype=I64))
    assert dy.type.dtype == F16
    (parts,) = add("Split", T(5, dtype=I64), partitions=2)
    assert parts.type == TupleType((T(3, dtype=I64), T(2, dtype=I64)))
    (y,) = add("Embedding", T(7, 4, dtype=F16), T(2, 3, dtype=I64))
    assert y.type == T(2, 3, 4, dtype=F16)
    (ids,) = add("Concat", T(2, dtype=I64), T(3, dtype=I64))
    assert ids.type == T(5, dtype=I64)
    (c,) = add("Cast", T(2, 3, dtype=I64), dtype="float32")
    assert c.type == T(2, 3)


def test_split_and_concat_of_a_tuple_stay_on_the_device():
    (parts,) = add("Split", T(7, 2, device=3), partitions=3)
    assert [e.shape for e in parts.type.elements] == [(3, 2), (2, 2), (2, 2)]
    assert parts.type.devices == (3, 3, 3)
    (whole,) = add("Concat", parts.type, dim=0)
    assert whole.type == T(7, 2, device=3)
    (total,) = add("Sum", TupleType((T(2, device=1), T(2, device=1))))
    assert total.type == T(2, device=1)
    with pytest.raises(VerifyError, match=r"Sum: .*different devices.*Reduce"):
        add("Sum", TupleType((T(2, device=1), T(2, device=2))))
