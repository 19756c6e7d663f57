"""Tensor parallelism past what the model splits (the attention heads) is refused naming
the degree and the limit, or built replicated when asked, and proven by execution; in
both attention forms (the fused op refuses by its record's ``heads_limit``, the unfused
one by the comparison with the plan over one rank, ``ir.transforms.tensor_limits``)."""

from __future__ import annotations

import numpy as np
import pytest

import ir
from ir import models
from ir import transforms as T  # noqa: N812
from ir.transforms.megatron import (
    TensorReplicationError,
    tensor_replication_problem,
    tensor_split_problem,
)

F64 = ir.DType.float64
REFUSALS = {  # what each form says when tp=8 meets 4 heads
    "fused": r"degree 8 does not divide the 4 attention heads",
    "unfused": r"tp=8 leaves 8 weight\(s\) .*axis of 4 .*must divide 4",
}


def _gpt(attention: str, heads: int = 4, hidden: int = 32, layers: int = 2) -> ir.Function:
    f = models.gpt(8, 8, hidden, heads, 64, layers, dtype=F64, attention=attention)
    return T.training(f)


def _same(t: ir.Function, g: ir.Function) -> None:
    xs = ir.random_inputs(t, 2)
    want = ir.execute(t, xs)
    got = ir.collect(g, ir.execute(g, ir.distribute(g, xs, source=t)), rtol=1e-9)
    for v, w, o in zip(t.outputs, want, got, strict=True):
        np.testing.assert_allclose(o, w, rtol=1e-7, atol=1e-10, err_msg=v.name)


def _matmul_flops_per_device(g: ir.Function, topology: ir.Topology) -> float:
    result = ir.simulate(g, topology)
    per_device: dict[int, float] = {}
    for e in result.events:
        if e.stream == "compute" and e.op.op_type in ("MatMul", "Attention"):  # forward
            per_device[e.device] = per_device.get(e.device, 0.0) + e.flops
    return max(per_device.values())


@pytest.mark.parametrize("attention", ["fused", "unfused"])
def test_tp_beyond_the_heads_is_refused_naming_tp_and_the_heads(attention) -> None:
    t = _gpt(attention)
    with pytest.raises(TensorReplicationError, match=REFUSALS[attention]):
        T.megatron(t, 1, 8, 1, 1)
    assert tensor_replication_problem(t, 8) is not None
    assert tensor_replication_problem(t, 4) is None and tensor_replication_problem(t, 2) is None
    assert tensor_split_problem(t, 8) is None  # the MLP still splits: not "cannot split"


@pytest.mark.parametrize("attention", ["fused", "unfused"])
def test_heads_that_do_not_divide_by_tp_are_refused(attention) -> None:
    t = _gpt(attention, heads=3, hidden=24, layers=1)  # 3 heads of 8
    with pytest.raises(TensorReplicationError, match="3"):
        T.megatron(t, 2, 2, 1, 1)
    # 3 ranks, one head each (the 64 words do not split in 3: the vocabulary kept whole)
    _same(t, T.megatron(t, 1, 3, 1, 1, vocab_parallel=False))


@pytest.mark.parametrize("attention", ["fused", "unfused"])
def test_replication_built_when_asked_repeats_the_attention_on_every_rank(attention) -> None:
    """dp1 tp8 on a 4-head model: every rank runs all of the attention (the issue's 19x at
    tp 64 on 16 heads, here the same effect at small size)."""
    t = _gpt(attention)
    replicated = T.megatron(t, 1, 8, 1, 1, allow_replication=True)
    _same(t, replicated)
    split = T.megatron(t, 2, 4, 1, 1)
    topology = ir.Topology.preset("a100-hgx", 8)
    assert _matmul_flops_per_device(replicated, topology) > _matmul_flops_per_device(
        split, topology
    )
    _same(t, T.gradient_accumulation(t, 2, tp=8, allow_replication=True))
    with pytest.raises(TensorReplicationError):
        T.gradient_accumulation(t, 2, tp=8)
