"""A Llama-7B-shaped model imported from transformers on the meta device and simulated on
8 A100s: never executed, no weights held.

``ir.from_torch`` exports the module (built under ``torch.device("meta")``, bf16) and
imports shapes only; the forward step is distributed by annotation and propagation
(the token ids' batch; Megatron's attention and MLP weights) and by the ready
transforms (data parallel 8, pipeline 4 x 4 microbatches), and the simulator times it.
With ``--train``, the training step instead (torch's cross-entropy on the logits,
``ir.models.with_loss``; SGD) under ``T.megatron(t, dp, tp, pp, microbatches)``: tensor
parallelism 8, data x pipeline, and all three.

    python benchmarks/llama7b_simulation.py [--layers 32] [--batch 8] [--seq 2048] [--train]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout, installed or not

import torch
import transformers

import ir
from ir.sharding import Mesh, S, propagate

COLUMNS = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROWS = ("o_proj", "down_proj")


class Logits(torch.nn.Module):
    def __init__(self, lm: torch.nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm(ids, use_cache=False).logits


def llama_7b(layers: int) -> torch.nn.Module:
    config = transformers.LlamaConfig(
        num_hidden_layers=layers,
        hidden_size=4096,
        intermediate_size=11008,
        num_attention_heads=32,
        num_key_value_heads=32,
        vocab_size=32000,
        max_position_embeddings=4096,
        attn_implementation="eager",
    )
    with torch.device("meta"):
        return Logits(transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--preset", default="a100-hgx")
    p.add_argument("--train", action="store_true", help="the training step under T.megatron")
    args = p.parse_args()
    if args.train:
        train(args)
        return
    ids = torch.empty((args.batch, args.seq), dtype=torch.long, device="meta")
    start = time.perf_counter()
    f, _ = ir.from_torch(llama_7b(args.layers), (ids,))
    params = sum(v.type.num_elements for v in f.inputs if v.type.dtype.is_float)
    print(
        f"imported {len(f.ops)} ops, {params / 1e9:.2f} B parameters, "
        f"in {time.perf_counter() - start:.1f} s"
    )
    topology = ir.Topology.preset(args.preset, 8)
    mesh = Mesh((8,))
    names = [v.name for v in f.inputs]
    tensor = {n: (mesh, [S(0)]) for n in names if any(c in n for c in COLUMNS)}
    tensor.update({n: (mesh, [S(1)]) for n in names if any(r in n for r in ROWS)})
    plans = {
        "1 GPU": None,
        "ids S(0) on 8": {"ids": (mesh, [S(0)])},
        "Megatron weights on 8": tensor,
        "T.parallelize dp=8": {"dp": 8},
        "T.parallelize pp=4 x4": {"pp": 4, "microbatches": 4},
    }
    for label, plan in plans.items():
        start = time.perf_counter()
        if plan is None:
            program = f
        elif label.startswith("T."):
            program = ir.transforms.parallelize(f, **plan)
        else:
            program = propagate(f, plan, topology)[0]
        result = ir.simulate(program, topology)
        peak = max(result.peak_memory_bytes.values())
        print(
            f"{label:22s} step {result.step_time_s * 1e3:8.1f} ms, peak {peak / 2**30:6.1f} GiB"
            f"  ({time.perf_counter() - start:.1f} s to propagate and simulate)"
        )


MEGATRON = [  # (dp, tp, pp, microbatches) on 8 GPUs
    (1, 8, 1, 1),
    (8, 1, 1, 1),
    (2, 1, 4, 4),
    (4, 1, 2, 4),
    (2, 2, 2, 4),
    (1, 4, 2, 4),
]


def train(args: argparse.Namespace) -> None:
    ids = torch.empty((args.batch, args.seq), dtype=torch.long, device="meta")
    start = time.perf_counter()
    lm = llama_7b(args.layers)
    f, _ = ir.from_torch(lm, (ids,))
    trained = {ir.importers.weight_name(k) for k, _ in lm.named_parameters()}
    f = ir.models.with_loss(f)
    t = ir.transforms.training(f, params=[v.name for v in f.inputs if v.name in trained])
    print(f"training step: {len(t.ops)} ops, in {time.perf_counter() - start:.1f} s")
    alone = ir.simulate(t, ir.Topology.preset(args.preset, 1))
    peak = max(alone.peak_memory_bytes.values())
    print(f"{'1 GPU':22s} step {alone.step_time_s * 1e3:8.1f} ms, peak {peak / 2**30:6.1f} GiB")
    topology = ir.Topology.preset(args.preset, 8)
    for dp, tp, pp, m in MEGATRON:
        if args.batch % (dp * m):
            continue
        start = time.perf_counter()
        g = ir.transforms.megatron(t, dp, tp, pp, m)
        result = ir.simulate(g, topology)
        peak = max(result.peak_memory_bytes.values())
        label = f"dp={dp} tp={tp} pp={pp} m={m}"
        print(
            f"{label:22s} step {result.step_time_s * 1e3:8.1f} ms, peak {peak / 2**30:6.1f} GiB"
            f"  ({time.perf_counter() - start:.1f} s to transform and simulate)"
        )


if __name__ == "__main__":
    main()
