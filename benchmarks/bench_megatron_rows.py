"""Build and simulate every row of Narayanan et al. 2021 (SC'21), Table 1: time and memory.

    python benchmarks/bench_megatron_rows.py [--rows 39.1B 1T ...] [--timeout-s 600]

Each row is the paper's configuration as ``benchmarks/accuracy.py`` builds it: a GPT of
the row's hidden size, heads and layers (sequence 2048, vocabulary 51200, float16),
trained with Adam, every transformer layer checkpointed
(``T.recompute(t, models.gpt_layer_activations(t))``), arranged by ``T.megatron`` at the
row's tensor x pipeline x data degrees (``layers / pp`` whole layers a stage, as
Megatron-LM divides them) with 1F1B and microbatches of one sequence
(``batch / dp`` of them; the rows without a pipeline run the replica's batch at once, as
``accuracy.py`` does), and simulated in full (every op's events and memory, not the
search's estimate) on the row's number of ``a100-hgx`` GPUs. Each row runs in a process
of its own; it prints the seconds to build the model and the step, to simulate it, to
expand its memory curves (the peak), the step time, the device peak and the process's
peak resident memory (and its CPU seconds, which other processes on a shared machine
disturb less). Rows that run past ``--timeout-s`` are reported as such.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    label: str
    hidden: int
    heads: int
    layers: int
    tp: int
    pp: int
    dp: int
    batch: int

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def microbatches(self) -> int:
        return self.batch // self.dp if self.pp > 1 else 1


# Narayanan et al. 2021, Table 1: parameters, heads, hidden size, layers, tensor, pipeline
# and data degrees, GPUs, global batch.
ROWS = (
    Row("1.7B", 2304, 24, 24, 1, 1, 32, 512),
    Row("3.6B", 3072, 32, 30, 2, 1, 32, 512),
    Row("7.5B", 4096, 32, 36, 4, 1, 32, 512),
    Row("18.4B", 6144, 48, 40, 8, 1, 32, 1024),
    Row("39.1B", 8192, 64, 48, 8, 2, 32, 1536),
    Row("76.1B", 10240, 80, 60, 8, 4, 32, 1792),
    Row("145.6B", 12288, 96, 80, 8, 8, 24, 2304),
    Row("310.1B", 16384, 128, 96, 8, 16, 15, 2160),
    Row("529.6B", 20480, 128, 105, 8, 35, 9, 2520),
    Row("1T", 25600, 160, 128, 8, 64, 6, 3072),
)


def run_row(row: Row) -> dict:
    """Build, simulate and expand one row here; its figures."""
    import resource

    import ir
    from ir import models, transforms

    t0 = time.perf_counter()
    f = models.gpt(row.batch, 2048, row.hidden, row.heads, 51200, row.layers, dtype="float16")
    t = transforms.training(f, "adam")
    t = transforms.recompute(t, models.gpt_layer_activations(t))
    t1 = time.perf_counter()
    # whole layers per stage, as Megatron-LM divides them (layers / pp each)
    per = row.layers // row.pp
    stage_of = {f"h{s * per}_ln1_y": s for s in range(1, row.pp)}
    g = transforms.megatron(
        t, row.dp, row.tp, row.pp, row.microbatches, "1f1b", stage_of=stage_of or None
    )
    t2 = time.perf_counter()
    result = ir.simulate(g, ir.Topology.preset("a100-hgx", row.gpus))
    t3 = time.perf_counter()
    peak = max(result.peak_memory_bytes.values())
    t4 = time.perf_counter()
    return {
        "row": row.label,
        "gpus": row.gpus,
        "microbatches": row.microbatches,
        "model_s": t1 - t0,
        "build_s": t2 - t1,
        "simulate_s": t3 - t2,
        "memory_s": t4 - t3,
        "total_s": t4 - t0,
        "cpu_s": time.process_time(),
        "top_level_ops": len(g.ops),
        "op_runs": result.walked_ops,
        "step_s": result.step_time_s,
        "device_peak_gb": peak / 1e9,
        "rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", nargs="*", help="labels (default: every row)")
    parser.add_argument("--timeout-s", type=float, default=600.0)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a row, in this process
    args = parser.parse_args()
    by_label = {r.label: r for r in ROWS}
    if args.one:
        print(json.dumps(run_row(by_label[args.one])))
        return
    wanted = [by_label[x] for x in args.rows] if args.rows else list(ROWS)
    print(
        f"{'row':>7} {'GPUs':>5} {'mb':>4} {'ops':>8} {'build s':>8} {'sim s':>7} "
        f"{'mem s':>6} {'total s':>8} {'CPU s':>6} {'step s':>7} {'peak GB':>8} {'RSS GiB':>8}"
    )
    overall = time.perf_counter()
    for row in wanted:
        try:
            out = subprocess.run(
                [sys.executable, __file__, "--one", row.label],
                capture_output=True,
                text=True,
                timeout=args.timeout_s,
                check=True,
            )
        except subprocess.TimeoutExpired:
            print(
                f"{row.label:>7} {row.gpus:>5} {row.microbatches:>4}  past {args.timeout_s:.0f} s"
            )
            continue
        except subprocess.CalledProcessError as e:
            print(f"{row.label:>7} failed: {(e.stderr.strip().splitlines() or [''])[-1]}")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(
            f"{r['row']:>7} {r['gpus']:>5} {r['microbatches']:>4} {r['top_level_ops']:>8} "
            f"{r['model_s'] + r['build_s']:>8.1f} {r['simulate_s']:>7.1f} {r['memory_s']:>6.1f} "
            f"{r['total_s']:>8.1f} {r['cpu_s']:>6.1f} {r['step_s']:>7.2f} "
            f"{r['device_peak_gb']:>8.1f} {r['rss_gib']:>8.2f}",
            flush=True,
        )
    print(f"all rows: {time.perf_counter() - overall:.1f} s")


if __name__ == "__main__":
    main()
