"""``ir.from_onnx`` on files as they come: older opsets converted (and said so), every node
it cannot read listed at once (with its op version, opset and node), a pipeline-staged
file read back, seed 001's annotations round-tripped on every op ``to_onnx`` writes,
and the ops issue 29 added written and read equal to onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

import ir
from ir import DType, TensorType
from ir.importers import OnnxConversionWarning, OnnxError
from ir.sharding import Mesh, S, annotate, annotate_stages, pipeline_stages
from ir.sharding.annotations import collect

onnx = pytest.importorskip("onnx", reason="the importers extra (onnx) is not installed")
ort = pytest.importorskip("onnxruntime", reason="the importers extra (onnxruntime) is missing")
from onnx import TensorProto, helper  # noqa: E402

F32 = DType.float32


def _model(nodes, inputs, outputs, opset: int, initializers=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _value(name: str, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, list(shape))


def _session(model) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options)


# -- opsets ----------------------------------------------------------------------------


def test_an_opset_11_file_is_converted_said_so_and_computes_the_same():
    """Softmax at opset 11 normalises the flattened trailing axes (axis=1 of (2, 3, 4): all
    12 entries of a row); the converter keeps that meaning at opset 13. (onnxruntime is the
    reference: onnx's own reference evaluator normalises along axis 1 alone.)"""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("Softmax", ["r"], ["y"], axis=1),
    ]
    model = _model(nodes, [_value("x", (2, 3, 4))], [_value("y", (2, 3, 4))], 11)
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    with pytest.warns(OnnxConversionWarning, match="opset 11 converted to opset 13"):
        f = ir.from_onnx(model)
    (want,) = _session(model).run(None, {"x": x})
    np.testing.assert_allclose(ir.execute(f, [x])[0], want, rtol=1e-6)
    assert np.allclose(want.sum(axis=(1, 2)), 1.0)  # the old meaning, not per axis 1


@pytest.mark.parametrize(
    ("opset", "message"),
    [(6, r"opset 6 predates opset 7 .*export the model again"), (99, r"opset 99 is newer")],
)
def test_opsets_outside_7_to_the_newest_are_refused(opset: int, message: str):
    model = _model(
        [helper.make_node("Relu", ["x"], ["y"])], [_value("x", (2,))], [_value("y", (2,))], 13
    )
    model.opset_import[0].version = opset
    with pytest.raises(OnnxError, match=message):
        ir.from_onnx(model)


# -- what cannot be read ---------------------------------------------------------------


def test_every_node_that_cannot_be_read_is_listed_with_its_version_opset_and_node():
    """Hardmax has no rule; the Relu after it is still read (on a placeholder typed by shape
    inference), and the TopK after that is listed too: nothing downstream is hidden, and
    no KeyError."""
    nodes = [
        helper.make_node("Hardmax", ["x"], ["a"], name="hard"),
        helper.make_node("Relu", ["a"], ["b"], name="relu"),
        helper.make_node("Hardmax", ["b"], ["c"], name="hard2"),
        helper.make_node("TopK", ["c", "k"], ["y", "i"], name="top"),
    ]
    k = onnx.numpy_helper.from_array(np.array([2], np.int64), "k")
    outputs = [_value("y", (2, 2)), _value("i", (2, 2), TensorProto.INT64)]
    model = _model(nodes, [_value("x", (2, 3))], outputs, 20, [k])
    with pytest.raises(OnnxError) as caught:
        ir.from_onnx(model)
    message = str(caught.value)
    assert "(opset 20): 3 node(s) cannot be imported" in message
    assert "Hardmax-13 x2 (first: node 'hard'): no registry translation" in message
    assert "TopK-11 x1 (first: node 'top'): no registry translation" in message
    assert "Relu" not in message.split("The importer reads")[0]


def test_a_node_after_one_of_unknown_type_is_counted_as_unchecked():
    nodes = [
        helper.make_node("Frobnicate", ["x"], ["a"], domain="example.com", name="odd"),
        helper.make_node("Relu", ["a"], ["y"]),
    ]
    model = _model(nodes, [_value("x", (2,))], [_value("y", (2,))], 20)
    model.opset_import.append(helper.make_opsetid("example.com", 1))
    with pytest.raises(OnnxError, match=r"domain 'example.com' is not read.*\n.*1 node\(s\) after"):
        ir.from_onnx(model)


def test_an_operand_that_must_be_a_constant_is_named():
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"], name="flat")]
    inputs = [_value("x", (2, 3)), _value("shape", (1,), TensorProto.INT64)]
    model = _model(nodes, inputs, [_value("y", (6,))], 20)
    with pytest.raises(OnnxError, match=r"Reshape-19 x1 \(first: node 'flat'\): operand 1 "):
        ir.from_onnx(model)


# -- annotations -----------------------------------------------------------------------


