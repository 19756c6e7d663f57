"""Expert parallelism in the 3D step: experts split over groups of data-parallel replicas,
tokens sent to their experts and back by all-to-alls, executed equal to the sequential
step, and the all-to-all's bytes as the closed form says."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import ir
from ir import models, transforms
from ir.sim.traffic import traffic_bytes
from ir.transforms import TransformError, megatron

F64 = ir.DType.float64
MOE = models.gpt(8, 8, 16, 4, 32, 2, dtype=F64, experts=4, top_k=2, shared_experts=1)


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


@pytest.mark.parametrize(
    ("dp", "tp", "pp", "m", "ep", "zero", "sp"),
    [
        (2, 1, 1, 1, 2, 0, False),
        (4, 1, 1, 1, 4, 0, False),
        (4, 1, 1, 2, 2, 0, False),
        (2, 2, 1, 1, 2, 0, False),
        (2, 2, 2, 2, 2, 0, False),
        (4, 2, 1, 1, 2, 1, False),
        (2, 2, 1, 2, 2, 3, False),
        (2, 2, 1, 1, 2, 0, True),
        (4, 1, 2, 2, 2, 2, False),
    ],
)
def test_expert_parallel_steps_equal_the_sequential_step(dp, tp, pp, m, ep, zero, sp) -> None:
    t = transforms.training(MOE, optimizer="adam")
    g = megatron(t, dp, tp, pp, m, ep=ep, zero=zero, sequence_parallel=sp)
    _run(t, g)
    # two all-to-alls each way per MoE layer and microbatch: dispatch and combine, in
    # the forward and again in the backward
    assert Counter(op.op_type for op in g.ops)["AllToAll"] == 2 * 2 * 2 * m


def test_llama_style_top1_and_a_dense_first_layer_under_ep() -> None:
    f = models.gpt(8, 8, 16, 4, 32, 3, dtype=F64, experts=4, top_k=1, dense_layers=1)
    t = transforms.training(f, optimizer="sgd")
    _run(t, megatron(t, 4, 1, 1, 2, ep=4))


def test_experts_are_split_over_the_expert_group_and_summed_over_the_others() -> None:
    t = transforms.training(MOE, optimizer="adam")
    g = megatron(t, 4, 2, 1, 1, ep=2)
    layouts = dict(zip((v.name for v in g.inputs), g.input_layouts))
    by_name = {v.name: v for v in g.inputs}
    # replicas (2 groups of 2 expert ranks) x tensor ranks: expert w1 split by experts
    # over the group and by columns over the tensor ranks
    assert layouts["h0_moe_w1"] == ("R@2", "S(0)@2", "S(2)@2")
    assert by_name["h0_moe_w1"].type.elements[0].shape == (2, 16, 32)
    assert layouts["m_h0_moe_w1"] == layouts["h0_moe_w1"]
    assert layouts["h0_attn_wq"] == ("R@4", "S(1)@2")
    reduced = {
        op.outputs[0].name: op.attributes["groups"] for op in g.ops if op.op_type == "AllReduce"
    }
    # an expert's gradient is summed over the replicas holding the same experts (2 of the
    # 4), a dense weight's over all 4
    assert [len(x) for x in reduced["dh0_moe_w1_dp"]] == [2] * 4
    assert [len(x) for x in reduced["dh0_attn_wq_dp"]] == [4] * 2


@pytest.mark.parametrize("ep", [2, 4, 8])
def test_all_to_all_bytes_per_rank_are_b_s_k_h_times_one_minus_one_over_ep(ep) -> None:
    """Each all-to-all moves a rank's dispatched buffer, ``b s k h`` elements at capacity
    factor 1, but the share that stays on the rank: ``b s k h bytes (1 - 1/ep)`` per rank,
    twice forward (dispatch, combine) and twice backward, per MoE layer and microbatch."""
    b, s, h, k, e, layers, m = 2, 16, 32, 2, 8, 3, 2
    f = models.gpt(b * ep * m, s, h, 4, 64, layers, experts=e, top_k=k, aux_loss=0.0)
    t = transforms.training(f)
    g = megatron(t, ep, 1, 1, m, ep=ep)
    sent = traffic_bytes(g)["alltoall"]
    per_call = b * s * k * h * 4 * (1 - 1 / ep)  # float32
    for d in range(ep):
        assert sent[d] == pytest.approx(4 * layers * m * per_call)
    # the simulator times each as an all-to-all of that buffer over the expert group
    result = ir.simulate(g, ir.Topology.preset("h100-hgx", ep, ideal=True))
    moved = [e for e in result.events_on(0) if e.op.op_type == "AllToAll"]
    assert len(moved) == 4 * layers * m
    assert all(e.bytes == b * s * k * h * 4 for e in moved)


def test_bad_expert_degrees_are_refused_naming_the_limit() -> None:
    t = transforms.training(MOE)
    with pytest.raises(TransformError, match="ep=3 must divide dp=4"):
        megatron(t, 4, ep=3)
    f = models.gpt(12, 8, 16, 4, 32, 1, experts=6, top_k=2)
    with pytest.raises(TransformError, match="ep=4 does not divide the 6 experts"):
        megatron(transforms.training(f), 4, ep=4)
    dense = models.gpt(8, 8, 16, 4, 32, 1)
    with pytest.raises(TransformError, match="needs a mixture-of-experts model"):
        megatron(transforms.training(dense), 2, ep=2)
    with pytest.raises(TransformError, match="positive integer"):
        megatron(t, 2, ep=0)


@pytest.mark.parametrize("ep", [1, 2])
def test_a_pipeline_cut_between_the_router_and_its_experts_runs(ep) -> None:
    """The experts on the stage after their router (as a cut balancing the weights puts
    them: they hold most of the bytes): the combine's gradient, which dispatches dy by the
    router's slots, runs with the experts' gradients, not back on the router's stage
    (the schedule deadlocked)."""
    f = models.gpt(4, 8, 16, 4, 32, 2, dtype=F64, experts=4, top_k=2)
    t = transforms.training(f, optimizer="sgd")
    _run(t, megatron(t, 2, 1, 2, 2, ep=ep, stage_of={"h0_moe_fc": 1}))


def test_a_top_k_beyond_the_experts_is_refused_when_the_model_is_built() -> None:
    """No transform sees such a model: the builder names k and the limit."""
    with pytest.raises(ir.DistIRError, match=r"top_k=3 is more than the 2 experts; choose k <= 2"):
        models.gpt(4, 8, 16, 4, 32, 1, experts=2, top_k=3)


def test_a_moe_model_is_cut_at_its_layer_boundaries_despite_its_carried_losses() -> None:
    """Every MoE layer's load-balancing loss is carried to the model's loss: a scalar,
    not an activation, so the points between layers stay points (a dense first layer
    and three MoE layers: four stages at the layer boundaries, not sublayers)."""
    f = models.gpt(8, 8, 16, 4, 32, 4, dtype=F64, experts=4, top_k=2, dense_layers=1)
    t = transforms.training(f, optimizer="sgd")
    cut = transforms.pipeline_cut(t, 4)
    assert cut.at == "layer boundaries", cut
    _run(t, megatron(t, 2, 1, 4, 4, ep=2))


LLAMA_MOE = models.llama(
    8, 8, 16, 4, 32, 2, dtype=F64, kv_heads=2, ffn=24, experts=4, top_k=2, shared_experts=1
)


@pytest.mark.parametrize(
    ("dp", "tp", "pp", "m", "ep", "zero"),
    [(2, 1, 1, 1, 2, 0), (2, 2, 1, 1, 2, 0), (2, 2, 2, 2, 2, 3)],
)
def test_llama_moe_steps_equal_the_sequential_step(dp, tp, pp, m, ep, zero) -> None:
    """Llama's SwiGLU experts (gate ``w1``, up ``w3``, down ``w2``; ``ir.models_moe``)
    under expert, tensor, pipeline and ZeRO-3 parallelism, as the GPT's GELU experts."""
    t = transforms.training(LLAMA_MOE, optimizer="adam")
    g = megatron(t, dp, tp, pp, m, ep=ep, zero=zero)
    _run(t, g)
    assert Counter(op.op_type for op in g.ops)["AllToAll"] == 2 * 2 * 2 * m
    if tp == 2 and zero == 0:
        layouts = dict(zip((v.name for v in g.inputs), g.input_layouts))
        # gate and up split by experts over the group and by columns over the tensor
        # ranks, the down projection by rows
        for name in ("h0_moe_w1", "h0_moe_w3"):
            assert layouts[name] == ("R@1", "S(0)@2", "S(2)@2"), name
        assert layouts["h0_moe_w2"] == ("R@1", "S(0)@2", "S(1)@2")


def test_llama_moe_options_are_checked_as_the_gpts() -> None:
    f = models.llama(4, 8, 16, 4, 32, 3, ffn=24, experts=4, top_k=1, dense_layers=1, aux_loss=0.0)
    names = {v.name for v in f.inputs}
    assert "h0_mlp_w_gate" in names and "h0_moe_w1" not in names  # the dense first layer
    assert {"h1_moe_w1", "h1_moe_w3", "h2_moe_w2"} <= names and "h1_mlp_w_up" not in names
    shape = {v.name: v.type.shape for v in f.inputs}
    assert shape["h1_moe_w3"] == (4, 16, 24) and shape["h1_moe_w2"] == (4, 24, 16)  # F: ffn
    assert all(op.op_type != "MoEAuxLoss" for op in f.ops)  # aux_loss=0 adds no loss
    with pytest.raises(ir.DistIRError, match=r"top_k=3 is more than the 2 experts"):
        models.llama(4, 8, 16, 4, 32, 1, experts=2, top_k=3)
