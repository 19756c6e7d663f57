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
from pathlib import Path
from typing import Any

import numpy as np

import ir
from ir import models
from ir import transforms as tfm
from ir.errors import DistIRError
from ir.models_llama import llama
from ir.transforms._megatron_shared import SharedAnalyses
from ir.transforms.megatron import tensor_replication_problem

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "transforms"))
from _parallel_programs import assert_same

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
    out["skip"] = _skip_step()
    out["gpt3_grads"] = tfm.gradients(models.gpt(8, 4, 8, 2, 8, 3, dtype=F64))
    out["mlp3_f32"] = tfm.training(models.mlp(8, 4, 8, 4, layers=3), "sgd")
    return out


def _skip_step() -> ir.Function:
    """Five MatMul layers; the last adds the first's output and the fourth the second's
    (skip connections past several stages), trained by Adam."""
    b = ir.FunctionBuilder("skip")
    x = b.input("x", ir.TensorType((8, 4), F64, 0))
    ws = [b.input(f"w{i}", ir.TensorType((4, 4), F64, 0)) for i in range(5)]
    hs = [x]
    for i, w in enumerate(ws):
        a = b.call("MatMul", hs[-1], w, name=f"a{i}")
        if i == 3:
            a = b.call("Add", a, hs[2], name=f"s{i}")
        if i == 4:
            a = b.call("Add", a, hs[1], name=f"s{i}")
        hs.append(b.call("Tanh", a, name=f"h{i}"))
    return tfm.training(models.with_loss(b.finish(hs[-1])), "adam")


def forward_names(t: ir.Function) -> list[str]:
    """The values ``t``'s forward ops make, in order (up to the first loss op)."""
    names = []
    for op in t.ops:
        if "Loss" in op.op_type or "CrossEntropy" in op.op_type:
            break
        names.append(op.outputs[0].name)
    return names


def stage_cut(rng: random.Random, t: ir.Function, stages: int) -> dict[str, int] | None:
    """A random cut of ``t``'s forward values into ``stages`` stages: each stage after the
    first starts at a value drawn in order, or None when there are too few."""
    names = forward_names(t)
    if stages < 2 or stages > len(names):
        return None
    bounds = sorted(rng.sample(range(1, len(names)), stages - 1))
    return {names[c]: i + 1 for i, c in enumerate(bounds)}


def _inputs(t: ir.Function, seed: int = 0) -> list:
    return [
        np.abs(x) if v.name.startswith("v") else x
        for v, x in zip(t.inputs, ir.random_inputs(t, seed))
    ]


def same_outputs(t: ir.Function, g: ir.Function) -> str | None:
    """None if two steps of ``g`` (the second on the first's outputs as they are) compute
    those of ``t``, else what differs (tests/transforms/_parallel_programs.assert_same)."""
    single = any(getattr(v.type, "dtype", None) == ir.DType.float32 for v in t.inputs)
    try:
        assert_same(t, g, rtol=1e-4 if single else 1e-7, steps=2)
    except AssertionError as e:
        return str(e).strip().splitlines()[0][:200]
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
    allow_replication=[False, False, False, True],
    vocab_parallel=[True, True, False],
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


def neighbour(rng: random.Random, k: dict[str, Any]) -> dict[str, Any]:
    """``k`` with one knob changed that keeps its batch pieces (what shared analyses key
    on): the tensor degree, the stages, sequence parallelism, ZeRO or the schedule."""
    o = dict(k)
    knob = rng.choice(
        ["tp", "tp", "pp", "sequence_parallel", "zero", "schedule", "allow_replication"]
    )
    if knob == "tp":
        o["tp"] = rng.choice([t for t in (1, 2, 4) if t != k["tp"]])
    elif knob == "pp":
        o["pp"] = rng.choice([p for p in (1, 2, 3, 4) if p != k["pp"]])
        if o["schedule"] == "interleaved" and o["microbatches"] % o["pp"]:
            o["schedule"], o["chunks"] = "1f1b", 1
    elif knob == "schedule":
        o["schedule"], o["chunks"] = rng.choice([("1f1b", 1), ("gpipe", 1), ("interleaved", 2)])
    else:
        o[knob] = rng.choice(KNOBS[knob])
    return o


