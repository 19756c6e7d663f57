"""The tensor-degree pruning answers every degree from analyses shared by the degrees that
split alike (one tensor plan per set of degrees that divide the same axes, its checks per
degree), and its answers are T.megatron's: for every degree from 2 to 16 of several
models, the same refusal text as the full analysis of that degree alone."""

from __future__ import annotations

import re

import pytest

import ir
from ir import models
from ir import transforms as T  # noqa: N812
from ir.models_llama import llama
from ir.search import Strategy, _tensor_problems
from ir.search.space import SharedPlans
from ir.transforms._megatron_plan import MegatronPlan, TensorSplitError
from ir.transforms._megatron_shared import SharedAnalyses
from ir.transforms._rewrite import TransformError
from ir.transforms.megatron import (
    TensorReplicationError,
    tensor_replication_problem,
    tensor_split_problem,
)

DEGREES = range(2, 17)
MODELS = {  # each model, and what its refusals say among the degrees
    # 8 heads, vocabulary 60: the heads refuse 3, 5, 6, 7 and 9-16, the vocabulary 8
    "gpt": (lambda: models.gpt(4, 8, 64, 8, 60, 2), ["attention heads", "vocabulary of 60"]),
    # unfused attention: refused by the comparison with the plan of one rank
    "gpt unfused": (
        lambda: models.gpt(4, 8, 64, 8, 60, 2, attention="unfused"),
        ["tensor level: tp=3 leaves 8 weight(s)", "vocabulary of 60"],
    ),
    # grouped-query attention: 2 key/value heads of 8 limit the degree to 2
    "llama gqa": (
        lambda: llama(4, 8, 64, 8, 96, 2, kv_heads=2, ffn=96),
        ["the 8 attention heads", "the 2 key/value heads"],
    ),
    # a classifier (its head after a row-parallel layer keeps the logits whole: analysed
    # again in another vocabulary form); its splits may be uneven, never refused
    "mlp": (lambda: models.mlp(8, 12, 24, 6, layers=3), []),
    # one layer, 3 classes: tensor parallelism splits nothing but 3 ways
    "unsplittable": (lambda: models.mlp(8, 4, 4, 3, layers=1), []),
    "moe": (lambda: models.gpt(8, 8, 32, 4, 64, 2, experts=4, top_k=2), ["attention heads"]),
}


def _full(t: ir.Function, tp: int, allow_replication: bool = False) -> str | None:
    """The reference: T.megatron's whole analysis of one replica, stage and microbatch over
    ``tp`` tensor ranks, alone (no shared analyses, every step a build runs)."""
    wanted = TensorSplitError if allow_replication else TensorReplicationError
    try:
        MegatronPlan(t, 1, tp, 1, 1, "1f1b", 1, 0, allow_replication=allow_replication)
    except wanted as e:
        return str(e)
    except TransformError:
        return None
    return None


def _shapes_aside(why: str | None) -> str | None:
    return None if why is None else re.sub(r"shape \([0-9, ]*\)", "shape (...)", why)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_degree_is_answered_as_the_full_analysis_answers_it(name) -> None:
    model, said = MODELS[name]
    t = T.training(model(), "adam")
    shared = SharedAnalyses(t)
    full = {k: _full(t, k) for k in DEGREES}
    assert {k: tensor_replication_problem(t, k, shared) for k in DEGREES} == full
    assert {k: tensor_replication_problem(t, k) for k in DEGREES} == full
    split = {k: _full(t, k, allow_replication=True) for k in DEGREES}
    assert {k: tensor_split_problem(t, k) for k in DEGREES} == split
    # the search's rows: the first line of each refusal, from one request's shared plans
    space = [Strategy(1, k, 1) for k in DEGREES]
    rows = _tensor_problems(t, space, SharedPlans())
    assert rows == {k: why.splitlines()[0] if why else None for k, why in full.items()}
    # analysed at the estimator's pieces of the batch (2 of 4 rows): the same answers,
    # where a refusal names a value's shape, the shape of the piece analysed
    halved = _tensor_problems(t, space, SharedPlans(), batch=4)
    assert halved.keys() == rows.keys()
    for k, why in rows.items():
        assert _shapes_aside(halved[k]) == _shapes_aside(why), k
    assert full[2] is None
    for words in said:
        assert any(words in (why or "") for why in full.values()), (words, full)
    cannot = [k for k, why in split.items() if why]
    assert cannot == ([k for k in DEGREES if k != 3] if name == "unsplittable" else [])


def test_the_degrees_that_split_alike_share_one_tensor_plan() -> None:
    """An 8-head GPT with a vocabulary of 60 at degrees 2 to 16: two vocabulary forms (the
    degrees dividing 60 split the embedding and loss, the others keep them whole), and in
    each one tensor plan for the degrees that divide the heads (with the plan of one rank,
    which splits alike) and one for those that do not: 4 plans for 15 degrees."""
    t = T.training(MODELS["gpt"][0](), "adam")
    shared = SharedAnalyses(t)
    for k in DEGREES:
        tensor_replication_problem(t, k, shared)
    forms = {key for key in shared._results if key[0] == "form"}
    plans = [key for key in shared._results if key[1] == "split"]
    assert len(forms) == 1 and len(plans) == 4
