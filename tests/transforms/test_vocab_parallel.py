"""Megatron-LM's vocabulary-parallel embedding, head and cross-entropy in the 3D step:
executed equal to the sequential step, each tensor rank holding a vocabulary slice of
``wte`` and ``w_head`` (``V * H / tp`` elements), the whole logits on no rank, and the
last pipeline stage no longer doing the head's work whole."""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np
import pytest

import ir
from ir import models, transforms
from ir.registry import ops_cost
from ir.sharding import check_deadlock, lower_to_ranks, run_ranked
from ir.transforms import megatron
from ir.transforms.tensor_limits import TensorReplicationError
from ir.transforms.vocab_parallel import vocabulary_form
from ir.types import TupleType

F64 = ir.DType.float64
V, H = 32, 16
GPT = models.gpt(batch=8, seq=8, hidden=H, heads=8, vocab=V, layers=4, dtype=F64)


def _inputs(t: ir.Function, seed: int = 0) -> list:
    # Adam's second moments are non-negative (random ones would make NaN updates)
    return [
        np.abs(x) if v.name.startswith("v_") else x
        for v, x in zip(t.inputs, ir.random_inputs(t, seed))
    ]


def _run(t: ir.Function, g: ir.Function, rtol: float = 1e-7, atol: float = 1e-10) -> None:
    xs = _inputs(t)
    want = ir.execute(t, xs)
    got = ir.collect(g, ir.execute(g, ir.distribute(g, xs, source=t)), rtol=1e-9)
    assert len(got) == len(want)
    for v, w, o in zip(t.outputs, want, got):
        np.testing.assert_allclose(o, w, rtol=rtol, atol=atol, err_msg=v.name)


def _leaves(t: ir.Type) -> list[ir.TensorType]:
    return [x for e in t.elements for x in _leaves(e)] if isinstance(t, TupleType) else [t]


def test_the_vocabulary_form_is_the_same_program_on_one_device() -> None:
    t = transforms.training(GPT, optimizer="adam")
    form = vocabulary_form(t, 4)
    kinds = Counter(op.op_type for op in form.ops)
    assert not {"Embedding", "EmbeddingGrad", "Loss", "LossGrad"} & set(kinds)
    assert kinds["VocabEmbedding"] == kinds["CrossEntropyGrad"] == kinds["ClassMax"] == 1
    xs = _inputs(t)
    for a, b in zip(ir.execute(form, xs), ir.execute(t, xs)):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-14)


CONFIGS = [
    ((1, 2, 1, 1, "1f1b"), {}),
    ((2, 2, 2, 2, "1f1b"), {}),
    ((1, 4, 2, 4, "gpipe"), {}),
    ((2, 2, 2, 2, "interleaved"), {"chunks": 2}),
    ((2, 2, 1, 2, "1f1b"), {"zero": 1}),
    ((2, 2, 1, 2, "1f1b"), {"zero": 2}),
    ((1, 4, 1, 1, "1f1b"), {"sequence_parallel": True}),
    ((2, 2, 2, 2, "1f1b"), {"sequence_parallel": True, "zero": 1}),
]


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize(("args", "options"), CONFIGS, ids=lambda x: str(x))
def test_vocabulary_parallel_steps_equal_the_sequential_step(optimizer, args, options) -> None:
    t = transforms.training(GPT, optimizer=optimizer)
    g = megatron(t, *args, **options)
    _run(t, g)
    assert any(op.op_type == "KeepShard" for op in g.ops)  # the ids' slices: no transfer


def test_a_forward_program_returns_its_logits_split_over_the_tensor_ranks() -> None:
    g = megatron(GPT, 2, 2, 1, 2)
    _run(GPT, g)
    names = [v.name for v in GPT.outputs]
    assert g.output_layouts[names.index("logits")] == ("S(0)", "S(0)@2", "S(2)@2")


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_each_tensor_rank_holds_a_vocabulary_slice_of_the_embedding_and_head(tp) -> None:
    t = transforms.training(GPT, optimizer="adam")
    g = megatron(t, 1, tp, 1, 1)
    layouts = dict(zip([v.name for v in g.inputs], g.input_layouts))
    assert layouts["wte"] == ("R@1", f"S(0)@{tp}") and layouts["w_head"] == ("R@1", f"S(1)@{tp}")
    for name in ("wte", "w_head", "m_wte", "v_w_head"):
        (v,) = [v for v in g.inputs if v.name == name]
        for piece in _leaves(v.type):
            assert piece.size_bytes == V * H * 8 // tp  # float64: (V * H) / tp per rank
    # unsplit: every rank held the whole table and head
    whole = megatron(t, 1, tp, 1, 1, vocab_parallel=False)
    (v,) = [v for v in whole.inputs if v.name == "wte"]
    assert {p.size_bytes for p in _leaves(v.type)} == {V * H * 8}


def _float_shapes(f: ir.Function) -> set[tuple[int, ...]]:
    shapes = set()
    for op in f.ops:
        for body in op.subfunctions:
            shapes |= _float_shapes(body)
        for v in op.outputs:
            shapes |= {t.shape for t in _leaves(v.type) if t.dtype.is_float}
    return shapes


