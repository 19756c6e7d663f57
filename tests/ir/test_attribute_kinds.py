"""Attributes of the wrong kind are refused wherever ops are made (issue 17, class 3).

Each op's registry record declares its attributes' kinds (``ir.attr_kinds``) and the one
checker, ``ir.verify.infer_types``, enforces them for the builder, the parser, the
transforms and ``verify``. Before, ``to_device=True``, ``"gpu1"`` or ``-3`` verified and
then did not print back, or ``simulate`` raised a bare TypeError later.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ir
from ir.attr_kinds import DEVICE
from ir.registry import REQUIRED, TypeContext
from ir.transforms import data_parallel, place
from ir.types import DeviceVar, DType, TensorType

OPS_WITH_ATTRIBUTES = [op for op in ir.all_ops() if op.attributes]

# Values of every kind and of none: what a user, a notebook or a fuzzer may pass.
ANY_VALUE = st.one_of(
    st.booleans(),
    st.none(),
    st.integers(-(10**30), 10**30),
    st.integers(-3, 70_000),
    st.floats(allow_nan=True, allow_infinity=True),
    st.complex_numbers(max_magnitude=10),
    st.text(max_size=6),
    st.sampled_from(["gpu1", "sum", "mse", "float16", "valid", "R", "S(0)", "d", "allreduce"]),
    st.lists(st.one_of(st.integers(-3, 9), st.booleans(), st.text(max_size=2)), max_size=4),
    st.lists(st.lists(st.integers(0, 3), max_size=3), max_size=3),
    st.dictionaries(st.integers(0, 3), st.lists(st.integers(0, 3), max_size=2), max_size=2),
    st.sampled_from([DType.float16, np.int64(2), np.float32(0.5), object(), {"wB": 1}]),
)


def _contains_device_var(v) -> bool:
    if isinstance(v, DeviceVar):
        return True
    if isinstance(v, (list, tuple)):
        return any(_contains_device_var(x) for x in v)
    return False


def test_every_attribute_declares_a_kind_that_its_default_has():
    for op in ir.all_ops():
        for a in op.attributes:
            assert a.kind is not None, f"{op.name}.{a.name} declares no kind"
            if a.default is not REQUIRED:
                assert a.kind.accepts(a.default), f"{op.name}.{a.name}={a.default!r}"


def test_every_registry_example_has_attributes_of_their_kinds():
    for op in ir.all_ops():
        for scale in (1, 2, 3):
            for example in op.extra["examples"](scale):
                attrs = op.complete_attributes(example.attributes)
                for a in op.attributes:
                    assert a.kind.accepts(attrs[a.name]), (op.name, a.name, attrs[a.name])


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_a_value_outside_an_attributes_kind_is_refused_by_the_builder_naming_it(data):
    op = data.draw(st.sampled_from(OPS_WITH_ATTRIBUTES), label="op")
    attr = data.draw(st.sampled_from(op.attributes), label="attribute")
    value = data.draw(ANY_VALUE, label="value")
    example: TypeContext = op.extra["examples"](1)[0]
    attrs = {**example.attributes, attr.name: value}
    b = ir.FunctionBuilder("f")
    inputs = [b.input(f"x{i}", t) for i, t in enumerate(example.input_types)]
    try:
        node = b.add_op(op.name, inputs, attrs, subfunctions=example.subfunctions)
    except ir.VerifyError as e:
        if not attr.kind.accepts(value):
            assert str(e).startswith(f"{op.name}: attribute {attr.name}=")
        return
    assert attr.kind.accepts(value), f"{op.name} took {attr.name}={value!r}"
    f = b.finish(list(node.outputs))
    if not _contains_device_var(value):  # a device variable needs a pmap body to print in
        again = ir.parse(str(f))
        assert again.is_equivalent(f) and str(again) == str(f)


LITERALS = [
    *("True", "False", "None", "?", '"gpu1"', '"sum"', "-3", "0", "1", "2", "3", "1.5"),
    *("inf", "-inf", "nan", "1e400", "[1, 2]", "[True]", "[]", '["a", "b"]', "[0..3]"),
    *("{1: 2}", "{1: [2, 3]}", "float32", "[[0, 1], [2, 3]]", "[-1, 16]", "[2, 16]"),
]
TEMPLATES = [
    "y = Send(x, to_device={v})",
    "y = Scatter(x, devices={v})",
    "y = Scatter(x, dim={v}, devices=[1, 2])",
    "y = Reshape(x, shape={v})",
    "y = Slice(x, axis={v}, start=0)",
    "y = Slice(x, axis=0, start=0, end={v})",
    "y = Softmax(x, axis={v})",
    "y = Cast(x, dtype={v})",
    "y = ReduceSum(x, axes={v})",
    "y = ReduceSum(x, keepdims={v})",
    "y = Scale(x, factor={v})",
    "y = Split(x, partitions={v})",
    "y = Transpose(x, perm={v})",
    "y = Constant(value={v}, shape=[2], device=0)",
    "ys = Scatter(x, devices=[1, 2])\n    y = AllReduce(ys, op={v})",
    "ys = Scatter(x, devices=[1, 2])\n    y = AllGather(ys, groups={v})",
    "ys = Scatter(x, devices=[1, 2])\n    y = Gather(ys, to_device={v})",
    'y = Shard(x, mesh={v}, devices=[0, 1], placements=["R"])',
]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(TEMPLATES), st.sampled_from(LITERALS))
def test_attribute_literals_of_the_wrong_kind_are_located_parse_errors(template: str, v: str):
    text = f"def f(x: Tensor[(8, 4), 0]):\n    {template.format(v=v)}\n    return y"
    try:
        f = ir.parse(text)
    except ir.ParseError as e:
        assert e.source_line == text.split("\n")[e.line - 1]
        return
    for op in f.ops:
        record = ir.get_op(op.op_type)
        for a in record.attributes:
            assert a.kind.accepts(op.attributes[a.name]), (op.op_type, a.name)
    again = ir.parse(str(f))
    assert again.is_equivalent(f) and str(again) == str(f)


def _mlp() -> ir.Function:
    b = ir.FunctionBuilder("mlp")
    wa = b.input("wA", TensorType((4, 8), DType.float64, 0))
    wb = b.input("wB", TensorType((8, 3), DType.float64, 0))
    x = b.input("x", TensorType((6, 4), DType.float64, 0))
    a = b.call("MatMul", x, wa, name="a")
    return b.finish(b.call("MatMul", a, wb, name="y"))


@settings(max_examples=80, deadline=None)
@given(st.lists(ANY_VALUE, min_size=2, max_size=2))
def test_transforms_refuse_devices_of_the_wrong_kind_with_a_project_error(devices):
    try:
        g = data_parallel(_mlp(), 2, devices)
    except ir.DistIRError:
        return
    assert all(DEVICE.accepts(d) and d is not None for d in devices), devices
    assert ir.parse(str(g)).is_equivalent(g)


@settings(max_examples=80, deadline=None)
@given(ANY_VALUE)
def test_place_refuses_a_device_of_the_wrong_kind_with_a_project_error(device):
    try:
        g = place(_mlp(), {"wB": device})
    except ir.DistIRError:
        return
    assert DEVICE.accepts(device), device
    if not _contains_device_var(device):
        assert ir.parse(str(g)).is_equivalent(g)


@pytest.mark.parametrize("value", [True, "gpu1", -3, {"peer": 1}, 1.0, 70_000])
def test_the_reported_to_device_values_are_refused(value):
    b = ir.FunctionBuilder("f")
    x = b.input("x", TensorType((2,), device=0))
    with pytest.raises(ir.VerifyError, match=r"^Send: attribute to_device=.* is not a device"):
        b.call("Send", x, to_device=value)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.integers(-(2**70), 2**70),
            st.integers(-2, 70_000),
            st.booleans(),
            st.floats(-2, 70_000),
            st.none(),
            st.just(DeviceVar("d")),
            st.text(max_size=2),
        ),
        max_size=6,
    )
)
def test_a_list_checked_at_once_is_accepted_as_item_by_item(values: list):
    """The C-level check of a list of ints (``AttrKind.every``, for groups of 16,384 device
    ids) decides as checking each item does."""
    from ir.attr_kinds import DEVICES, GROUPS, INT, NONNEG_INT, POS_INT, SHAPE, sequence_of

    for kind in (DEVICE, INT, NONNEG_INT, POS_INT):
        one_by_one = all(kind.accepts(x) for x in values)
        assert sequence_of(kind).accepts(values) == one_by_one
        assert sequence_of(kind).accepts(tuple(values)) == one_by_one
    assert DEVICES.accepts(values) == all(DEVICE.accepts(x) for x in values)
    assert SHAPE.accepts(values) == all(NONNEG_INT.accepts(x) for x in values)
    grouped = bool(values) and all(NONNEG_INT.accepts(x) for x in values)
    assert GROUPS.accepts([values, [0]]) == grouped
