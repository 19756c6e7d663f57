"""Context parallelism in the 3D step (``megatron(..., cp=)``): each sequence split over
``cp`` devices in the load-balanced (zigzag) order, executed equal to the sequential step
on dense and mixture-of-experts models, composed with data, tensor, pipeline and expert
parallelism and ZeRO-3; its key/value traffic as the closed form says; bad degrees
refused naming the limit."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import ir
from ir import models, transforms
from ir.ops.context import balanced_positions
from ir.sim.traffic import traffic_bytes
from ir.transforms import TransformError, megatron

F64 = ir.DType.float64
GPT = models.gpt(4, 16, 16, 4, 32, 2, dtype=F64)
GQA = models.gpt(4, 16, 16, 4, 32, 2, dtype=F64, kv_heads=2)
MOE = models.gpt(4, 16, 16, 4, 32, 2, dtype=F64, experts=4, top_k=2, shared_experts=1)


def _inputs(t: ir.Function, seed: int = 0) -> list:
    return [
        np.abs(x) if v.name.startswith("v_") else x
        for v, x in zip(t.inputs, ir.random_inputs(t, seed))
    ]


def _run(t: ir.Function, g: ir.Function, seed: int = 0) -> None:
    xs = _inputs(t, seed)
    want = ir.execute(t, xs)
    got = ir.collect(g, ir.execute(g, ir.distribute(g, xs, source=t)), rtol=1e-9)
    for v, w, o in zip(t.outputs, want, got):
        np.testing.assert_allclose(o, w, rtol=1e-7, atol=1e-10, err_msg=v.name)


@pytest.mark.parametrize("model", [GPT, GQA, MOE], ids=["gpt", "gqa", "moe"])
@pytest.mark.parametrize(
    ("dp", "tp", "pp", "m", "cp"),
    [(1, 1, 1, 1, 2), (1, 1, 1, 1, 4), (2, 1, 1, 2, 2), (1, 2, 1, 1, 2), (1, 1, 2, 2, 2)],
)
def test_context_parallel_steps_equal_the_sequential_step(model, dp, tp, pp, m, cp) -> None:
    t = transforms.training(model, optimizer="adam")
    g = megatron(t, dp, tp, pp, m, cp=cp)
    _run(t, g)
    layouts = dict(zip((v.name for v in g.inputs), g.input_layouts))
    assert f"Z(1)@{cp}" in layouts["tokens"]  # each rank holds two chunks of a sequence
    # the attention's every layer and microbatch: one block at the sequence's positions,
    # over the keys and values of the whole group, and one gradient
    ops = Counter(op.op_type for op in _all_ops(g))
    assert ops["AttentionBlock"] == ops["AttentionBlockGrad"] == 2 * m
    assert ops["Attention"] == ops["AttentionGrad"] == 0


@pytest.mark.parametrize(
    ("dp", "tp", "cp", "ep", "zero"), [(2, 1, 2, 2, 0), (2, 1, 2, 1, 3), (2, 2, 2, 2, 1)]
)
def test_context_parallelism_composes_with_experts_and_zero3(dp, tp, cp, ep, zero) -> None:
    t = transforms.training(MOE, optimizer="adam")
    _run(t, megatron(t, dp, tp, 1, 1, cp=cp, ep=ep, zero=zero))


def test_dense_zero3_under_context_parallelism() -> None:
    t = transforms.training(GPT, optimizer="sgd")
    _run(t, megatron(t, 2, 1, 1, 2, cp=2, zero=3))


def _all_ops(f: ir.Function):
    for op in f.ops:
        yield op
        for sub in op.subfunctions:
            yield from _all_ops(sub)


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_key_value_traffic_is_cp_minus_one_blocks_each_way(cp) -> None:
    """Each rank's keys and values go to the other cp - 1 ranks of its group once in the
    forward (cp - 1 block exchanges of K and V, as ring attention's cp - 1 steps move),
    and their gradients come back once in the backward: per rank, per layer and
    microbatch, 2 (cp - 1) b hkv (s / cp) d bytes each way."""
    b, s, h, heads, kv, layers, m = 2, 32 * cp, 32, 4, 2, 2, 2
    f = models.gpt(b * m, s, h, heads, 64, layers, kv_heads=kv)
    g = megatron(transforms.training(f), 1, 1, 1, m, cp=cp)
    block = b * kv * (s // cp) * (h // heads) * 4  # float32
    sent = traffic_bytes(g)
    for d in range(cp):
        assert sent["allgather"][d] == pytest.approx(layers * m * 2 * (cp - 1) * block)
        assert sent["reducescatter"][d] == pytest.approx(layers * m * 2 * (cp - 1) * block)


def test_balanced_order_gives_every_rank_the_same_causal_work() -> None:
    """Megatron-Core's order: rank r holds chunks r and 2 cp - 1 - r, so each rank's
    queries attend the same number of keys (the contiguous split's last rank attends
    2 cp - 1 times the first's)."""
    s, cp = 64, 4
    order = balanced_positions(s, cp).reshape(cp, s // cp)
    pairs = [int(np.sum(q[:, None] >= np.arange(s)[None, :])) for q in order]
    assert len(set(pairs)) == 1
    assert sorted(order.ravel().tolist()) == list(range(s))
    contiguous = [int(np.sum(q[:, None] >= np.arange(s))) for q in np.split(np.arange(s), cp)]
    assert max(contiguous) > 3 * min(contiguous)


def test_bad_context_degrees_are_refused_naming_the_limit() -> None:
    t = transforms.training(models.gpt(4, 12, 16, 4, 32, 1))
    with pytest.raises(TransformError, match=r"cp=4 cuts each sequence of 12 tokens into 2 x cp"):
        megatron(t, 1, cp=4)
    with pytest.raises(TransformError, match=r"cp=5.*choose cp with 2 cp dividing 12"):
        megatron(t, 1, cp=5)
    with pytest.raises(TransformError, match="positive integer"):
        megatron(t, 1, cp=0)
    unfused = models.gpt(4, 16, 16, 4, 32, 1, attention="unfused")
    with pytest.raises(TransformError, match="attention='fused'"):
        megatron(transforms.training(unfused), 1, cp=2)
