"""The ready tensor-parallel transforms on an imported Llama: ``T.megatron`` (tensor,
data and pipeline parallelism of its training step) and ``horizontal_parallel`` (its
forward) split attention by heads and the MLP Megatron's way, column then row,
through the transposes torch puts before every ``MatMul`` (a Linear stores ``W`` as
``(out, in)``). Each is proven by execution against the sequential program; a
Llama-7B-shaped model is simulated on 8 GPUs."""

from __future__ import annotations

import numpy as np
import pytest

import ir
from ir.importers import weight_name

from .conftest import VOCAB, llama, llama_7b, torch

COLUMNS = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROWS = ("o_proj", "down_proj")


def _training_step(lm: torch.nn.Module, ids: torch.Tensor):
    """The imported ``lm`` with torch's cross-entropy on its logits, trained by SGD: the
    step, its arguments (labels last) and the loss torch computes."""
    f, args = ir.from_torch(lm, (ids,))
    f = ir.models.with_loss(f)
    labels = np.random.default_rng(3).integers(0, VOCAB, ids.shape)
    args = [*args, labels]
    logits = lm(ids)
    want = torch.nn.functional.cross_entropy(
        logits.reshape(-1, VOCAB), torch.from_numpy(labels).reshape(-1)
    )
    trained = {weight_name(k) for k, _ in lm.named_parameters()}
    t = ir.transforms.training(f, params=[v.name for v in f.inputs if v.name in trained], lr=0.1)
    return t, args, float(want.detach())


def _ids(batch: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, 8), generator=torch.Generator().manual_seed(5))


def _assert_step_equal(t: ir.Function, g: ir.Function, args: list) -> None:
    want = ir.execute(t, args)
    got = ir.collect(g, ir.execute(g, ir.distribute(g, args, source=t)))
    assert len(got) == len(want)
    for v, o, w in zip(t.outputs, got, want, strict=True):
        np.testing.assert_allclose(o, w, rtol=1e-4, atol=1e-6, err_msg=v.name)


def test_with_loss_is_torchs_cross_entropy():
    lm = llama()
    t, args, torch_loss = _training_step(lm, _ids(2))
    loss = ir.execute(t, args)[t.outputs.index(t.value("l"))]
    np.testing.assert_allclose(loss, torch_loss, rtol=1e-5)


def test_megatron_splits_an_imported_llamas_attention_and_mlp_column_then_row():
    """tp=2: q, k, v, gate and up projections by output features (torch's rows: ``S(0)``),
    o and down projections by input features (``S(1)``); the token embedding and the head
    by vocabulary (Megatron-LM's vocabulary-parallel embedding and cross-entropy: rows of
    both torch weights); norms stay whole. GQA: 4 query heads over 2 key/value heads split
    2 + 1 per device."""
    t, args, _ = _training_step(llama(), _ids(4))
    g = ir.transforms.megatron(t, 1, 2, 1, 1)
    layouts = dict(zip((v.name for v in g.inputs), g.input_layouts))
    weights = [n for n in layouts if n.startswith("lm_")]
    assert sum(any(c in n for c in COLUMNS) for n in weights) == 10
    for name in weights:
        if any(c in name for c in COLUMNS):
            assert layouts[name] == ("R@1", "S(0)@2"), name
        elif any(r in name for r in ROWS):
            assert layouts[name] == ("R@1", "S(1)@2"), name
        elif "embed_tokens" in name or "lm_head" in name:
            assert layouts[name] == ("R@1", "S(0)@2"), name
        else:
            assert layouts[name] == ("R@1", "R@2"), name
    _assert_step_equal(t, g, args)


@pytest.mark.parametrize(("dp", "tp", "pp", "m"), [(2, 1, 2, 2), (2, 2, 2, 2)])
def test_megatron_3d_steps_of_an_imported_llama_equal_the_sequential_step(dp, tp, pp, m):
    """The batch of 4 equals the rotary frequencies' length (4): a buffer the step does not
    train is no batch input."""
    t, args, _ = _training_step(llama(), _ids(4))
    g = ir.transforms.megatron(t, dp, tp, pp, m)
    layouts = dict(zip((v.name for v in g.inputs), g.input_layouts))
    assert layouts["lm_model_rotary_emb_inv_freq"][0].startswith("R")
    _assert_step_equal(t, g, args)


def test_a_pipeline_cuts_an_imported_llama_between_layers():
    """The rotary tables, read by every layer, do not hide the layer boundaries: two
    stages get one layer each (the embedding with the first, the head with the last)."""
    t, _, _ = _training_step(llama(), _ids(4))
    stage = ir.transforms.stage_assignment(t, 2)
    by_weight = {
        v.name: stage[op] for op in t.ops if op.op_type == "SGDOptimizer" for v in op.inputs[:1]
    }
    assert {s for n, s in by_weight.items() if "layers_0_" in n} == {0}
    assert {s for n, s in by_weight.items() if "layers_1_" in n} == {1}


def test_horizontal_parallel_of_an_imported_llama_equals_torch():
    lm = llama()
    ids = _ids(2)
    f, args = ir.from_torch(lm, (ids,))
    g = ir.transforms.horizontal_parallel(f, 2)
    layouts = dict(zip((v.name for v in g.inputs), g.input_layouts))
    assert layouts["lm_model_layers_1_self_attn_k_proj_weight"] == ("S(0)",)
    assert layouts["lm_model_layers_1_mlp_down_proj_weight"] == ("S(1)",)
    (logits,) = ir.collect(g, ir.execute(g, ir.distribute(g, args, source=f)))
    np.testing.assert_allclose(logits, lm(ids).detach().numpy(), rtol=1e-4, atol=1e-5)


def test_batched_matmuls_keep_their_heads():
    """torch lowers attention's 4-d ``matmul`` to reshapes around a 3-d ``bmm``; the import
    folds them back, so no MatMul merges the batch with the heads."""
    f, _ = ir.from_torch(llama(), (_ids(2),))
    ranks = [op.outputs[0].type.rank for op in f.ops if op.op_type == "MatMul"]
    assert ranks.count(4) == 4 and 3 not in ranks


def _llama_7b_step(layers: int) -> ir.Function:
    lm = llama_7b(layers)
    ids = torch.empty((8, 1024), dtype=torch.long, device="meta")
    f, _ = ir.from_torch(lm, (ids,))
    trained = {weight_name(k) for k, _ in lm.named_parameters()}
    f = ir.models.with_loss(f)
    return ir.transforms.training(f, params=[v.name for v in f.inputs if v.name in trained])


def test_a_llama_7b_shaped_training_step_simulates_on_8_gpus_with_tp_and_dp_x_pp():
    """Two of Llama-7B's 32 layers at its widths (bf16), never executed:
    ``benchmarks/llama7b_simulation.py --train`` runs all 32."""
    t = _llama_7b_step(2)
    topology = ir.Topology.preset("a100-hgx", 8)
    alone = ir.simulate(t, ir.Topology.preset("a100-hgx", 1))
    for degrees in [(1, 8, 1, 1), (4, 1, 2, 2), (2, 1, 4, 4), (2, 2, 2, 2)]:
        g = ir.transforms.megatron(t, *degrees)
        result = ir.simulate(g, topology)
        computing = {e.device for e in result.events if e.stream == "compute" and e.dur_s > 0}
        assert computing == set(range(8)), degrees
        assert result.step_time_s < alone.step_time_s / 2, degrees
        peak = max(result.peak_memory_bytes.values())
        assert peak < max(alone.peak_memory_bytes.values()) / 2, degrees
