"""search(strategies=[...]): each listed strategy is one point of a space, its fields one
value each (numpy integers and bools as Python's)."""

from __future__ import annotations

import numpy as np
import pytest

import ir
from ir import models
from ir.search import SearchError, Strategy, search


@pytest.mark.parametrize(
    "given, says",
    [
        (Strategy(None, 1, 1), r"strategies\[0\] \(Strategy\(dp=None.*dp must be one int, got No"),
        (Strategy(1, 1, 4, None), r"microbatches must be one int, got None"),
        (Strategy(4, 1, 1, zero=[0, 1]), r"zero must be one int, got \[0, 1\]"),
        (Strategy(4, 1, 1, schedule=None), r"schedule must be one str, got None"),
        (Strategy(4, 1, 1, ep="2"), r"ep must be one int, got '2'"),
        (Strategy(4, 1, 1, sequence_parallel=1), r"sequence_parallel must be one bool, got 1"),
        (Strategy(True, 4, 1), r"dp must be one int, got True"),
    ],
)
def test_a_listed_strategy_is_one_point_not_a_space(given: Strategy, says: str) -> None:
    """A None or a list in a listed strategy's field made it several strategies (dp=None
    searched every dp), or a TypeError or a wrong reason (zero=None: 'ep=1 does not
    divide dp=4')."""
    with pytest.raises(SearchError, match=says):
        search(models.mlp(64, 32, 32, 8, layers=4), ir.Topology.preset("a100-hgx", 4),
               strategies=[given], progress=False)  # fmt: skip


def test_numpy_bools_are_switches_like_bools() -> None:
    """numpy 2 names its bool type 'bool', not 'bool_': np.True_ was refused."""
    mlp, topology = models.mlp(64, 32, 32, 8, layers=4), ir.Topology.preset("a100-hgx", 4)
    chosen = [Strategy(np.int64(4), 1, 1, sequence_parallel=np.True_)]
    listed = search(mlp, topology, progress=False, strategies=chosen)
    knobs = search(mlp, topology, progress=False, dp=4, tp=1, pp=1,
                   sequence_parallel=np.True_)  # fmt: skip
    assert [r.as_record() for r in listed.rows] == [r.as_record() for r in knobs.rows]
    assert [r.strategy for r in listed.rows] == [Strategy(4, 1, 1, sequence_parallel=True)]


def test_listed_strategies_that_all_split_an_unsplittable_model_are_refused_naming_one() -> None:
    one_layer = models.mlp(8, 4, 4, 3, layers=1)  # no MatMul pair, 3 classes: nothing splits
    topology = ir.Topology.preset("a100-hgx", 4)
    says = r"strategies: tensor parallelism cannot split mlp.* \(dp1 tp4 pp1 m1 1f1b: tensor"
    with pytest.raises(SearchError, match=says + r".*list strategies with tp=1"):
        search(one_layer, topology, strategies=[Strategy(2, 2, 1), Strategy(1, 4, 1)],
               progress=False)  # fmt: skip
    # beside a strategy that runs, the one that cannot split is a row saying why
    rows = search(one_layer, topology, strategies=[Strategy(2, 2, 1), Strategy(4, 1, 1)],
                  progress=False).rows  # fmt: skip
    assert [r.status for r in rows] == ["error", "ok"]
    assert rows[0].error.startswith("tensor level: no weight of mlp splits 2 ways")
