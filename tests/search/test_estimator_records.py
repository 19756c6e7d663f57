"""What the estimator reads of a step (``ir.search.profile``): each record's batch
dimensions from the data level of one analysis, proven against the step analysed at
another number of pieces; and the per-stage class counts its stage sums come from,
against the records they count."""

from __future__ import annotations

import numpy as np
import pytest

import ir
from ir import models, transforms
from ir.search.estimate import Estimator
from ir.search.profile import Profile
from ir.search.space import Strategy

STEPS = {
    "mlp": lambda: transforms.training(models.mlp(64, 64, 64, 64, layers=4), "sgd"),
    "gpt": lambda: transforms.training(models.gpt(16, 64, 64, 4, 96, 4), "adam"),
    "llama": lambda: transforms.training(models.llama(16, 32, 64, 4, 96, 4), "adam"),
    "moe": lambda: transforms.training(
        models.gpt(batch=16, seq=64, hidden=128, heads=4, vocab=256, layers=2, experts=4), "adam"
    ),
}


@pytest.mark.parametrize("name", list(STEPS))
@pytest.mark.parametrize(("tp", "sp"), [(1, False), (2, False), (2, True)])
def test_batch_dimensions_read_from_the_data_level_give_the_step_at_other_pieces(
    name: str, tp: int, sp: bool
) -> None:
    """Every record's shapes at half the rows, scaled by the dimensions the data level
    splits over the pieces, are the shapes of the same record in the step analysed at
    twice the pieces (what the estimator analysed before, one more plan per degree)."""
    t = STEPS[name]()
    here, there = Profile(t, tp, 2, sp), Profile(t, tp, 4, sp)
    assert all(r.batch_known for r in here.records)
    assert len(here.records) == len(there.records)
    batch_dims = 0
    for rec in here.records:
        twin = there.by_name[rec.name]
        assert rec.shapes(0.5, 1.0) == [x.shape for x in twin.types], rec.name
        batch_dims += sum(b for dims in rec.scale for b, _ in dims)
    assert batch_dims > len(here.records) // 2  # activations follow the batch
    # a weight's records (an optimizer's inputs) never do
    weights = {v.name for op in here.plan.post for v in op.inputs[:1]}
    for rec in here.records:
        for name_, dims in zip((*rec.reads, *rec.writes), rec.scale):
            if name_ in weights:
                assert not any(b for b, _ in dims), (rec.name, name_)


@pytest.mark.parametrize("name", ["gpt", "moe"])
def test_stage_counts_sum_the_records_of_each_stage_and_phase(name: str) -> None:
    t = STEPS[name]()
    prof = Profile(t, 2, 2)
    prof.finish(set())
    for stages in (1, 2, 3, 4):
        try:
            stage = prof.stage_of(stages)
        except ir.DistIRError:
            continue  # more stages than the cut allows
        count, last = prof.counts(stages)
        want = np.zeros_like(count)
        np.add.at(want, (stage * 2 + prof.phase, prof.class_of), 1.0)
        assert np.array_equal(count, want)
        for st in range(stages):
            forward = [i for i in prof.forward_ops if stage[i] == st]
            assert last[st] == (prof.class_of[forward[-1]] if forward else -1)


def test_a_batch_of_twice_an_odd_number_is_estimated() -> None:
    """The estimator analyses the step at one number of pieces, any that divides the
    batch: a batch of 6 (once refused: it needed pieces and twice as many) is estimated,
    its step time within the margins of the simulation."""
    model = models.mlp(6, 256, 256, 64, layers=4)
    topology = ir.Topology.preset("a100-hgx", 4)
    t = transforms.training(model, "sgd")
    chosen = [Strategy(2, 1, 2, 3), Strategy(1, 2, 2, 2), Strategy(2, 2, 1, 1)]
    est = Estimator(t, topology, 6, chosen).estimate(chosen)
    assert est.known.all()
    for s, step in zip(chosen, est.step_time_s):
        simulated = ir.simulate(s.build(t, topology), topology).step_time_s
        assert 0.5 * simulated < step < 1.5 * simulated, (s, step, simulated)
