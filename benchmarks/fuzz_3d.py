"""Randomized review of ``tfm.megatron`` and ``T.pipeline_parallel`` by execution.

Each case draws a tiny model (MLP, GPT, Llama, MoE GPT/Llama; odd layer counts) and a
strategy (dp, tp, pp, microbatches, schedule, chunks, zero, sequence parallelism,
recompute, ep, cp, overlap_grad_reduce), builds the step, and then:

* a build that raises anything but a ``DistIRError`` is a defect (a bare traceback);
* a built step is executed (``ir.execute``) on the sequential step's inputs laid out by
  ``ir.distribute`` and its collected outputs compared with the sequential step's;
* it is simulated once on a uniform topology (no deadlock, no crash);
* the same strategy built with a ``SharedAnalyses`` already used by another strategy of
  the same program must print the same program as a fresh build.

Usage: ``python benchmarks/fuzz_3d.py [cases] [seed]``; prints one line per failure and a
summary of what was covered.
"""

from __future__ import annotations

import random
import sys
import time
import traceback
from collections import Counter
from typing import Any

import numpy as np

import ir
from ir import models
from ir import transforms as tfm
from ir.errors import DistIRError
from ir.models_llama import llama
from ir.transforms._megatron_shared import SharedAnalyses

F64 = ir.DType.float64


def _models() -> dict[str, ir.Function]:
    """Tiny training programs (float64) of every family, odd layer counts included."""
    out: dict[str, ir.Function] = {}
    for layers in (2, 3, 5):
        out[f"mlp{layers}"] = tfm.training(models.mlp(8, 4, 8, 4, layers=layers, dtype=F64), "adam")
    out["mlp7_sgd"] = tfm.training(models.mlp(8, 4, 8, 4, layers=7, dtype=F64), "sgd")
    for layers in (1, 3, 5):
        out[f"gpt{layers}"] = tfm.training(models.gpt(8, 4, 8, 2, 8, layers, dtype=F64), "adam")
    out["gpt3_unfused"] = tfm.training(
        models.gpt(8, 4, 8, 2, 8, 3, dtype=F64, attention="unfused"), "adam"
    )
    out["llama3"] = tfm.training(llama(8, 4, 8, 2, 8, 3, dtype=F64, kv_heads=1, ffn=8), "adam")
    out["moe3"] = tfm.training(
        models.gpt(8, 4, 8, 2, 8, 3, dtype=F64, experts=4, top_k=2, shared_experts=1), "adam"
    )
    out["moe_llama3"] = tfm.training(
        llama(8, 4, 8, 2, 8, 3, dtype=F64, ffn=8, experts=2, top_k=1, dense_layers=1), "sgd"
    )
    return out


def _inputs(t: ir.Function, seed: int = 0) -> list:
    return [
        np.abs(x) if v.name.startswith("v") else x
        for v, x in zip(t.inputs, ir.random_inputs(t, seed))
    ]


def same_outputs(t: ir.Function, g: ir.Function) -> str | None:
    """None if ``g`` computes ``t``'s outputs, else what differs."""
    xs = _inputs(t)
    want = ir.execute(t, xs)
    got = ir.collect(g, ir.execute(g, ir.distribute(g, xs, source=t)), rtol=1e-7)
    for v, w, o in zip(t.outputs, want, got):
        for c in o if isinstance(o, tuple) else (o,):
            if not np.allclose(c, w, rtol=1e-7, atol=1e-9):
                return f"output {v.name} differs (max |d| {np.max(np.abs(c - w)):.3g})"
    return None


KNOBS = dict(
    dp=[1, 1, 2, 2, 4],
    tp=[1, 1, 2, 2, 4],
    pp=[1, 2, 2, 3, 4],
    microbatches=[1, 2, 4],
    schedule=["1f1b", "gpipe", "interleaved"],
    chunks=[1, 2, 3],
    zero=[0, 1, 2, 3],
    sequence_parallel=[False, True],
    recompute=[None, None, "selective", "full"],
    ep=[1, 1, 2],
    cp=[1, 1, 2],
    overlap_grad_reduce=[True, False],
)


def draw(rng: random.Random, moe: bool) -> dict[str, Any]:
    while True:
        k = {name: rng.choice(values) for name, values in KNOBS.items()}
        if k["schedule"] != "interleaved":
            k["chunks"] = 1
        else:
            k["chunks"] = max(k["chunks"], 2)
            if rng.random() < 0.9:
                k["microbatches"] = k["pp"] * rng.choice([1, 2])
        if not moe:
            k["ep"] = 1
        if k["recompute"] == "full" and rng.random() < 0.5:
            k["recompute_layers"] = 1
        if k["dp"] * k["tp"] * k["pp"] * k["cp"] <= 8:
            return k


def build(t: ir.Function, k: dict[str, Any], shared: SharedAnalyses | None = None) -> Any:
    k = dict(k)
    return tfm.megatron(
        t, k.pop("dp"), k.pop("tp"), k.pop("pp"), k.pop("microbatches"), k.pop("schedule"),
        shared=shared, **k,
    )  # fmt: skip


def main(cases: int = 200, seed: int = 0) -> int:
    rng = random.Random(seed)
    programs = _models()
    failures = 0
    counts: Counter = Counter()
    refusals: Counter = Counter()
    start = time.perf_counter()
    for i in range(cases):
        name = rng.choice(list(programs))
        t = programs[name]
        k = draw(rng, "moe" in name)
        n = k["dp"] * k["tp"] * k["pp"] * k["cp"]
        label = f"[{i}] {name} {k}"
        try:
            g = build(t, k)
        except DistIRError as e:
            refusals[type(e).__name__ + ": " + str(e)[:70]] += 1
            counts["refused"] += 1
            continue
        except Exception:
            failures += 1
            print("CRASH (build)", label)
            traceback.print_exc(limit=-3)
            continue
        counts["built"] += 1
        try:
            problem = same_outputs(t, g)
        except Exception as e:
            problem = f"execute raised {type(e).__name__}: {e}"
        if problem:
            failures += 1
            print("WRONG", label, problem)
        try:
            ir.simulate(g, ir.Topology.uniform(n))
        except Exception as e:
            failures += 1
            print("SIM", label, type(e).__name__, str(e)[:300])
        # shared analyses: another strategy first, then this one, against a fresh build
        if "recompute" in k and k["recompute"] is not None:
            continue  # the shared analyses are of the recomputed step (see megatron's doc)
        other = draw(rng, "moe" in name)
        other["recompute"] = None
        other.pop("recompute_layers", None)
        shared = SharedAnalyses(t)
        try:
            build(t, other, shared)
        except DistIRError:
            pass
        except Exception:
            failures += 1
            print("CRASH (shared build of other)", label, other)
            traceback.print_exc(limit=-3)
        try:
            h = build(t, k, shared)
        except Exception as e:
            failures += 1
            print("SHARED refused", label, "after", other, type(e).__name__, str(e)[:200])
            continue
        if str(h) != str(g):
            failures += 1
            problem = same_outputs(t, h)
            print("SHARED differs", label, "after", other, "execution:", problem or "equal")
        counts["shared"] += 1
    print(f"{cases} cases in {time.perf_counter() - start:.0f} s: {dict(counts)}, "
          f"{failures} failures")  # fmt: skip
    for why, c in refusals.most_common():
        print(f"  refused x{c}: {why}")
    return failures


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]]
    sys.exit(1 if main(*args) else 0)
