"""Prefill and decode on real processes: each step's ranked programs under 2-way tensor
parallelism (kv heads and their caches split) and a 2-stage pipeline run on 2 gloo
processes with torch kernels, and a prompt prefilled then decoded there, carrying the
cache from step to step, gives the full forward's logits (Llama with GQA, and GPT)."""

from __future__ import annotations

import numpy as np
import pytest
from _serving import empty_cache, forward_values, gpt, llama, step_inputs

import ir
from ir import transforms
from ir.inference import ServingStrategy, decode_step, parallel_step, prefill_step
from ir.sharding import lower_to_ranks

pytest.importorskip("torch.distributed", reason="torch is not installed (pip install torch)")

from ir.backends import torch_dist


def _run(step: ir.Function, inputs: list, tp: int, pp: int) -> list:
    """``step`` under megatron(tp, pp) on tp * pp gloo processes, outputs collected."""
    g = parallel_step(step, ServingStrategy(tp, pp))  # pp microbatches for a decode step
    ranked = lower_to_ranks(transforms.unroll_pmap(g))
    return ir.collect(g, torch_dist.run_ranked(ranked, ir.distribute(g, inputs, source=step)))


@pytest.mark.parametrize(("make", "tp", "pp"), [(llama, 2, 1), (gpt, 2, 1), (llama, 1, 2)])
def test_prefill_then_decode_on_two_gloo_processes_equals_the_forward(make, tp, pp):
    f = make(batch=2, seq=8)
    values = forward_values(f, seed=5)
    full = ir.execute(f, [values[v.name] for v in f.inputs])[0]
    prompt = 5
    p = prefill_step(f, prompt)
    tokens = values["tokens"]
    logits, *cache = _run(p, step_inputs(p, values, tokens[:, :prompt], empty_cache(p)), tp, pp)
    np.testing.assert_allclose(logits[:, 0], full[:, prompt - 1], rtol=1e-9)
    for c in (prompt, prompt + 1):
        d = decode_step(f, c)
        logits, *cache = _run(d, step_inputs(d, values, tokens[:, c : c + 1], cache), tp, pp)
        np.testing.assert_allclose(logits[:, 0], full[:, c], rtol=1e-9)
