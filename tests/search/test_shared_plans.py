"""A search's strategies share the analyses they have in common (``SharedPlans``): every row
is the same as when each strategy analyses its program alone."""

from __future__ import annotations

import pytest

import ir
from ir import models, transforms
from ir.errors import DistIRError
from ir.search import _request, _simulate, _tensor_problems
from ir.search.space import SharedPlans
from ir.transforms._megatron_shared import SharedAnalyses
from ir.transforms._rewrite import TransformError

SPACE = (
    None,  # dp
    None,  # tp
    None,  # pp
    [2, 4],  # microbatches
    ("1f1b", "interleaved"),
    (1, 2),  # chunks
    (0, 2),  # zero
    (False, True),  # sequence parallelism
    (False, True),  # recompute
    (1,),  # ep
    (1,),  # cp
)


def _rows(model: ir.Function, optimizer: str, devices: int, shared: bool) -> list[tuple]:
    topology = ir.Topology.preset("a100-hgx", devices)
    request = _request(model, topology, None, optimizer, *SPACE)
    space, pruned, args = request.space, request.pruned, request.args()
    plans = SharedPlans() if shared else None
    rows = []
    for s in space:
        if s in pruned:
            continue
        r = _simulate(s, *args, shared=plans)
        rows.append((s, r.status, r.step_time_s, r.peak_memory_bytes, r.error, r.bubble))
    return rows


@pytest.mark.parametrize(
    "model, optimizer",
    [
        (models.gpt(batch=16, seq=16, hidden=64, heads=4, vocab=128, layers=4), "adam"),
        (models.mlp(64, 128, 128, 64, layers=4), "sgd"),
    ],
    ids=["gpt", "mlp"],
)
def test_every_row_is_the_same_with_shared_plans(model, optimizer):
    alone = _rows(model, optimizer, 8, shared=False)
    shared = _rows(model, optimizer, 8, shared=True)
    assert len(alone) > 50
    assert {s.schedule for s, *_ in alone} == {"1f1b", "interleaved"}
    assert {(s.zero, s.sequence_parallel, s.recompute) for s, *_ in alone if s.tp > 1} >= {
        (2, True, True)
    }
    assert shared == alone


def test_the_pruned_tensor_degrees_are_the_same_with_shared_plans():
    t = transforms.training(models.gpt(batch=8, seq=16, hidden=64, heads=4, vocab=128, layers=2))
    space = [ir.search.Strategy(dp=1, tp=k, pp=1) for k in (1, 2, 4, 8, 16)]
    plans = SharedPlans()
    problems = _tensor_problems(t, space)
    assert problems == _tensor_problems(t, space, plans)
    assert problems[2] is None and problems[8] is not None  # 8 is past the 4 heads
    for s in space[:3]:  # the builds reuse the forms the pruning made
        assert str(s.build(t, allow_replication=True)) == str(
            s.build(t, allow_replication=True, shared=plans)
        )


def test_a_failing_strategy_fails_alike_with_shared_plans():
    t = transforms.training(models.mlp(64, 128, 128, 64, layers=2), "sgd")
    topology = ir.Topology.preset("a100-hgx", 8)
    plans = SharedPlans()
    failing = ir.search.Strategy(dp=1, tp=1, pp=8, microbatches=8)
    args = (t, topology, 64, 1, 1.0, 1.0)
    for s in (failing, ir.search.Strategy(dp=2, tp=1, pp=4, microbatches=4), failing):
        alone, together = _simulate(s, *args), _simulate(s, *args, shared=plans)
        assert (together.status, together.error) == (alone.status, alone.error)
    assert alone.status == "error" and "pipeline level" in alone.error


def test_the_strategies_share_their_analyses():
    t = transforms.training(models.mlp(64, 128, 128, 64, layers=4), "sgd")
    plans = SharedPlans()
    _, analyses = plans.of(t, False)

    def kinds() -> dict[str, int]:
        found: dict[str, int] = {}
        for key in analyses._results:
            found[key[1]] = found.get(key[1], 0) + 1
        return found

    seen = []
    for dp, tp, pp, m, schedule in (
        (2, 2, 2, 2, "1f1b"),
        (2, 2, 2, 2, "gpipe"),
        (2, 2, 2, 4, "1f1b"),
        (2, 1, 4, 4, "1f1b"),  # as many pieces (8) as the last, another tp and pp
    ):
        s = ir.search.Strategy(dp=dp, tp=tp, pp=pp, microbatches=m, schedule=schedule)
        alone, together = s.build(t), s.build(t, shared=plans)
        assert str(alone) == str(together)
        seen.append(kinds())
    # another schedule: nothing analysed again
    assert seen[0] == seen[1] and seen[0]["pieces"] == seen[0]["tensor"] == 2
    # more microbatches: the data and tensor levels of both forms (vocabulary-parallel
    # cross-entropy, and as it was: the MLP's logits are whole after a row-parallel layer),
    # each new piece's op signatures and its tensor plan's decisions (one split signature)
    assert seen[2] == {**seen[1], "pieces": 4, "tensor": 4, "ops": 4, "split": 4}
    # as many pieces at tp 1: the step as it was has its data level already (the cut of
    # the MLP changes none of its ops); its tensor level (tp 1) and its cut are new
    assert seen[3]["pieces"] == 4 and seen[3]["tensor"] == 5


def test_shared_analyses_of_another_program_are_refused():
    t = transforms.training(models.mlp(64, 128, 128, 64, layers=4), "sgd")
    other = transforms.training(models.mlp(64, 128, 128, 64, layers=2), "sgd")
    with pytest.raises(TransformError, match="another program"):
        transforms.megatron(t, 2, 1, 2, 2, shared=SharedAnalyses(other))
    plans = SharedPlans()
    plans.of(t, False)
    with pytest.raises(DistIRError, match="one search"):
        plans.of(other, False)
