"""``ir.to_onnx`` and ``ir.from_onnx``: proofs by execution against onnxruntime, and seed 001's
multi-device annotations written, validated and read back.

* An exported program runs in onnxruntime equal to ``ir.execute`` (a program using
  every exported op family, and GPT-2 and Llama imported from torch).
* A program read back executes equal; a sharded and pipeline-staged program comes
  back with the same layouts and stages, and its propagated program executes equal.
* Corrupt and truncated files, unknown opsets and ops, and invalid or contradictory
  annotation fields get project errors that name the node and the field.
"""

from __future__ import annotations

import numpy as np
import pytest

import ir
from ir import DType, TensorType
from ir.importers import OnnxAnnotationError, OnnxError
from ir.importers.onnx_devices import check_annotations
from ir.sharding import Mesh, R, S, annotate, annotate_stages, pipeline_stages, propagate
from ir.sharding.annotations import collect

onnx = pytest.importorskip("onnx", reason="the importers extra (onnx) is not installed")
ort = pytest.importorskip("onnxruntime", reason="the importers extra (onnxruntime) is missing")

F32 = DType.float32


def _every_family() -> ir.Function:
    """A program with every op family to_onnx writes."""
    b = ir.FunctionBuilder("families")
    x = b.input("x", TensorType((2, 4, 6), F32, 0))
    ids = b.input("ids", TensorType((2, 4), DType.int64, 0))
    table = b.input("table", TensorType((10, 6), F32, 0))
    w1 = b.input("w1", TensorType((6, 8), F32, 0))
    g = b.input("g", TensorType((8,), F32, 0))
    beta = b.input("beta", TensorType((8,), F32, 0))
    w2 = b.input("w2", TensorType((8, 4), F32, 0))
    h = b.call("Add", x, b.call("Embedding", table, ids), name="emb")
    h = b.call("Gelu", b.call("MatMul", h, w1, name="fc"), name="act")
    h = b.call("LayerNorm", h, g, beta, name="norm")
    rms = b.call(
        "Rsqrt", b.call("ReduceMean", b.call("Pow", h, exponent=2.0), axes=(-1,), keepdims=True)
    )
    h = b.call("Mul", h, rms, name="rms")
    h = b.call("Sigmoid", b.call("Scale", h, factor=0.5), name="gate")
    left = b.call("Slice", h, axis=2, start=0, end=4, name="left")
    right = b.call("Slice", h, axis=2, start=4, end=8, name="right")
    rot = b.call("Concat", b.call("Neg", right), left, dim=2, name="rot")
    h = b.call("Add", b.call("Mul", h, b.call("Cos", h)), b.call("Mul", rot, b.call("Sin", h)))
    h = b.call("Sub", h, b.call("Div", h, b.call("Exp", b.call("Tanh", h))), name="mix")
    s = b.call("MatMul", h, b.call("Transpose", h, perm=(0, 2, 1)), name="scores")
    s = b.call("Softmax", b.call("CausalMask", s), axis=-1, name="probs")
    y = b.call("MatMul", s, b.call("MatMul", h, w2), name="ctx")
    y = b.call("Reshape", y, shape=(8, 4), name="flat")
    zero = b.call("Constant", value=0.0, shape=(8, 4), device=0, name="zero")
    y = b.call("Where", b.call("Cast", b.call("Relu", y), dtype="bool"), y, zero, name="kept")
    y = b.call("BroadcastTo", b.call("ReduceSum", y, axes=(0,), keepdims=True), shape=(3, 4))
    return b.finish([b.call("Sqrt", b.call("Erf", b.call("Relu", y))), s])


