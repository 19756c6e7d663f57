"""The small model-zoo CNNs that the ``onnx`` package ships (``onnx/backend/test/data/light``:
AlexNet, DenseNet-121, Inception v1 and v2, ResNet-50, ShuffleNet, SqueezeNet, VGG-19,
ZFNet-512; opset 9) read by ``ir.from_onnx`` and executed equal to onnxruntime.

The files hold their weights as ``ConstantOfShape`` nodes: every weight uniform, so
that every class gets the same logit (up to float rounding, which the softmax then
magnifies: a uniform net proves nothing). Each weight is replaced by a random one of its
shape, scaled as He et al. (2015) initialise a layer, before both runtimes run it.
"""

from __future__ import annotations

import math
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

import ir
from ir.importers import OnnxConversionWarning

onnx = pytest.importorskip("onnx", reason="the importers extra (onnx) is not installed")
ort = pytest.importorskip("onnxruntime", reason="the importers extra (onnxruntime) is missing")

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
ZOO = sorted(p.stem.removeprefix("light_") for p in LIGHT.glob("light_*.onnx"))
# Dense layers of 10^8 weights: seconds to draw, serialise and check each (-m slow)
LARGE = ("bvlc_alexnet", "vgg19", "zfnet512")


def with_random_weights(model, seed: int = 0):
    """``model`` with each ``ConstantOfShape`` weight an initializer of random values:
    rank >= 2 (convolution and dense kernels) normal with variance 2 / fan-in, rank 1
    (biases, batch-norm statistics) uniform in [0.5, 1.5] (variances stay positive)."""
    rng = np.random.default_rng(seed)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    shapes = {t.name: onnx.numpy_helper.to_array(t) for t in out.graph.initializer}
    kept = []
    for node in out.graph.node:
        if node.op_type != "ConstantOfShape":
            kept.append(node)
            continue
        shape = tuple(int(d) for d in shapes[node.input[0]])
        if len(shape) >= 2:
            array = rng.standard_normal(shape) * math.sqrt(2.0 / math.prod(shape[1:]))
        else:
            array = rng.uniform(0.5, 1.5, shape)
        out.graph.initializer.append(
            onnx.numpy_helper.from_array(array.astype(np.float32), node.output[0])
        )
        # IR version 3 (these files) lists every initializer among the graph's inputs
        out.graph.input.append(
            onnx.helper.make_tensor_value_info(node.output[0], onnx.TensorProto.FLOAT, shape)
        )
    del out.graph.node[:]
    out.graph.node.extend(kept)
    return out


def test_the_package_ships_the_nine_zoo_cnns():
    assert len(ZOO) == 9 and set(LARGE) < set(ZOO)


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in LARGE else n for n in ZOO]
)
def test_a_zoo_cnn_executes_equal_to_onnxruntime(name: str):
    light = onnx.load(LIGHT / f"light_{name}.onnx")
    model = with_random_weights(light)
    initializers = {t.name for t in model.graph.initializer}
    (data,) = [v for v in model.graph.input if v.name not in initializers]
    shape = [d.dim_value for d in data.type.tensor_type.shape.dim]
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    (want,) = ort.InferenceSession(model.SerializeToString(), options).run(None, {data.name: x})
    with pytest.warns(OnnxConversionWarning, match="opset 9 converted to opset 13"):
        f, weights = ir.from_onnx(model)
    # every random weight comes back as a weight (none folded into a constant)
    replaced = [n.output[0] for n in light.graph.node if n.op_type == "ConstantOfShape"]
    assert all(re.sub(r"\W", "_", name) in weights for name in replaced)
    (image,) = [v.name for v in f.inputs if v.name not in weights]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        (got,) = ir.execute(f, {**weights, image: x})
    assert got.shape == want.shape and got.dtype == want.dtype
    assert np.std(want) > 1e-4  # the classes differ: a real comparison
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-6)
