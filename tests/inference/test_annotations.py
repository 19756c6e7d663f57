"""A serving strategy as the seeds' annotations: propagated and lowered to per-rank programs
that compute the step (the RFC's flow), and exported to ONNX with seed 001's sharding specs
and pipeline stages, valid for onnx.checker."""

from __future__ import annotations

import numpy as np
import pytest
from _serving import llama

import ir
from ir.inference import ServingStrategy, annotated_step, decode_step, op_stages, prefill_step
from ir.inference import serving_annotations as annotations_of
from ir.sharding import S, lower_to_ranks, propagate, run_ranked


@pytest.mark.parametrize("kind", ["prefill", "decode"])
def test_annotations_propagate_and_lower_to_ranks_that_compute_the_step(kind):
    f = llama(batch=4, layers=2)
    step = prefill_step(f, 5) if kind == "prefill" else decode_step(f, 5)
    annotations = annotations_of(step, ServingStrategy(2))
    assert annotations["past_key_0"][1] == [S(1)]  # the cache split by kv heads
    assert annotations["h0_attn_wq"][1] == [S(1)] and annotations["h0_attn_wo"][1] == [S(0)]
    g, _ = propagate(step, annotations)
    ranked = lower_to_ranks(g)
    xs = ir.random_inputs(step, seed=6)
    got = ir.collect(g, run_ranked(ranked, ir.distribute(g, xs, source=step)))
    for a, b in zip(got, ir.execute(step, xs), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("pp", [1, 2])
def test_sharded_steps_export_to_onnx_with_stages_and_read_back(pp, tmp_path):
    f = ir.models.llama(4, 16, 32, 4, 50, 4, kv_heads=2, ffn=48)
    step = decode_step(f, 6)
    marked = annotated_step(step, ServingStrategy(2, pp))
    model = ir.to_onnx(marked, tmp_path / "decode.onnx")  # onnx.checker runs inside
    specs = {
        spec.tensor_name: [(d.axis, d.simple_sharding[0].num_shards) for d in spec.sharded_dim]
        for node in model.graph.node
        for config in node.device_configurations
        for spec in config.sharding_spec
    }
    assert specs["past_key_3"] == [(1, 2)] and specs["h3_mlp_w_down"] == [(0, 2)]
    stages = {c.pipeline_stage for n in model.graph.node for c in n.device_configurations}
    assert stages == set(range(pp))
    # each stage starts where T.pipeline_cut puts it (megatron's cut)
    where = op_stages(step, pp)
    for node in model.graph.node:
        for config in node.device_configurations:
            if config.HasField("pipeline_stage"):
                assert where.get(node.output[0], config.pipeline_stage) == config.pipeline_stage