def _staged_program() -> ir.Function:
    """Ops whose ONNX forms carry helper Constants (shapes, axes, exponents, pads)."""
    b = ir.FunctionBuilder("staged")
    x = b.input("x", TensorType((4, 6), F32, 0))
    w = b.input("w", TensorType((6, 8), F32, 0))
    h = b.call("MatMul", x, w, name="h")
    r = b.call("Reshape", h, shape=(4, 2, 4), name="r")
    m = b.call("ReduceMean", b.call("Pow", r, exponent=2.0, name="sq"), axes=(-1,), keepdims=True)
    p = b.call("Pad", b.call("Mul", r, b.call("Rsqrt", m, name="rs"), name="n"), axis=2, after=1)
    return b.finish([b.call("Slice", p, axis=2, start=1, end=5, name="y")])


def _stages(f: ir.Function) -> dict[str, int]:
    return {op.outputs[0].name: s for op, s in pipeline_stages(f).items()}


def test_a_pipeline_staged_file_reads_back_with_its_stages():
    """The stage annotation sits on every node of an op, helper Constants included (the
    crash of issue 29: ``KeyError: 'onnx::axes_1'``)."""
    f = _staged_program()
    names = [op.outputs[0].name for op in f.ops]
    staged = annotate_stages(f, {name: (0 if k < 3 else 1) for k, name in enumerate(names)})
    model = ir.to_onnx(staged)
    assert any(n.op_type == "Constant" and n.device_configurations for n in model.graph.node)
    back = ir.from_onnx(model)
    assert _stages(staged).items() <= _stages(back).items()  # Rsqrt reads back as Sqrt, Div
    rng = np.random.default_rng(2)
    args = [rng.standard_normal(v.type.shape).astype(np.float32) for v in f.inputs]
    np.testing.assert_allclose(ir.execute(back, args)[0], ir.execute(f, args)[0], rtol=1e-6)


def _new_ops_program() -> ir.Function:
    """Every op issue 29 added that to_onnx writes."""
    b = ir.FunctionBuilder("added")
    x = b.input("x", TensorType((2, 6, 5, 4), F32, 0))
    w = b.input("w", TensorType((3, 3, 2, 6), F32, 0))
    k = b.input("k", TensorType((2, 2, 3, 6), F32, 0))
    y = b.call("Conv2D", x, w, groups=2, dilation=(1, 2), padding=(1, 1, 2, 2), name="conv")
    y = b.call("ConvTranspose2D", y, k, stride=(2, 1), groups=2, output_padding=(1, 0))
    y = b.call("Pad", y, axis=1, before=1, after=2, value=-0.5, name="padded")
    one = b.call("Constant", value=1.0, device=0, name="one")
    a = b.call("Log", b.call("Add", b.call("Abs", y, name="abs"), one), name="log")
    mx = b.call("ReduceMax", a, axes=(1,), keepdims=True, name="mx")
    mn = b.call("ReduceMin", a, axes=(1,), keepdims=True, name="mn")
    hi = b.call("Maximum", a, mn, name="hi")
    lo = b.call("Minimum", hi, mx, name="lo")
    pos = b.call("Power", b.call("Abs", lo), b.call("Sign", lo), name="pw")
    masks = [b.call("Compare", lo, mx, kind=k) for k in ("eq", "ne", "lt", "le", "gt", "ge")]
    both = b.call("Logical", masks[2], masks[5], kind="or", name="both")
    both = b.call("Logical", both, b.call("Not", masks[1]), kind="xor", name="either")
    rounded = [b.call(op, pos) for op in ("Floor", "Ceil", "Round")]
    z = b.call("Where", both, rounded[0], b.call("Add", rounded[1], rounded[2]), name="z")
    return b.finish([z, pos])


def test_the_added_ops_run_in_onnxruntime_and_read_back_equal():
    f = _new_ops_program()
    rng = np.random.default_rng(3)
    args = [rng.standard_normal(v.type.shape).astype(np.float32) for v in f.inputs]
    want = ir.execute(f, args)
    model = ir.to_onnx(f)
    got = _session(model).run(None, {v.name: a for v, a in zip(f.inputs, args)})
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
    back = ir.from_onnx(model)
    for g, w in zip(ir.execute(back, args), want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def test_annotations_round_trip_on_every_op_to_onnx_writes():
    """Every op of a program that uses every op family ``to_onnx`` writes carries a stage,
    and its weights a layout: all come back (the staged file included)."""
    from .test_onnx import _every_family

    for f in (_every_family(), _new_ops_program()):
        names = [op.outputs[0].name for op in f.ops]
        stages = {name: k * 3 // len(names) for k, name in enumerate(names)}
        weight = next(v for v in f.inputs if v.type.rank == 2 or v.type.rank == 4)
        layout = {weight.name: (Mesh((2,)), [S(weight.type.rank - 1)])}
        marked = annotate(annotate_stages(f, stages), layout)
        read = ir.from_onnx(ir.to_onnx(marked))
        back = read[0] if isinstance(read, tuple) else read
        assert _stages(marked).items() <= _stages(back).items()  # (Rsqrt: Sqrt, then Div)
        layouts = {v.name: lay for v, lay in collect(back, None, None)[0].items()}
        assert layouts == {v.name: lay for v, lay in collect(marked, None, None)[0].items()}