def _arguments(f: ir.Function, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for v in f.inputs:
        if v.type.dtype is DType.int64:
            out.append(rng.integers(0, 10, v.type.shape).astype(np.int64))
        else:
            out.append(rng.standard_normal(v.type.shape).astype(np.float32))
    return out


def _session(path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3  # initializers listed as inputs are overridable on purpose
    return ort.InferenceSession(str(path), options)


def test_every_exported_family_runs_in_onnxruntime_equal_to_execute(tmp_path):
    f = _every_family()
    args = _arguments(f)
    path = tmp_path / "families.onnx"
    ir.to_onnx(f, path)
    feeds = {v.name: a for v, a in zip(f.inputs, args)}
    got = _session(path).run(None, feeds)
    for g, w in zip(got, ir.execute(f, args), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    # CausalMask's mask is a constant tensor in ONNX: it comes back as an input with its array
    back, constants = ir.from_onnx(path)
    assert list(constants) == ["onnx__above_diagonal_11"]
    for g, w in zip(ir.execute(back, {**feeds, **constants}), ir.execute(f, args), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)


def test_windows_and_padding_run_in_onnxruntime_equal_to_execute(tmp_path):
    """Pad, and the NHWC window ops (strided, padded) as ONNX's NCHW ones."""
    b = ir.FunctionBuilder("windows")
    x = b.input("x", TensorType((2, 9, 8, 3), F32, 0))
    w = b.input("w", TensorType((3, 3, 3, 4), F32, 0))
    y = b.call("Conv2D", x, w, padding=(1, 1, 0, 1), stride=(2, 1), name="y")
    pooled = b.call("MaxPool2D", y, kernel=2, stride=1, padding=(0, 1, 1, 0), name="m")
    mean = b.call("AvgPool2D", y, kernel=(3, 2), stride=2, padding=(1, 1, 1, 1), name="a")
    padded = b.call("Pad", pooled, axis=2, before=1, after=2, name="p")
    f = b.finish([padded, mean])
    args = _arguments(f)
    path = tmp_path / "windows.onnx"
    ir.to_onnx(f, path)
    got = _session(path).run(None, {v.name: a for v, a in zip(f.inputs, args)})
    for g, want in zip(got, ir.execute(f, args), strict=True):
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("model", ["gpt2", "llama", "bert"])
def test_imported_transformer_runs_in_onnxruntime_equal_to_torch(model: str, tmp_path):
    from .conftest import MODELS, torch

    lm = MODELS[model]()
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(3))
    f, args = ir.from_torch(lm, (ids,))
    weights = {v.name: a for v, a in zip(f.inputs, args) if v.name != "ids"}
    ids_array = args[[v.name for v in f.inputs].index("ids")]
    path = tmp_path / f"{model}.onnx"
    ir.to_onnx(f, path, weights=weights)
    (logits,) = _session(path).run(None, {"ids": ids_array})
    np.testing.assert_allclose(logits, lm(ids).detach().numpy(), rtol=1e-4, atol=1e-5)
    back, read = ir.from_onnx(path)
    assert set(read) == set(weights)
    (again,) = ir.execute(back, {**read, "ids": ids_array})
    np.testing.assert_allclose(again, logits, rtol=1e-5, atol=1e-6)


def _mlp() -> ir.Function:
    b = ir.FunctionBuilder("mlp")
    x = b.input("x", TensorType((8, 6), F32, 0))
    w1 = b.input("w1", TensorType((6, 16), F32, 0))
    w2 = b.input("w2", TensorType((16, 4), F32, 0))
    h = b.call("Relu", b.call("MatMul", x, w1, name="h"), name="a")
    return b.finish([b.call("MatMul", h, w2, name="y")])


def _annotations(f: ir.Function) -> dict[str, str]:
    layouts, _ = collect(f, None, None)
    return {v.name: str(layout) for v, layout in layouts.items()}


@pytest.mark.parametrize(
    "given",
    [
        {"w1": (Mesh((2,)), [S(1)]), "w2": (Mesh((2,)), [S(0)])},  # Megatron's MLP
        {"x": (Mesh((2, 2)), [S(0), R]), "w1": (Mesh((2, 2)), [R, S(1)])},  # data x tensor
        {"a": (Mesh((2, 2), (3, 1, 0, 2)), [R, S(0)])},  # groups, devices out of order
    ],
    ids=["megatron", "2x2", "groups"],
)
def test_sharded_program_round_trips_with_its_layouts_and_executes_equal(given, tmp_path):
    f = annotate(_mlp(), given)
    path = tmp_path / "sharded.onnx"
    model = ir.to_onnx(f, path)
    assert model.configuration[0].name == "distir"
    annotated = [n for n in model.graph.node if n.device_configurations]
    assert annotated and all(
        n.device_configurations[0].configuration_id == "distir" for n in annotated
    )
    back = ir.from_onnx(path)
    assert _annotations(back) == _annotations(f)
    args = _arguments(f)
    want = ir.execute(_mlp(), args)
    for program in (f, back):
        distributed, _ = propagate(program)
        np.testing.assert_allclose(
            ir.execute_step(distributed, args, rtol=1e-5)[0], want[0], rtol=1e-5
        )


def test_pipeline_stages_round_trip(tmp_path):
    f = annotate_stages(_mlp(), {"h": 0, "a": 1, "y": 1})
    model = ir.to_onnx(f, tmp_path / "staged.onnx")
    stages = {
        n.name: n.device_configurations[0].pipeline_stage
        for n in model.graph.node
        if n.device_configurations
    }
    assert stages == {"h": 0, "a": 1, "y": 1}
    back = ir.from_onnx(tmp_path / "staged.onnx")
    by_name = {op.outputs[0].name: s for op, s in pipeline_stages(back).items()}
    assert by_name == {"h": 0, "a": 1, "y": 1}
    args = _arguments(f)
    np.testing.assert_allclose(ir.execute(back, args)[0], ir.execute(f, args)[0])


# -- bad input -------------------------------------------------------------------------


def test_corrupt_and_truncated_files_get_a_project_error(tmp_path):
    good = tmp_path / "good.onnx"
    ir.to_onnx(_mlp(), good)
    data = good.read_bytes()
    truncated = tmp_path / "truncated.onnx"
    truncated.write_bytes(data[: len(data) // 2])
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\xff\x00 this is not protobuf \x13\x37" * 8)
    for path in (truncated, garbage):
        with pytest.raises(OnnxError, match=path.name):
            ir.from_onnx(path)
    with pytest.raises(OnnxError, match="no such file"):
        ir.from_onnx(tmp_path / "missing.onnx")


def _sharded_model():
    f = annotate(_mlp(), {"w1": (Mesh((2,)), [S(1)]), "h": (Mesh((2,)), [S(1)])})
    return ir.to_onnx(f)


def _spec(model, node: str, tensor: str):
    (n,) = [n for n in model.graph.node if n.name == node]
    return next(s for s in n.device_configurations[0].sharding_spec if s.tensor_name == tensor)


def _set_device(model):
    _spec(model, "h", "w1").device[1] = 7


def _set_axis(model):
    _spec(model, "h", "w1").sharded_dim[0].axis = 2


def _set_shards(model):
    _spec(model, "h", "w1").sharded_dim[0].simple_sharding[0].num_shards = 4


def _set_dim_value(model):
    _spec(model, "h", "w1").sharded_dim[0].simple_sharding[0].dim_value = 99


def _set_configuration(model):
    (n,) = [n for n in model.graph.node if n.name == "h"]
    n.device_configurations[0].configuration_id = "elsewhere"


def _set_tensor_name(model):
    _spec(model, "h", "w1").tensor_name = "w2"


def _set_group_key(model):
    entry = _spec(model, "h", "w1").index_to_device_group_map.add()
    entry.key, entry.value[:] = 5, [0]


def _contradict(model):
    # node "a" reads h: make it expect h split along the other axis than "h" writes it
    dim = _spec(model, "a", "h").sharded_dim[0]
    dim.axis, dim.simple_sharding[0].dim_value = 0, 8


@pytest.mark.parametrize(
    ("corrupt", "message"),
    [
        (_set_device, r"node 'h' device_configurations\[0\]\.sharding_spec\[0\]\.device\[1\]: 7 "),
        (_set_axis, r"node 'h' .*sharded_dim\[0\]\.axis 2 is out of range .*'w1' of rank 2"),
        (_set_shards, r"num_shards 4 .* device lists 2 entries|multiply to 4"),
        (_set_dim_value, r"sharded_dim\[0\]\.simple_sharding\[0\]\.dim_value 99 contradicts"),
        (_set_configuration, r"configuration_id 'elsewhere' names no device configuration"),
        (_set_tensor_name, r"tensor_name 'w2' is neither an input nor an output"),
        (_set_group_key, r"index_to_device_group_map\[0\]\.key 5 is not in"),
        (_contradict, r"node 'a' sharding_spec\[0\] gives 'h' .* node 'h' sharding_spec"),
    ],
    ids=lambda p: getattr(p, "__name__", "")[1:] if callable(p) else "",
)
def test_invalid_annotations_are_located_errors(corrupt, message):
    model = _sharded_model()
    corrupt(model)
    with pytest.raises(OnnxAnnotationError, match=message):
        ir.from_onnx(model)


def test_the_writer_validates_with_the_same_checks():
    model = _sharded_model()
    shapes = {"x": (8, 6), "w1": (6, 16), "w2": (16, 4), "h": (8, 16), "a": (8, 16), "y": (8, 4)}
    check_annotations(model, shapes)  # what to_onnx wrote is valid
    _set_axis(model)
    with pytest.raises(OnnxAnnotationError, match="axis 2 is out of range"):
        check_annotations(model, shapes)


def test_a_partial_layout_has_no_onnx_form():
    f = annotate(_mlp(), {"y": (Mesh((2,)), ["P(sum)"])})
    with pytest.raises(ir.DistIRError, match="Partial"):
        ir.to_onnx(f)


def test_an_explicitly_distributed_program_is_refused():
    distributed, _ = propagate(annotate(_mlp(), {"w1": (Mesh((2,)), [S(1)])}))
    with pytest.raises(OnnxError, match="export the annotated program"):
        ir.to_onnx(distributed)
