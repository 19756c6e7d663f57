"""A 3D build frees its analyses when it is done, by reference counting alone: no
reference cycle leaves a plan (and every value, op and step it holds) to the cyclic
garbage collector, whose passes over such leftovers grew with every strategy a search
built."""

from __future__ import annotations

import gc

import pytest

import ir
from ir import models, transforms
from ir.transforms._spmd import LocalProgram, Plan


def _alive(kind: type) -> int:
    return sum(1 for o in gc.get_objects() if type(o) is kind)


@pytest.mark.parametrize("dp, tp, pp, m", [(2, 2, 2, 4), (1, 4, 2, 2), (4, 1, 2, 2)])
def test_a_build_leaves_no_plan_for_the_collector(dp: int, tp: int, pp: int, m: int) -> None:
    step = transforms.training(models.gpt(batch=8, seq=8, hidden=32, heads=4, vocab=64, layers=2))
    topology = ir.Topology.preset("a100-hgx", dp * tp * pp)
    gc.collect()
    before = _alive(Plan), _alive(LocalProgram)
    gc.disable()  # what is freed now is freed by reference counts
    try:
        g = transforms.megatron(step, dp, tp, pp, m, topology=topology)
        assert ir.simulate(g, topology).step_time_s > 0
        del g
        assert (_alive(Plan), _alive(LocalProgram)) == before
    finally:
        gc.enable()
