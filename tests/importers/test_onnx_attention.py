"""The fused ``Attention`` op through ONNX: written as ONNX's own ``Attention`` (opset 23),
run by onnxruntime equal to ``ir.execute``, and read back as one ``Attention`` op."""

from __future__ import annotations

import numpy as np
import pytest

import ir
from ir import DType, TensorType
from ir.importers import OnnxError

onnx = pytest.importorskip("onnx", reason="the importers extra (onnx) is not installed")
ort = pytest.importorskip("onnxruntime", reason="the importers extra (onnxruntime) is missing")

F32 = DType.float32


def _attentions() -> ir.Function:
    """Square causal, GQA, a decode step on a cache (bottom-right), a padding mask with a
    bottom-right causal diagonal, an additive mask with a scale."""
    b = ir.FunctionBuilder("attentions")

    def qkv(name, hq, hkv, sq, sk, d=4):
        return (
            b.input(f"{name}_q", TensorType((2, hq, sq, d), F32, 0)),
            b.input(f"{name}_k", TensorType((2, hkv, sk, d), F32, 0)),
            b.input(f"{name}_v", TensorType((2, hkv, sk, d), F32, 0)),
        )

    keep = b.input("keep", TensorType((2, 1, 1, 7), DType.bool, 0))
    bias = b.input("bias", TensorType((3, 7), F32, 0))
    outs = [
        b.call("Attention", *qkv("square", 2, 2, 5, 5), causal=True, name="square"),
        b.call("Attention", *qkv("gqa", 4, 2, 5, 5), causal=True, name="gqa"),
        b.call("Attention", *qkv("decode", 4, 1, 1, 7), causal=True, name="decode"),
        b.call("Attention", *qkv("padded", 2, 2, 3, 7), keep, causal=True, name="padded"),
        b.call("Attention", *qkv("biased", 2, 2, 3, 7), bias, scale=0.3, name="biased"),
    ]
    return b.finish(outs)


def _arguments(f: ir.Function) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    args = {}
    for v in f.inputs:
        if v.type.dtype is DType.bool:
            keep = rng.random(v.type.shape) < 0.7
            keep[..., -1] = True  # every query keeps its own (last) key
            args[v.name] = keep
        else:
            args[v.name] = rng.standard_normal(v.type.shape).astype(np.float32)
    return args


def _session(model) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options)


def test_attention_runs_in_onnxruntime_and_reads_back_as_one_op(tmp_path):
    f = _attentions()
    args = _arguments(f)
    want = ir.execute(f, args)
    path = tmp_path / "attention.onnx"
    model = ir.to_onnx(f, path)
    assert [o.version for o in model.opset_import] == [23]
    assert [n.op_type for n in model.graph.node].count("Attention") == 5
    got = _session(model).run(None, args)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    back, constants = ir.from_onnx(path)
    assert [op.op_type for op in back.ops].count("Attention") == 5
    for g, w in zip(ir.execute(back, {**args, **constants}), want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)


def test_a_program_without_attention_keeps_opset_20():
    b = ir.FunctionBuilder("plain")
    x = b.input("x", TensorType((2, 3), F32, 0))
    model = ir.to_onnx(b.finish([b.call("Relu", x)]))
    assert [o.version for o in model.opset_import] == [20]


def _logits_only(f: ir.Function) -> ir.Function:
    """``f`` up to its logits (ONNX has no form of the registry's Loss)."""
    b = ir.FunctionBuilder(f.name)
    env = {v: b.input(v.name, v.type) for v in f.inputs if v.name != "labels"}
    for op in f.ops[:-1]:
        env.update(zip(op.outputs, ir.builder.rebuild_op(b, op, [env[v] for v in op.inputs])))
    return b.finish([env[f.value("logits")]])


