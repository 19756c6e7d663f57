"""A Mixtral-8x7B-shaped model imported from transformers on the meta device: what the
MoE capacity the import assumes costs in the simulator.

``ir.from_torch`` maps each of transformers' experts modules to the registry's MoE ops
(docs/experts.md, "Imported Hugging Face MoE models"). Exact, dropless routing
(``moe_capacity_factor=None``, the default) gives every expert ``S`` places a sequence,
``E / k`` times the ``S k / E`` tokens it receives on average: the simulator charges
the experts that much. ``moe_capacity_factor=f`` charges ``f`` times the uniform load.
For each, this prints the import time and the simulated bf16 Adam training step on one
H100 and with expert parallelism (``T.megatron(t, dp=8, ep=8)`` on 8 H100s): step
time, the MoE layers' share of device 0's compute, and peak memory.

    python benchmarks/moe_import.py [--layers 2] [--batch 8] [--seq 4096]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout, installed or not

import torch
import transformers
from llama7b_simulation import Logits  # the logits-only wrapper (this folder)

import ir
from ir.importers import weight_name

GIB = 2**30


def mixtral_8x7b(layers: int) -> torch.nn.Module:
    """Mixtral-8x7B's widths (hidden 4096, 32 heads over 8 key/value heads, 8 experts of
    14336, top-2, vocabulary 32000) with ``layers`` layers, bf16, on the meta device."""
    config = transformers.MixtralConfig(
        num_hidden_layers=layers,
        hidden_size=4096,
        intermediate_size=14336,
        num_attention_heads=32,
        num_key_value_heads=8,
        num_local_experts=8,
        num_experts_per_tok=2,
        vocab_size=32000,
        max_position_embeddings=32768,
    )
    with torch.device("meta"):
        return Logits(transformers.MixtralForCausalLM(config).to(torch.bfloat16).eval())


def expert_share(result, device: int = 0) -> float:
    """The fraction of ``device``'s compute time spent on the experts: the ops an imported
    MoE layer is made of (dispatch, products, activation, combine; forward and backward),
    named after its ``moe_experts`` node."""
    mine = [e for e in result.events if e.device == device and e.stream == "compute"]
    experts = sum(e.dur_s for e in mine if "moe_experts" in e.op.outputs[0].name)
    return experts / max(sum(e.dur_s for e in mine), 1e-30)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=4096)
    p.add_argument("--preset", default="h100-hgx")
    args = p.parse_args()
    lm = mixtral_8x7b(args.layers)
    trained = {weight_name(k) for k, _ in lm.named_parameters()}
    ids = torch.empty((args.batch, args.seq), dtype=torch.long, device="meta")
    one, eight = ir.Topology.preset(args.preset, 1), ir.Topology.preset(args.preset, 8)
    print(f"Mixtral-8x7B widths, {args.layers} layers, batch {args.batch} x {args.seq} tokens")
    for factor in (None, 1.0, 1.25):
        start = time.perf_counter()
        f, _ = ir.from_torch(lm, (ids,), moe_capacity_factor=factor)
        took = time.perf_counter() - start
        f = ir.models.with_loss(f)
        t = ir.transforms.training(
            f, params=[v.name for v in f.inputs if v.name in trained], optimizer="adam"
        )
        label = "dropless" if factor is None else f"factor {factor}"
        slots = next(op for op in f.ops if op.op_type == "MoESlots")
        print(f"{label}: {slots.attributes['capacity']} places per expert, import {took:.1f} s")
        alone = ir.simulate(t, one)
        g = ir.transforms.megatron(t, 8, 1, 1, 1, ep=8)
        spread = ir.simulate(g, eight)
        for where, result in (("1 GPU", alone), ("dp 8 ep 8", spread)):
            print(
                f"  {where}: step {result.step_time_s * 1e3:.1f} ms, experts "
                f"{expert_share(result):.0%} of device 0's compute, peak "
                f"{max(result.peak_memory_bytes.values()) / GIB:.1f} GiB"
            )


if __name__ == "__main__":
    main()
