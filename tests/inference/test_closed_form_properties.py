"""The serving closed forms as properties: for Llama-style models of drawn shapes (layers,
query and key/value heads, head width, dtype), request mixes and tensor-parallel degrees,
KV bytes per token are ``2 x layers x kv_heads x head_dim x bytes`` exactly (split over
the tensor ranks by kv heads), and the simulated decode step is never below its memory
floor: ``(weight bytes / tp + KV bytes / tp) / achieved HBM bandwidth`` per device (a
weight the tensor plan leaves whole counts whole; the embedding table, of which a step
reads a few rows, not at all)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ir
from ir.inference import RequestMix, ServingStrategy, serving_metrics

ITEMSIZE = {"bfloat16": 2, "float16": 2, "float32": 4}


@st.composite
def served(draw: st.DrawFn) -> dict:
    kv_heads = draw(st.sampled_from([1, 2, 4, 8]))
    tp = draw(st.sampled_from([d for d in (1, 2, 4, 8) if kv_heads % d == 0]))
    if kv_heads == 1:
        tp = 1  # one kv head under tensor parallelism is refused (tests/inference/test_steps)
    return {
        "layers": draw(st.integers(1, 3)),
        "kv_heads": kv_heads,
        "group": draw(st.sampled_from([1, 2, 4])),  # query heads per kv head (1: MHA)
        "head_dim": draw(st.sampled_from([16, 32, 64])),
        "dtype": draw(st.sampled_from(sorted(ITEMSIZE))),
        "tp": tp,
        "preset": draw(st.sampled_from(["a100-hgx", "h100-hgx"])),
        "prompt": draw(st.integers(1, 400)),
        "output": draw(st.integers(1, 100)),
        "batch": draw(st.integers(1, 16)),
    }


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(served())
def test_kv_bytes_and_the_decode_floor_hold_for_drawn_models(case: dict) -> None:
    heads = case["kv_heads"] * case["group"]
    hidden = heads * case["head_dim"]
    f = ir.models.llama(
        1, 512, hidden, heads, 64, case["layers"], kv_heads=case["kv_heads"],
        ffn=2 * hidden, dtype=case["dtype"],
    )  # fmt: skip
    tp = case["tp"]
    topology = ir.Topology.preset(case["preset"], tp)
    mix = RequestMix(case["prompt"], case["output"], case["batch"])
    m = serving_metrics(f, topology, ServingStrategy(tp), mix, block_tokens=1)

    per_token = 2 * case["layers"] * case["kv_heads"] * case["head_dim"]
    per_token *= ITEMSIZE[case["dtype"]]
    assert m.kv_bytes_per_token == per_token
    assert m.kv_bytes(mix.batch, mix.final_context) == mix.batch * mix.final_context * per_token
    assert {d.kv_bytes_per_token for d in m.memory.values()} == {per_token / tp}

    dev = topology.devices[0]
    bandwidth = dev.mem_bandwidth_bytes_per_s * dev.kernels.memory_efficiency
    layouts = dict(zip((v.name for v in m.decode_program.inputs), m.decode_program.input_layouts))
    weights = sum(
        v.type.size_bytes / (tp if layouts[v.name][-1].startswith("S") else 1)
        for v in f.inputs
        if v.name not in ("tokens", "labels", "wte")
    )
    kv = mix.batch * mix.mean_context * per_token / tp
    assert m.decode_floor_s == pytest.approx((weights + kv) / bandwidth, rel=1e-9)
    assert m.tpot_s >= m.decode_floor_s