def test_the_fused_gpt_runs_in_onnxruntime_equal_to_execute():
    f = _logits_only(ir.models.gpt(2, 6, 16, 4, 11, 2, kv_heads=2))
    assert [op.op_type for op in f.ops].count("Attention") == 2
    rng = np.random.default_rng(0)
    args = {
        v.name: rng.integers(0, 11, v.type.shape)
        if v.type.dtype is DType.int64
        else (0.3 * rng.standard_normal(v.type.shape)).astype(np.float32)
        for v in f.inputs
    }
    model = ir.to_onnx(f)
    got = _session(model).run(None, args)
    for g, w in zip(got, ir.execute(f, args), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def _node_model(inputs, node, output_shape):
    helper, tp = onnx.helper, onnx.TensorProto
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, tp.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info("y", tp.FLOAT, output_shape)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])


def test_a_3d_attention_with_head_counts_imports_equal_to_onnxruntime():
    inputs = [("q", [2, 5, 8 * 4]), ("k", [2, 5, 2 * 4]), ("v", [2, 5, 2 * 4])]
    node = onnx.helper.make_node(
        "Attention", ["q", "k", "v"], ["y"], q_num_heads=8, kv_num_heads=2, is_causal=1
    )
    model = _node_model(inputs, node, [2, 5, 32])
    rng = np.random.default_rng(1)
    feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in inputs}
    f = ir.from_onnx(model)
    assert "Attention" in [op.op_type for op in f.ops]
    np.testing.assert_allclose(
        ir.execute(f, feeds)[0], _session(model).run(None, feeds)[0], rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize(
    ("names", "outputs", "attrs", "message"),
    [
        (["q", "k", "v"], ["y"], {"softcap": 30.0}, "softcap=30.0"),
        (["q", "k", "v"], ["y", "", "", "qk"], {}, "the qk_matmul_output output"),
    ],
)
def test_attention_the_importer_cannot_read_is_refused_naming_the_node(
    names, outputs, attrs, message
):
    inputs = [("q", [1, 2, 2, 4]), ("k", [1, 2, 5, 4]), ("v", [1, 2, 5, 4])]
    node = onnx.helper.make_node("Attention", names, outputs, name="attn", **attrs)
    model = _node_model(inputs, node, [1, 2, 2, 4])
    if len(outputs) > 1:
        info = onnx.helper.make_tensor_value_info("qk", onnx.TensorProto.FLOAT, [1, 2, 2, 5])
        model.graph.output.append(info)
    with pytest.raises(OnnxError, match=f"Attention-23 x1 \\(first: node 'attn'\\): {message}"):
        ir.from_onnx(model)


def test_a_cached_and_a_top_left_causal_attention_import_equal_to_onnxruntime():
    """A KV cache (past_key, past_value): concatenated, the present outputs, the causal
    diagonal bottom-right; no cache and 2 queries over 5 keys: ONNX's top-left diagonal,
    read as an explicit mask."""
    helper, tp = onnx.helper, onnx.TensorProto
    shapes = {"q": [1, 2, 2, 4], "k": [1, 2, 2, 4], "v": [1, 2, 2, 4]}
    shapes.update({"pk": [1, 2, 3, 4], "pv": [1, 2, 3, 4], "k5": [1, 2, 5, 4], "v5": [1, 2, 5, 4]})
    nodes = [
        helper.make_node(
            "Attention", ["q", "k", "v", "", "pk", "pv"], ["y", "kk", "vv"], is_causal=1
        ),
        helper.make_node("Attention", ["q", "k5", "v5"], ["z"], is_causal=1),
    ]
    outputs = {"y": [1, 2, 2, 4], "kk": [1, 2, 5, 4], "vv": [1, 2, 5, 4], "z": [1, 2, 2, 4]}
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, tp.FLOAT, s) for n, s in shapes.items()],
        [helper.make_tensor_value_info(n, tp.FLOAT, s) for n, s in outputs.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    rng = np.random.default_rng(2)
    feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    f, mask = ir.from_onnx(model)  # the top-left mask: a constant input
    assert [op.op_type for op in f.ops].count("Attention") == 2
    got = ir.execute(f, {**feeds, **mask})
    for g, w in zip(got, _session(model).run(None, feeds), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
