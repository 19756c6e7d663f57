"""A tensor axis split by several mesh axes nests its blocks outer mesh axis first.

Found by fuzzing propagation (benchmarks/fuzz.py, target *programs*): with two
annotations on a 2-D mesh, a value made Partial on the inner axis was reduce-scattered
there first and then sliced on the outer axis, so ``[S(0), S(0)]`` held its rows
inner-axis-first; the step ran and returned wrong numbers.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import ir
from ir.sharding import Layout, Mesh, Partial, R, Shard, propagate
from ir.sharding.redistribute import plan

PLACEMENTS = ["R", "S(0)", "S(1)"]


def _max_error(f: ir.Function, annotations: dict) -> float | None:
    try:
        step, _ = propagate(f, annotations)
    except ir.DistIRError:
        return None
    inputs = ir.random_inputs(f)
    got = ir.execute_step(step, inputs, f)
    want = ir.execute(f, inputs)
    return max(float(np.max(np.abs(np.asarray(a) - np.asarray(b)))) for a, b in zip(got, want))


@pytest.mark.parametrize("first", ["wA", "x", "a"])
def test_two_annotations_on_a_2d_mesh_compute_the_sequential_result(first: str) -> None:
    f = ir.models.mlp(4, 8, 8, 4)
    mesh = Mesh((2, 2))
    ran = 0
    for second in ("wB", "h", "y"):
        for p1, p2 in itertools.product(itertools.product(PLACEMENTS, repeat=2), repeat=2):
            error = _max_error(f, {first: (mesh, list(p1)), second: (mesh, list(p2))})
            if error is not None:
                ran += 1
                assert error < 1e-4, (first, p1, second, p2)
    assert ran > 50  # most combinations propagate: the loop proved something


def test_the_fuzzed_case_partial_inner_to_rows_on_both_axes() -> None:
    mesh = Mesh((2, 2))
    src = Layout(mesh, (R, Partial("sum")))
    dst = Layout(mesh, (Shard(0), Shard(0)))
    steps = plan((4, 8), src, dst)
    # the inner axis may not shard dim 0 before the outer one does
    assert [s.kind for s in steps] == ["allreduce", "slice", "slice"]
    assert [s.axis for s in steps] == [1, 0, 1]
    f = ir.models.mlp(4, 8, 8, 4)
    error = _max_error(f, {"wA": (mesh, ["R", "S(0)"]), "h": (mesh, ["S(0)", "R"])})
    assert error is not None and error < 1e-4