def build_seed(t: ir.Function, k: dict[str, Any]) -> Any:
    k = dict(k)
    return tfm.pipeline_parallel(t, k.pop("pp"), k.pop("microbatches"), k.pop("schedule"), **k)


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
        if rng.random() < (0.7 if name == "skip" else 0.3):
            k["stage_of"] = stage_cut(rng, t, k["pp"] * k["chunks"])
        seed_pipeline = rng.random() < 0.2
        if seed_pipeline:
            k = {x: k[x] for x in ("pp", "microbatches", "schedule", "chunks", "stage_of")
                 if x in k}  # fmt: skip
            k["resident"] = rng.random() < 0.7
        n = k.get("dp", 1) * k.get("tp", 1) * k["pp"] * k.get("cp", 1)
        label = f"[{i}] {name} {k}"
        try:
            g = build_seed(t, k) if seed_pipeline else build(t, k)
        except DistIRError as e:
            refusals[type(e).__name__ + ": " + str(e)[:200]] += 1
            counts["refused"] += 1
            if not seed_pipeline and k["recompute"] is None:
                shared = SharedAnalyses(t)
                for first in (neighbour(rng, k), k):
                    try:
                        build(t, first, shared)
                        if first is k:
                            failures += 1
                            print("SHARED builds what fresh refuses", label, str(e)[:200])
                    except DistIRError as e2:
                        if first is k and str(e2) != str(e):
                            failures += 1
                            print("SHARED refusal differs", label, str(e)[:150], str(e2)[:150])
                    except Exception:
                        failures += 1
                        print("CRASH (shared build)", label, first)
                        traceback.print_exc(limit=-3)
            continue
        except Exception:
            failures += 1
            print("CRASH (build)", label)
            traceback.print_exc(limit=-3)
            continue
        counts["built"] += 1
        counts["built with stage_of"] += bool(k.get("stage_of"))
        try:
            problem = same_outputs(t, g)
        except Exception as e:
            problem = f"execute raised {type(e).__name__}: {e}"
        if problem:
            failures += 1
            print("WRONG", label, problem)
        try:
            topology = ir.Topology.uniform(n) if i % 2 else ir.Topology.preset("a100-hgx", n)
            ir.simulate(g, topology, symmetry=rng.random() < 0.8)
        except Exception as e:
            failures += 1
            print("SIM", label, type(e).__name__, str(e)[:300])
        # shared analyses: other strategies (and the tensor checks) first, then this one,
        # against a fresh build; with recompute=, analyses of the recomputed step
        if seed_pipeline:
            continue
        program, k = t, dict(k)
        if k["recompute"] is not None:
            program = tfm.recompute(t)
            k["recompute"] = None
            k.pop("recompute_layers", None)
            try:
                g = build(program, k)
            except DistIRError:
                continue
        shared = SharedAnalyses(program)
        before = []
        for _ in range(rng.randrange(1, 4)):
            other = neighbour(rng, k) if rng.random() < 0.7 else draw(rng, "moe" in name)
            other["recompute"] = None
            other.pop("recompute_layers", None)
            before.append(other)
            try:
                if rng.random() < 0.3:
                    tensor_replication_problem(program, other["tp"], shared)
                build(program, other, shared)
            except DistIRError:
                pass
            except Exception:
                failures += 1
                print("CRASH (shared build of other)", label, other)
                traceback.print_exc(limit=-3)
        try:
            h = build(program, k, shared)
        except Exception as e:
            failures += 1
            print("SHARED refused", label, "after", before, type(e).__name__, str(e)[:200])
            continue
        if str(h) != str(g):
            failures += 1
            problem = same_outputs(program, h)
            print("SHARED differs", label, "after", before, "execution:", problem or "equal")
        counts["shared"] += 1
    print(f"{cases} cases in {time.perf_counter() - start:.0f} s: {dict(counts)}, "
          f"{failures} failures")  # fmt: skip
    for why, c in refusals.most_common():
        print(f"  refused x{c}: {why}")
    return failures


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]]
    sys.exit(1 if main(*args) else 0)
