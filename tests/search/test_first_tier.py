"""The search's first tier (enumerate, prune, set up the estimator, estimate everything)
made from one request's shared analyses gives every row the reference path gives: each
tensor degree analysed alone and in full, the estimator's analyses each alone, every
stage cut made afresh."""

from __future__ import annotations

import numpy as np
import pytest

import ir
from ir import models
from ir.search import _request
from ir.search.estimate import Estimator
from ir.search.space import ModelFacts, prune
from ir.transforms import training
from ir.transforms._megatron_plan import MegatronPlan
from ir.transforms._rewrite import TransformError
from ir.transforms.megatron import TensorReplicationError
from ir.transforms.stage_cut import StageCuts, annotated_stages, stage_assignment

KNOBS = (
    None,  # dp
    None,  # tp
    None,  # pp
    None,  # microbatches: every power of two from pp
    ("1f1b", "gpipe", "interleaved"),
    (1, 2),  # chunks
    (0, 1, 2),  # zero
    (False, True),  # sequence parallelism
    (False, True),  # recompute
    (1,),  # ep
    (1,),  # cp
)


def _tensor_problem_alone(t: ir.Function, tp: int) -> str | None:
    """T.megatron's whole analysis of one replica at ``tp``, alone: the reference."""
    try:
        MegatronPlan(t, 1, tp, 1, 1, "1f1b", 1, 0)
    except TensorReplicationError as e:
        return str(e).splitlines()[0]
    except TransformError:
        return None
    return None


@pytest.mark.parametrize(
    "model, optimizer, devices",
    [
        # 4 heads, vocabulary 96: tp 8 and 16 pruned by the heads
        (models.gpt(batch=16, seq=16, hidden=64, heads=4, vocab=96, layers=4), "adam", 16),
        (models.mlp(64, 128, 96, 64, layers=4), "sgd", 8),
    ],
    ids=["gpt", "mlp"],
)
def test_the_first_tier_gives_the_reference_rows(model, optimizer, devices) -> None:
    topology = ir.Topology.preset("a100-hgx", devices)
    request = _request(model, topology, None, optimizer, *KNOBS)
    space, pruned, t, batch, shared = (request.space, request.pruned, request.t, request.batch,
                                       request.shared)  # fmt: skip
    assert len(space) > 500
    # pruned: with each tensor degree analysed alone, in full
    capacity = min(d.memory_bytes for d in topology.devices)
    facts = ModelFacts.of(t, batch)
    alone = {k: _tensor_problem_alone(t, k) for k in {s.tp for s in space} if k > 1}
    assert prune(space, facts, capacity, alone) == pruned
    todo = [s for s in space if s not in pruned]
    # estimated: from the request's analyses, and each analysis alone
    fast = Estimator(t, topology, batch, todo, shared).estimate(todo)
    slow = Estimator(t, topology, batch, todo).estimate(todo)
    for name in ("step_time_s", "peak_memory_bytes", "bubble", "exposed_comm_s", "known"):
        assert np.array_equal(getattr(fast, name), getattr(slow, name), equal_nan=True), name
    assert fast.refused == slow.refused
    assert fast.known.sum() > 0.5 * len(todo)


def test_the_stage_cuts_of_every_count_are_those_made_afresh() -> None:
    """One program's cuts for every number of stages, its analyses read once
    (:class:`StageCuts`), are :func:`stage_assignment`'s made afresh for each."""
    for forward in (
        models.gpt(batch=4, seq=8, hidden=32, heads=4, vocab=64, layers=6),
        models.mlp(8, 16, 16, 8, layers=5),
    ):
        for t in (training(forward, "adam"), ir.transforms.recompute(training(forward, "adam"))):
            cuts = StageCuts(t, annotated_stages(t, None))
            for n in range(1, 40):
                try:
                    want = stage_assignment(t, n)
                except TransformError as e:
                    with pytest.raises(TransformError) as got:
                        cuts.assignment(n)
                    assert str(got.value) == str(e)
                    continue
                assert cuts.assignment(n) == want
