"""Activation recomputation x every pipeline schedule x any stage cut builds, and the step
executes equal to the sequential step (float64); the default cut falls at layer
boundaries and ``pipeline_cut`` says where; more stages than the model allows are
refused with the limit, never built with idle devices.
"""

from __future__ import annotations

import numpy as np
import pytest

import ir
from ir import models
from ir import transforms as T  # noqa: N812
from ir.transforms import TransformError, pipeline_cut, stage_assignment
from ir.transforms.stage_cut import annotated_stages, backward_ops, staged

F64 = ir.DType.float64
LAYERS = 4


def _gpt(layers: int = LAYERS, batch: int = 8) -> ir.Function:
    return models.gpt(batch, 4, 8, 2, 16, layers, dtype=F64)


def _mlp(layers: int = LAYERS, batch: int = 8) -> ir.Function:
    return models.mlp(batch, 4, 6, 3, layers=layers, dtype=F64)


def _recomputed(t: ir.Function, how: str) -> ir.Function:
    if how == "none":
        return t
    if how == "per-layer" and t.name == "gpt":  # Megatron's per-layer checkpointing
        return T.recompute(t, models.gpt_layer_activations(t))
    return T.recompute(t)  # the default choice (an MLP's first MatMul of each layer)


def _same(t: ir.Function, g: ir.Function) -> None:
    xs = ir.random_inputs(t, 1)
    want = ir.execute(t, xs)
    got = ir.collect(g, ir.execute(g, ir.distribute(g, xs, source=t)), rtol=1e-9)
    assert len(got) == len(want)
    for v, w, o in zip(t.outputs, want, got):
        np.testing.assert_allclose(o, w, rtol=1e-7, atol=1e-10, err_msg=v.name)


