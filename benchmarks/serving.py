"""Serving figures (docs/serving.md): a 70B-shaped Llama on 8 GPUs, and published
measurements the simulator was never fitted to.

1. Llama-3-70B (GQA, 8 kv heads, bfloat16) served by tensor parallelism over 8 GPUs of
   ``a100-hgx`` and ``h100-hgx``: TTFT, TPOT, throughput and the largest batch, and the wall
   and CPU time ``ir.inference.serving_metrics`` takes to compute them (target < 5 s).
2. The decode step against its memory floor ((weights + KV bytes) per device at the
   achieved HBM bandwidth): the margin, and MBU.
3. Out of sample (nothing here was fitted to them):
   * gpt-fast (pytorch-labs/gpt-fast README, "Tensor Parallelism" table): Llama-2-70B,
     bfloat16, batch 1, a 5-token prompt, 8 x A100-80GB (power-limited to 330 W, hybrid
     cube mesh): 21.32, 38.01 and 62.50 tokens/s on 2, 4 and 8 GPUs (torch.compile with CUDA
     graphs);
   * IBM and PyTorch, "Accelerating inference of Llama 2 with torch.compile" (pytorch.org
     blog, 2023): 29 ms per token for single-user requests of Llama-2-70B on 8 A100s;
   * TensorRT-LLM's performance page (docs/source/performance.md, v0.5 low-latency table,
     A100 FP16): first-token latency of Llama-2-70B at batch 1 over 4 GPUs, 47 ms for a
     128-token prompt and 377 ms for 2048;
   * NeMo Framework's Llama-2 inference table (docs.nvidia.com, performance/llama.html,
     TensorRT-LLM through NeMo): average latency of Llama-2-7B, 128 tokens in, 20 out, on
     A100 80GB SXM4 and H100 80GB HBM3.

``python benchmarks/serving.py`` prints the tables (``--quick``: part 1 only).
"""

from __future__ import annotations

import sys
import time

import ir
from ir.inference import RequestMix, ServingStrategy, serving_metrics

L70, L7, BF16, F16 = "llama-2-70b", "llama-2-7b", "bfloat16", "float16"
# (source, model, dtype, preset, tp, (prompt, output, batch, prefill batch), figure, published)
PUBLISHED = [
    ("gpt-fast", L70, BF16, "a100-hgx", 2, (5, 200, 1, 1), "tpot", 1e3 / 21.32),
    ("gpt-fast", L70, BF16, "a100-hgx", 4, (5, 200, 1, 1), "tpot", 1e3 / 38.01),
    ("gpt-fast", L70, BF16, "a100-hgx", 8, (5, 200, 1, 1), "tpot", 1e3 / 62.50),
    ("IBM/PyTorch", L70, BF16, "a100-hgx", 8, (128, 128, 1, 1), "tpot", 29.0),
    ("TensorRT-LLM", L70, F16, "a100-hgx", 4, (128, 2, 1, 1), "ttft", 47.0),
    ("TensorRT-LLM", L70, F16, "a100-hgx", 4, (2048, 2, 1, 1), "ttft", 377.0),
    ("NeMo", L7, F16, "a100-hgx", 1, (128, 20, 1, 1), "latency", 234.0),
    ("NeMo", L7, F16, "a100-hgx", 1, (128, 20, 8, 8), "latency", 329.5),
    ("NeMo", L7, F16, "a100-hgx", 8, (128, 20, 1, 1), "latency", 136.5),
    ("NeMo", L7, F16, "a100-hgx", 8, (128, 20, 8, 8), "latency", 181.9),
    ("NeMo", L7, F16, "h100-hgx", 1, (128, 20, 1, 1), "latency", 153.8),
    ("NeMo", L7, F16, "h100-hgx", 1, (128, 20, 8, 8), "latency", 199.2),
    ("NeMo", L7, F16, "h100-hgx", 8, (128, 20, 1, 1), "latency", 97.6),
    ("NeMo", L7, F16, "h100-hgx", 8, (128, 20, 8, 8), "latency", 129.1),
]


def seventy_b() -> None:
    mix = RequestMix(prompt_len=2048, output_len=256, batch=32)
    print(f"Llama-3-70B, bfloat16, tp8, prompt {mix.prompt_len}, output {mix.output_len}, "
          f"decode batch {mix.batch}")  # fmt: skip
    print("| preset | TTFT ms | TPOT ms | tok/s/GPU | max batch (ctx 2304) | floor ms | "
          "TPOT/floor | MBU | wall s | CPU s |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for preset in ("a100-hgx", "h100-hgx"):
        wall, cpu = time.perf_counter(), time.process_time()
        f = ir.models.llama_preset("llama-3-70b")
        m = serving_metrics(f, ir.Topology.preset(preset, 8), ServingStrategy(8), mix)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        print(
            f"| {preset} | {m.ttft_s * 1e3:.1f} | {m.tpot_s * 1e3:.2f} | "
            f"{m.tokens_per_s_per_gpu:.0f} | {m.max_batch()} | {m.decode_floor_s * 1e3:.2f} | "
            f"{m.tpot_s / m.decode_floor_s:.2f} | {m.memory_bandwidth_utilization:.0%} | "
            f"{wall:.2f} | {cpu:.2f} |"
        )


def published() -> None:
    print("\nOut of sample: published measurements (nothing fitted to them)")
    print("| source | model | preset | tp | prompt/output/batch | figure | predicted | "
          "published | error |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    errors = []
    for what, name, dtype, preset, tp, sizes, figure, value in PUBLISHED:
        f = ir.models.llama_preset(name, dtype=dtype)
        mix = RequestMix(*sizes)
        m = serving_metrics(
            f, ir.Topology.preset(preset, 8), ServingStrategy(tp), mix, memory_fraction=0.99
        )
        got = {"tpot": m.tpot_s, "ttft": m.ttft_s, "latency": m.latency_s}[figure] * 1e3
        errors.append(got / value - 1)
        print(
            f"| {what} | {name} | {preset} | {tp} | {mix.prompt_len}/{mix.output_len}/"
            f"{mix.batch} | {figure} ms | {got:.1f} | {value:.1f} | {got / value - 1:+.0%} |"
        )
    mape = sum(abs(e) for e in errors) / len(errors)
    print(f"\nMAPE over {len(errors)} rows: {mape:.1%}")


if __name__ == "__main__":
    seventy_b()
    if "--quick" not in sys.argv:
        published()
