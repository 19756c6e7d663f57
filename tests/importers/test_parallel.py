"""Imported models parallelise: data, tensor and pipeline parallelism of torch-imported
GPT-2 and Llama, each proven by execution (the distributed program computes the
module's logits) and simulated.

Data parallelism shards the token ids' batch axis; tensor parallelism annotates the
MLP weights Megatron's way (Llama: attention projections too); pipeline parallelism
puts the second half of the ops in stage 1 on device 1. Propagation derives the rest.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import ir
from ir.sharding import Mesh, S, annotate_stages, place_stages, propagate

from .conftest import LMS, MODELS, MeanSquare, llama_7b, torch

MESH = Mesh((2,))


def _leaves(t) -> list:
    """The tensor types of a (nested) per-device tuple type."""
    return [leaf for e in t.elements for leaf in _leaves(e)] if hasattr(t, "elements") else [t]


def _tensor_parallel(model: str, names: list[str]) -> dict:
    if model == "llama":  # torch Linear weights are (out, in)
        columns = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
        rows = ("o_proj", "down_proj")
        split = {n: (MESH, [S(0)]) for n in names if any(c in n for c in columns)}
        split.update({n: (MESH, [S(1)]) for n in names if any(r in n for r in rows)})
        return split
    # GPT-2's Conv1D weights are (in, out)
    split = {n: (MESH, [S(1)]) for n in names if n.endswith("mlp_c_fc_weight")}
    split.update({n: (MESH, [S(0)]) for n in names if n.endswith("mlp_c_fc_bias")})
    split.update({n: (MESH, [S(0)]) for n in names if n.endswith("mlp_c_proj_weight")})
    return split


@pytest.mark.parametrize("strategy", ["data", "tensor", "pipeline"])
@pytest.mark.parametrize("model", LMS)
def test_imported_transformer_parallelises_and_executes_equal(model: str, strategy: str):
    lm = MODELS[model]()
    ids = torch.randint(0, 64, (4, 8), generator=torch.Generator().manual_seed(5))
    f, args = ir.from_torch(lm, (ids,))
    want = lm(ids).detach().numpy()
    names = [v.name for v in f.inputs]
    if strategy == "data":
        distributed, _ = propagate(f, {"ids": (MESH, [S(0)])})
    elif strategy == "tensor":
        annotations = _tensor_parallel(model, names)
        assert len(annotations) >= 4
        distributed, _ = propagate(f, annotations)
    else:
        middle = f.ops[len(f.ops) // 2].outputs[0].name
        distributed = place_stages(annotate_stages(f, {middle: 1}), [0, 1])
    (logits,) = ir.execute_step(distributed, args, source=f, rtol=1e-5)
    np.testing.assert_allclose(logits, want, rtol=1e-4, atol=1e-5)
    result = ir.simulate(distributed, ir.Topology.preset("a100-hgx", 2))
    assert result.step_time_s > 0 and set(result.devices) == {0, 1}


def test_a_data_parallel_training_step_of_an_imported_model_equals_the_sequential_one():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.SiLU(), torch.nn.Linear(16, 3))
    x, target = torch.randn(8, 6), torch.randn(8, 3)
    f, args = ir.from_torch(MeanSquare(net.eval(), target), (x,))
    params = [v.name for v in f.inputs if v.name.startswith("module_")]
    step = ir.transforms.training(f, params=params, lr=0.1)
    want = ir.execute(step, args)
    distributed, _ = propagate(step, {"ids": (MESH, [S(0)]), "target": (MESH, [S(0)])})
    assert set(ir.simulate(distributed, ir.Topology.preset("a100-hgx", 2)).devices) == {0, 1}
    got = ir.execute_step(distributed, args, source=step, rtol=1e-5)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_a_llama_7b_shaped_model_on_the_meta_device_imports_and_simulates_on_8_gpus():
    """Shapes only (two of Llama-7B's 32 layers, at its widths, bf16): never executed.
    ``benchmarks/llama7b_simulation.py`` runs all 32 layers."""
    lm = llama_7b(2)
    ids = torch.empty((8, 2048), dtype=torch.long, device="meta")
    f, args = ir.from_torch(lm, (ids,))
    weights = [v for v in f.inputs if v.name.startswith("lm_")]
    assert sum(v.type.num_elements for v in weights) == sum(
        t.numel() for t in [*lm.parameters(), *lm.buffers()]
    )
    assert all(v.type.dtype is ir.DType.bfloat16 for v in weights if "proj" in v.name)
    assert all(a is None for v, a in zip(f.inputs, args) if v in weights)  # no arrays held
    topology = ir.Topology.preset("a100-hgx", 8)
    alone = ir.simulate(f, topology).step_time_s
    distributed, _ = propagate(f, {"ids": (Mesh((8,)), [S(0)])}, topology)
    result = ir.simulate(distributed, topology)
    assert set(result.devices) == set(range(8))
    assert result.step_time_s < alone / 2


@pytest.mark.parametrize(
    "degrees", [{"dp": 2}, {"pp": 2, "microbatches": 2}, {"dp": 2, "pp": 2, "microbatches": 2}]
)
@pytest.mark.parametrize("model", ["mlp", *LMS])
def test_the_ready_transforms_parallelise_imported_models(model: str, degrees: dict):
    """``T.parallelize`` (data, pipeline, both) on imported programs: the transforms find
    the weights through the transposes torch puts before MatMul, take the token ids for
    the batch, and fit BroadcastTo's and Reshape's static shapes to the shards."""
    torch.manual_seed(0)
    if model == "mlp":
        net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        module, inputs = net.eval(), (torch.randn(8, 6),)
    else:
        module = MODELS[model]()
        inputs = (torch.randint(0, 64, (4, 8), generator=torch.Generator().manual_seed(2)),)
    f, args = ir.from_torch(module, inputs)
    g = ir.transforms.parallelize(f, **degrees)
    if degrees == {"dp": 2}:  # the batch is what is split: each replica gets half the rows
        data = next(v for v in g.inputs if v.name == ("input" if model == "mlp" else "ids"))
        rows = inputs[0].shape[0]
        assert [t.shape[0] for t in _leaves(data.type)] == [rows // 2, rows // 2]
    devices = math.prod(n for k, n in degrees.items() if k in ("dp", "pp"))
    assert len(ir.simulate(g, ir.Topology.preset("a100-hgx", 4)).devices) == devices
    (y,) = ir.collect(g, ir.execute(g, ir.distribute(g, args, source=f)))
    np.testing.assert_allclose(y, module(*inputs).detach().numpy(), rtol=1e-4, atol=1e-5)
