"""What importing a large model costs: a Llama-7B-shaped model on the meta device (shapes
only) and a 1.1B-parameter model with real weights, through ``ir.from_torch`` at default
settings (scaled dot-product attention, ``use_cache=True``).

Each case runs in a fresh process; it reports the wall time of ``ir.from_torch`` and the
process's peak resident memory (``ru_maxrss``) against its resident memory just before
the import (the model itself: 4.4 GB of float32 weights for the 1.1B model, nothing for
the meta one). Weights are not copied: the program's arrays are views of the module's
tensors.

    python benchmarks/import_memory.py [--case meta7b real1b] [--layers 32]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # a checkout, installed or not
os.environ.setdefault("HF_HUB_OFFLINE", "1")

GIB = 1 << 30


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _peak_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _config(case: str, layers: int | None):
    import transformers

    if case == "meta7b":  # Llama-7B's widths
        shape = dict(hidden_size=4096, intermediate_size=11008, num_attention_heads=32)
        shape.update(num_key_value_heads=32, num_hidden_layers=layers or 32)
    else:  # TinyLlama-1.1B's widths
        shape = dict(hidden_size=2048, intermediate_size=5632, num_attention_heads=32)
        shape.update(num_key_value_heads=4, num_hidden_layers=layers or 22)
    return transformers.LlamaConfig(vocab_size=32000, max_position_embeddings=4096, **shape)


def measure(case: str, layers: int | None, batch: int, seq: int) -> dict:
    """One case, in this process."""
    import torch
    import transformers

    import ir

    config = _config(case, layers)
    if case == "meta7b":
        with torch.device("meta"):
            model = transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()
        ids = torch.empty((batch, seq), dtype=torch.long, device="meta")
    else:
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(config).eval()
        ids = torch.randint(0, config.vocab_size, (batch, seq))
    params = sum(p.numel() for p in model.parameters())
    before = _rss_bytes()
    start = time.perf_counter()
    f, args = ir.from_torch(model, (ids,))
    seconds = time.perf_counter() - start
    tensors = {t.data_ptr() for t in model.state_dict().values() if t.device.type != "meta"}
    shared = sum(a is not None and a.ctypes.data in tensors for a in args)
    return {
        "case": case,
        "parameters": params,
        "ops": len(f.ops),
        "import_s": round(seconds, 1),
        "rss_before_gib": round(before / GIB, 2),
        "peak_gib": round(_peak_bytes() / GIB, 2),
        "added_gib": round((_peak_bytes() - before) / GIB, 2),
        "weights_shared": shared,
        "weights": len(model.state_dict()),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--case", nargs="*", default=["meta7b", "real1b"])
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.inside:
        (case,) = args.case
        print(json.dumps(measure(case, args.layers, args.batch, args.seq)))
        return
    for case in args.case:
        command = [sys.executable, __file__, "--inside", "--case", case]
        command += ["--batch", str(args.batch), "--seq", str(args.seq)]
        if args.layers:
            command += ["--layers", str(args.layers)]
        out = subprocess.run(command, capture_output=True, text=True, check=False)
        lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
        if not lines:
            print(f"{case}: failed\n{out.stderr[-3000:]}")
            continue
        r = json.loads(lines[-1])
        print(
            f"{r['case']}: {r['parameters'] / 1e9:.2f} B parameters, {r['ops']} ops, "
            f"import {r['import_s']} s; resident before {r['rss_before_gib']} GiB, peak "
            f"{r['peak_gib']} GiB (+{r['added_gib']} GiB); arrays that are the module's "
            f"tensors: {r['weights_shared']} of {r['weights']}"
        )


if __name__ == "__main__":
    main()
