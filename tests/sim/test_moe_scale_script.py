"""benchmarks/moe_scale.py in small: the Mixtral-shaped step builds, simulates and prints
its figures (the full-size timing is the benchmark's, not a test's)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "moe_scale.py"


def test_a_two_layer_mixtral_shaped_step_prints_its_figures() -> None:
    args = "--layers 2 --dp 2 --ep 2 --tp 2 --pp 1 --microbatches 1 --seq 256"
    out = subprocess.run(
        [sys.executable, str(SCRIPT), *args.split()],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    assert "dp2 ep2 cp1 tp2 pp1 m1 zero1: 4 H100s, 512 tokens a step" in out
    step = float(re.search(r"step time\s+([0-9.]+) s", out).group(1))
    assert step > 0
    alltoall = float(re.search(r"AllToAll\s+([0-9.]+) ms", out).group(1))
    assert alltoall > 0  # the experts' dispatch and combine are on the timeline