def _pipelines(t: ir.Function, pp: int, m: int, schedule: str, chunks: int):
    """The two transforms that pipeline: plain stages and the 3D step (with dp = 2)."""
    yield T.pipeline_parallel(t, pp, m, schedule, chunks=chunks)
    yield T.megatron(t, 2, 1, pp, m // 2 if m % 4 == 0 else m, schedule, chunks=chunks)


SCHEDULES = [("gpipe", 1), ("1f1b", 1), ("interleaved", 2)]


@pytest.mark.parametrize("model", ["gpt", "mlp"])
@pytest.mark.parametrize("how", ["none", "per-layer"])
@pytest.mark.parametrize(("schedule", "chunks"), SCHEDULES, ids=lambda x: str(x))
def test_every_schedule_and_degree_builds_and_equals_the_sequential_step(
    model, how, schedule, chunks
) -> None:
    f = _gpt(batch=16) if model == "gpt" else _mlp(batch=16)
    t = _recomputed(T.training(f), how)
    most = LAYERS if chunks == 1 else LAYERS // chunks
    for pp in range(2, most + 1):
        for m in {pp, 2 * pp} if schedule == "interleaved" else {2, 4}:
            if 16 % (2 * m):
                continue
            for g in _pipelines(t, pp, m, schedule, chunks):
                _same(t, g)


def test_the_issue_repro_builds_with_every_schedule() -> None:
    """A 4-layer GPT recomputed per layer, cut in 4 (the default cut used to fall inside
    a layer and the schedule deadlocked)."""
    t = T.training(models.gpt(2, 16, 48, 4, 200, 4, dtype=F64))
    t = T.recompute(t, models.gpt_layer_activations(t))
    _same(t, T.megatron(t, 1, 1, 4, 2, "1f1b"))
    _same(t, T.pipeline_parallel(t, 4, 2, "1f1b"))
    _same(t, T.pipeline_parallel(t, 2, 2, "interleaved", chunks=2))
    _same(t, T.megatron(t, 1, 1, 2, 2, "interleaved", chunks=2))


@pytest.mark.parametrize("how", ["none", "per-layer"])
def test_the_default_cut_is_at_layer_boundaries_up_to_one_stage_per_layer(how) -> None:
    t = _recomputed(T.training(_gpt(layers=6)), how)
    for pp in range(2, 6 + 1):
        cut = pipeline_cut(t, pp)
        assert cut.at == "layer boundaries"
        assert len(cut.stages) == pp
        for stage in cut.stages[1:]:  # one value crosses: a block's output (or the embedding)
            (value,) = stage.receives
            assert value == "emb" or value.endswith("_res2")
        # each stage holds whole layers: all ten weights of a block, or none
        for i in range(6):
            holding = [s.stage for s in cut.stages for w in s.weights if w.startswith(f"h{i}_")]
            assert len(holding) == 10 and len(set(holding)) == 1
    # the built step puts every weight on the stage pipeline_cut names
    cut = pipeline_cut(t, 3)
    g = T.pipeline_parallel(t, 3, 4, "1f1b")
    device = {v.name: v.type.device for v in g.inputs}
    for s in cut.stages:
        assert {device[w] for w in s.weights} == {s.stage}


def test_deep_pipelines_one_layer_per_stage_with_the_interleaved_schedule() -> None:
    t = T.training(_gpt(layers=8))
    t = T.recompute(t, models.gpt_layer_activations(t))
    assert pipeline_cut(t, 8).at == "layer boundaries"
    assert pipeline_cut(t, 4, chunks=2).at == "layer boundaries"
    _same(t, T.megatron(t, 1, 1, 8, 8, "interleaved"))
    _same(t, T.megatron(t, 1, 1, 4, 4, "interleaved", chunks=2))
    _same(t, T.pipeline_parallel(t, 4, 8, "interleaved", chunks=2))
    # 16 model stages for 8 layers: the cut moves between sublayers, and says so
    cut = pipeline_cut(t, 8, chunks=2)
    assert cut.at == "sublayer boundaries"
    assert any(s.receives[0].endswith("_res1") for s in cut.stages[1:])
    _same(t, T.megatron(t, 1, 1, 8, 8, "interleaved", chunks=2))


CUTS = {  # cuts inside layers, per attention form
    ("fused", "attention"): {"h1_ctx": 1},  # q, k and v cross
    ("unfused", "attention"): {"h1_scores": 1},
    ("fused", "sublayer"): {"h1_res1": 1},  # between attention and MLP
    ("unfused", "two"): {"h0_fc": 1, "h2_probs": 2},  # inside two layers
    ("fused", "two"): {"h0_fc": 1, "h2_ctx": 2},
}


@pytest.mark.parametrize(("attention", "where"), list(CUTS), ids=lambda x: str(x))
def test_a_cut_inside_a_recomputed_layer_is_honoured(attention, where) -> None:
    stage_of = CUTS[attention, where]
    t = T.training(models.gpt(8, 4, 8, 2, 16, LAYERS, dtype=F64, attention=attention))
    r = T.recompute(t, models.gpt_layer_activations(t))
    pp = 1 + len(stage_of)
    cut = pipeline_cut(r, pp, stage_of=stage_of)
    assert cut.at == "annotations"
    for s in stage_of.values():  # several values cross a cut inside a layer
        assert cut.stages[s].receives
    for schedule in ("gpipe", "1f1b"):
        g = T.pipeline_parallel(r, pp, 4, schedule, stage_of=stage_of)
        _same(r, g)
        made_on = {
            op.outputs[0].name: op.device for op in g.ops if op.outputs[0].name.endswith("_mb0")
        }
        for name, s in stage_of.items():
            assert made_on[f"{name}_mb0"] == s
    _same(r, T.megatron(r, 2, 1, pp, 2, "1f1b", stage_of=stage_of))


def test_a_stage_replays_from_the_values_it_received() -> None:
    """Cut between a block's attention and MLP, the later stage recomputes from the values
    it received in the forward pass: no backward op reads a replay of an earlier stage
    (that read was the schedule's deadlock), and the earlier stage replays nothing that
    only the later one needed."""
    t = T.training(_gpt())
    r = T.recompute(t, models.gpt_layer_activations(t))
    stage_of = {"h1_res1": 1}
    before = stage_assignment(r, 2, stage_of)
    crossing = [
        op
        for op in r.ops
        for v in op.inputs
        if v in r.producers and before[r.producers[v]] < before[op] and op in backward_ops(r)
        if r.producers[v] in backward_ops(r)
    ]
    assert crossing  # the recomputed program read replays across the cut
    g, stage = staged(r, 2, annotated_stages(r, stage_of))
    backward = backward_ops(g)
    for op in backward:
        for v in op.inputs:
            made = g.producers.get(v)
            assert made is None or made not in backward or stage[made] >= stage[op], op
    # the replay of h1's attention output add on stage 0 fed only stage 1: it is gone
    assert len(g.ops) < len(r.ops)
    _same(r, T.pipeline_parallel(r, 2, 2, "1f1b", stage_of=stage_of))


def test_more_stages_than_the_model_allows_are_refused_naming_the_limit() -> None:
    t = T.training(models.gpt(64, 16, 32, 2, 64, 2))
    with pytest.raises(TransformError, match=r"pp=16 but gpt has 2 repeated layers.*at most 8"):
        T.megatron(t, 1, 1, 16, 16)
    with pytest.raises(TransformError, match=r"pp=4 x chunks=4 = 16 model stages.*at most 8"):
        T.megatron(t, 1, 1, 4, 16, "interleaved", chunks=4)
    with pytest.raises(TransformError, match=r"stages=3 but mlp has 2 weight.*at most 2"):
        T.pipeline_parallel(T.training(_mlp(layers=2)), 3, 4)


def test_every_stage_the_model_allows_computes() -> None:
    """pp up to the model's limit: every device of the step computes (the default cut left
    two of 16 devices without work on this model)."""
    t = T.training(models.gpt(16, 8, 16, 2, 32, 2))
    topology = ir.Topology.preset("a100-hgx", 8)
    for pp in range(2, 9):
        g = T.megatron(t, 1, 1, pp, 8)
        result = ir.simulate(g, topology)
        computing = {e.device for e in result.events if e.stream == "compute" and e.dur_s > 0}
        assert computing == set(range(pp)), pp