def test_no_rank_makes_the_whole_logits_or_the_whole_embedding_gradient() -> None:
    t = transforms.training(GPT)
    tp = 4
    g = megatron(t, 2, tp, 2, 2)
    shapes = _float_shapes(g)
    assert not any(V in s for s in shapes), sorted(s for s in shapes if V in s)
    assert (2, 8, V // tp) in shapes  # a microbatch of a replica: logits of its vocabulary slice
    plain = _float_shapes(megatron(t, 2, tp, 2, 2, vocab_parallel=False))
    assert (2, 8, V) in plain and (V, H) in plain


def test_the_cross_entropy_all_reduces_row_statistics_not_logits() -> None:
    t = transforms.training(GPT)
    m = 2
    g = megatron(t, 1, 2, 1, m)
    reduced = Counter(
        (op.attributes["op"], _leaves(op.inputs[0].type)[0].shape)
        for op in g.ops
        if op.op_type == "AllReduce"
    )
    rows = (8 // m, 8)  # (microbatch, seq)
    # per microbatch: each row's largest logit (max), sum of exps and label logit (sum)
    assert reduced[("max", rows)] == m and reduced[("sum", rows)] == 2 * m
    # and the embedding's lookup, summed over the ranks' vocabulary slices
    assert reduced[("sum", (*rows, H))] >= m


def test_a_vocabulary_that_does_not_split_is_refused_with_the_fix() -> None:
    f = models.gpt(batch=4, seq=4, hidden=8, heads=4, vocab=30, layers=1, dtype=F64)
    t = transforms.training(f)
    with pytest.raises(TensorReplicationError, match=r"30 rows .* tp=4 .* multiple of 4"):
        megatron(t, 1, 4, 1, 1)
    for kept_whole in ({"allow_replication": True}, {"vocab_parallel": False}):
        g = megatron(t, 1, 4, 1, 1, **kept_whole)  # the embedding and head whole a rank
        _run(t, g)
        assert not any(op.op_type == "KeepShard" for op in g.ops)
    _run(t, megatron(t, 1, 2, 1, 1))  # 30 splits in two


def test_vocabulary_parallel_programs_print_parse_lower_to_ranks_and_run() -> None:
    t = transforms.training(GPT, optimizer="adam")
    g = megatron(t, 2, 2, 2, 2, zero=1, sequence_parallel=True)
    assert ir.parse(str(g)).is_equivalent(g)
    u = transforms.unroll_pmap(g)
    ranked = lower_to_ranks(u)
    check_deadlock(ranked)
    assert ranked.classes == g.rank_classes
    xs = _inputs(t)
    inputs = ir.distribute(g, xs, source=t)
    got = ir.collect(g, list(run_ranked(ranked, inputs)))
    for v, o, w in zip(t.outputs, got, ir.execute(t, xs)):
        np.testing.assert_allclose(o, w, rtol=1e-7, atol=1e-10, err_msg=v.name)
    assert ir.simulate(g, ir.Topology.preset("a100-hgx", 8)).step_time_s > 0


def _stage_flops(g: ir.Function, stages: int, per_stage: int) -> list[float]:
    """The most floating-point operations any device of each pipeline stage runs."""
    flops: dict[int, float] = defaultdict(float)
    for op in g.ops:
        if op.op_type == "Pmap":
            work = ops_cost(op.subfunctions[0].ops).flops
            for piece in _leaves(op.inputs[0].type):
                flops[piece.device] += work
    return [max(flops[d] for d in range(s * per_stage, (s + 1) * per_stage)) for s in range(stages)]


def test_the_last_stage_does_a_vocabulary_slice_of_the_head_and_loss() -> None:
    """A GPT whose vocabulary is large against its width (V = 64 H), two layers a stage:
    with the head whole on each tensor rank the last stage's extra work over the others'
    (the head's 6 b s H V flops a step and the cross-entropy's) is done whole on every
    rank; split over the vocabulary, a tp-th of it."""
    b, s, h, vocab = 8, 16, 32, 2048
    f = models.gpt(batch=b, seq=s, hidden=h, heads=8, vocab=vocab, layers=8)
    t = transforms.training(f)
    tp, pp = 8, 4
    cut = {"h2_ln1_y": 1, "h4_ln1_y": 2, "h6_ln1_y": 3}
    whole = _stage_flops(megatron(t, 1, tp, pp, 4, vocab_parallel=False, stage_of=cut), pp, tp)
    split = _stage_flops(megatron(t, 1, tp, pp, 4, stage_of=cut), pp, tp)
    assert split[1:3] == whole[1:3] and whole[1] == whole[2]  # the layers' stages
    head_flops = 6 * b * s * h * vocab  # forward and both gradients of the head's MatMul
    assert whole[-1] - split[-1] >= head_flops * (1 - 1 / tp)
    extra_whole, extra_split = whole[-1] - whole[1], split[-1] - split[1]
    assert 0.95 * tp < extra_whole / extra_split <= tp
    assert split[0] < whole[0]  # the embedding's gradient: a slice of the table a rank


def test_parallelize_passes_the_switch_through() -> None:
    t = transforms.training(GPT)
    g = transforms.parallelize(t, dp=1, hp=2, pp=1, vocab_parallel=False)
    assert g.is_equivalent(megatron(t, 1, 2, 1, 1, vocab_parallel=False))
    assert not any(
        op.op_type == "VocabEmbedding" for p in g.ops for b in p.subfunctions for op in b.ops
    )
