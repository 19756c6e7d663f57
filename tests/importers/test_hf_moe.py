"""Hugging Face mixture-of-experts models through ``ir.from_torch``: each experts module
one ``distir::moe_experts`` node, imported as the registry's MoE ops
(``ir/importers/_hf_experts.py``, ``_aten_moe.py``). Tiny Mixtral, Qwen2-MoE (a shared
expert behind a sigmoid gate, gates not renormalised), Qwen3-MoE (renormalised) and
GLM4-MoE (DeepSeek-V3's sigmoid, group-limited routing) equal torch, train equal to
torch's autograd, and shard by expert, data and pipeline parallelism equal to the
sequential step; the capacity option costs and drops as documented; what the importer
cannot map keeps its clear error."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

import ir
from ir.importers import TorchImportError, UnsupportedOpsError, weight_name

from .conftest import VOCAB, Logits, torch, transformers

EXPERTS, TOP_K, SEQ = 4, 2, 8
SMALL = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=VOCAB,
    max_position_embeddings=32,
    attn_implementation="eager",
)


def _routed(lm: torch.nn.Module) -> Logits:
    """``lm`` in eval mode with weights large enough that routing matters: the routers'
    logits of order 1 (uneven loads, gates far from uniform), the experts' output of the
    order of the residual stream. Returns its logits-only wrapper."""
    with torch.no_grad():
        for name, p in lm.named_parameters():
            if name.endswith("mlp.gate.weight"):
                p.normal_(0.0, 1.0)
        for name, b in lm.named_buffers():
            if name.endswith("e_score_correction_bias"):  # DeepSeek-V3's balancing bias
                b.normal_(0.0, 0.1)
            elif "experts" in name:
                p.normal_(0.0, 0.3)
    return Logits(lm.eval())


def mixtral(**settings) -> Logits:
    torch.manual_seed(0)
    config = transformers.MixtralConfig(
        **SMALL, num_local_experts=EXPERTS, num_experts_per_tok=TOP_K, **settings
    )
    return _routed(transformers.MixtralForCausalLM(config))


def qwen2_moe() -> Logits:
    torch.manual_seed(0)
    config = transformers.Qwen2MoeConfig(
        **SMALL,
        num_experts=EXPERTS,
        num_experts_per_tok=TOP_K,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
        norm_topk_prob=False,
    )
    return _routed(transformers.Qwen2MoeForCausalLM(config))


def qwen3_moe() -> Logits:
    torch.manual_seed(0)
    config = transformers.Qwen3MoeConfig(
        **SMALL,
        head_dim=8,
        num_experts=EXPERTS,
        num_experts_per_tok=TOP_K,
        moe_intermediate_size=32,
        norm_topk_prob=True,
    )
    return _routed(transformers.Qwen3MoeForCausalLM(config))


def glm4_moe() -> Logits:
    """DeepSeek-V3's routing: sigmoid scores with a balancing bias, the experts chosen in
    the best of 2 groups of 2 (a group mask scattered from a top-k), a shared expert."""
    torch.manual_seed(0)
    config = transformers.Glm4MoeConfig(
        **SMALL,
        head_dim=8,
        n_routed_experts=EXPERTS,
        num_experts_per_tok=TOP_K,
        moe_intermediate_size=32,
        first_k_dense_replace=0,
        n_group=2,
        topk_group=1,
        routed_scaling_factor=2.5,
    )
    return _routed(transformers.Glm4MoeForCausalLM(config))


MODELS = {"mixtral": mixtral, "qwen2_moe": qwen2_moe, "qwen3_moe": qwen3_moe, "glm4_moe": glm4_moe}


def _ids(batch: int = 2) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, SEQ), generator=torch.Generator().manual_seed(1))


def _logits(lm: torch.nn.Module, ids: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        return lm(ids).numpy()


def _load(lm: torch.nn.Module, ids: torch.Tensor) -> int:
    """The most tokens one expert receives of one sequence, over the MoE layers."""
    chosen = []
    hooks = [
        layer.mlp.gate.register_forward_hook(lambda m, args, out: chosen.append(out[2]))
        for layer in lm.lm.model.layers
    ]
    with torch.no_grad():
        lm(ids)
    for h in hooks:
        h.remove()
    rows = [row for index in chosen for row in index.reshape(ids.shape[0], -1)]
    return max(int(torch.bincount(row, minlength=EXPERTS).max()) for row in rows)


def _ops(f: ir.Function, op_type: str) -> list:
    return [op for op in f.ops if op.op_type == op_type]


@pytest.mark.parametrize("name", list(MODELS))
def test_an_imported_moe_model_equals_torch_with_one_moe_layer_per_block(name: str):
    lm, ids = MODELS[name](), _ids()
    f, args = ir.from_torch(lm, (ids,))
    (logits,) = ir.execute(f, args)
    assert _load(lm, ids) > SEQ * TOP_K // EXPERTS  # some expert above its uniform load
    np.testing.assert_allclose(logits, _logits(lm, ids), rtol=1e-4, atol=1e-5)
    # each layer: the router's MoETopK (GLM's three: the groups' best two, the best
    # group, the experts), then dispatch and combine around the experts' two grouped
    # products; dropless: a place for every token of a sequence
    assert len(_ops(f, "MoETopK")) == (6 if name == "glm4_moe" else 2)
    for op_type in ("MoESlots", "MoEDispatch", "MoECombine"):
        assert len(_ops(f, op_type)) == 2, op_type
    for op in _ops(f, "MoESlots"):
        assert op.attributes == {"experts": EXPERTS, "capacity": SEQ}
        assert op.outputs[0].name.endswith("_slot_dropless")
    products = [op for op in _ops(f, "MatMul") if op.outputs[0].type.rank == 3]
    assert {op.outputs[0].type.shape[:2] for op in products} == {(EXPERTS, 2 * SEQ)}


def _renormalised(f: ir.Function) -> int:
    """How many MoETopK gates are divided by their sum over the choices."""
    gates = {op.outputs[0] for op in _ops(f, "MoETopK")}
    summed = {op.outputs[0] for op in _ops(f, "ReduceSum") if op.inputs[0] in gates}
    return sum(op.inputs[0] in gates and op.inputs[1] in summed for op in _ops(f, "Div"))


@pytest.mark.parametrize(("name", "renormalised"), [("mixtral", 2), ("qwen2_moe", 0)])
def test_gates_are_renormalised_as_the_model_says(name: str, renormalised: int):
    """Mixtral always divides its top-k gates by their sum; Qwen-MoE only with
    ``norm_topk_prob`` (False here, True in the Qwen3-MoE above): MoETopK itself returns
    the probabilities as they are."""
    f, _ = ir.from_torch(MODELS[name](), (_ids(),))
    assert _renormalised(f) == renormalised


def test_the_shared_expert_and_its_sigmoid_gate_are_imported_beside_the_experts():
    f, _ = ir.from_torch(qwen2_moe(), (_ids(),))
    names = {v.name for v in f.inputs}
    assert {
        "lm_model_layers_0_mlp_shared_expert_gate_proj_weight",
        "lm_model_layers_0_mlp_shared_expert_gate_weight",
        "lm_model_layers_0_mlp_experts_gate_up_proj",
    } <= names
    assert len(_ops(f, "Sigmoid")) >= 2  # the shared experts' gates (and SiLU)


def test_the_import_leaves_the_model_as_it_was():
    lm, ids = mixtral(), _ids()
    before = _logits(lm, ids)
    experts = [m for m in lm.modules() if type(m).__name__ == "MixtralExperts"]
    blocks = [m for m in lm.modules() if type(m).__name__ == "MixtralSparseMoeBlock"]
    ir.from_torch(lm, (ids,))
    with pytest.raises(TorchImportError):  # an export that fails restores them too
        ir.from_torch(lm, (ids.float(),))
    assert all("forward" not in m.__dict__ for m in experts)
    assert all(not m._forward_pre_hooks for m in blocks)
    np.testing.assert_array_equal(_logits(lm, ids), before)


def test_the_one_op_experts_compute_what_transformers_computes_eagerly():
    """The custom op's eager kernel (used outside tracing) equals transformers' own
    ``grouped_mm`` experts, in a forward and in a model with transposed weights."""
    from ir.importers._hf_experts import experts_as_one_op, moe_experts

    lm, ids = qwen3_moe(), _ids()
    want = _logits(lm, ids)
    with experts_as_one_op(lm) as notes:
        got = _logits(lm, ids)
    assert notes == []
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    experts = lm.lm.model.layers[0].mlp.experts
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(2))
    index = torch.stack([torch.randperm(EXPERTS)[:TOP_K] for _ in range(16)])
    w = torch.rand(16, TOP_K)
    with torch.no_grad():
        want = experts(x, index, w)
        plain = moe_experts(x, index, w, experts.gate_up_proj, experts.down_proj, 8, False)
        turned = moe_experts(
            x,
            index,
            w,
            experts.gate_up_proj.transpose(1, 2).contiguous(),
            experts.down_proj.transpose(1, 2).contiguous(),
            8,
            True,
        )
    np.testing.assert_allclose(plain.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(turned.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)


class _TransposedExperts(torch.nn.Module):
    """Experts stored ``(E, in, out)`` (transformers' ``is_transposed``, Aria's layout)
    behind a softmax top-2 router, calling the importer's op directly."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.router = torch.nn.Parameter(torch.randn(16, EXPERTS, generator=g))
        self.gate_up = torch.nn.Parameter(0.3 * torch.randn(EXPERTS, 16, 24, generator=g))
        self.down = torch.nn.Parameter(0.3 * torch.randn(EXPERTS, 12, 16, generator=g))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from ir.importers._hf_experts import moe_experts

        tokens = x.reshape(-1, 16)
        gates, index = torch.topk(torch.softmax(tokens @ self.router, -1), TOP_K, dim=-1)
        y = moe_experts(tokens, index, gates, self.gate_up, self.down, x.shape[1], True)
        return y.reshape(x.shape)


def test_transposed_expert_weights_import_equal():
    net, x = _TransposedExperts(), torch.randn(3, SEQ, 16, generator=torch.Generator())
    f, args = ir.from_torch(net, (x,))
    (y,) = ir.execute(f, args)
    np.testing.assert_allclose(y, net(x).detach().numpy(), rtol=1e-4, atol=1e-5)
    assert not _ops(f, "Transpose")  # (E, in, out): the products read the weights as they are


class _TopK(torch.nn.Module):
    def __init__(self, **how) -> None:
        super().__init__()
        self.how = how

    def forward(self, x: torch.Tensor):
        values, index = torch.topk(x, 3, **self.how)
        return values * 2.0, index


@pytest.mark.parametrize("how", [{}, {"largest": False}, {"sorted": False, "dim": 2}])
def test_topk_along_the_last_axis_is_moetopk(how: dict):
    x = torch.randn(2, 5, 7, generator=torch.Generator().manual_seed(4))
    f, args = ir.from_torch(_TopK(**how), (x,))
    values, index = ir.execute(f, args)
    want_values, want_index = _TopK(**how)(x)
    if how.get("sorted") is False:  # any order is torch's: compare as sets per row
        order = np.argsort(-values, axis=-1)
        values, index = (np.take_along_axis(a, order, -1) for a in (values, index))
        back = torch.argsort(-want_values, dim=-1)
        want_values, want_index = want_values.gather(-1, back), want_index.gather(-1, back)
    np.testing.assert_allclose(values, want_values.numpy(), rtol=1e-6)
    np.testing.assert_array_equal(index, want_index.numpy())
    assert len(_ops(f, "MoETopK")) == 1


class _Scatter(torch.nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return x.scatter(self.dim, index, -2.0) * 3.0


def test_a_scattered_value_along_the_last_axis_imports_and_another_is_refused():
    x = torch.randn(6, 5, generator=torch.Generator().manual_seed(5))
    index = torch.tensor([[0, 3], [4, 4], [1, 2], [0, 1], [2, 2], [3, 0]])
    f, args = ir.from_torch(_Scatter(1), (x, index))
    np.testing.assert_allclose(ir.execute(f, args)[0], _Scatter(1)(x, index).numpy())
    with pytest.raises(UnsupportedOpsError, match=r"aten.scatter.value \(dim=0"):
        ir.from_torch(_Scatter(0), (x, index))


def test_topk_along_another_axis_is_refused_by_name():
    with pytest.raises(UnsupportedOpsError) as e:
        ir.from_torch(_TopK(dim=1), (torch.randn(2, 5, 7),))
    assert "aten.topk.default (dim=1 of a rank-3 tensor (MoETopK ranks the last))" in e.value.ops


def _training_step(lm: torch.nn.Module, ids: torch.Tensor, optimizer: str = "sgd"):
    """The imported step with torch's cross-entropy, its arguments (labels, then any
    optimizer state) and the trained weight names."""
    f, args = ir.from_torch(lm, (ids,))
    f = ir.models.with_loss(f)
    labels = np.random.default_rng(3).integers(0, VOCAB, ids.shape)
    trained = {weight_name(k) for k, _ in lm.named_parameters()}
    params = [v.name for v in f.inputs if v.name in trained]
    t = ir.transforms.training(f, params=params, optimizer=optimizer, lr=0.1)
    args = [*args, labels]
    rng = np.random.default_rng(6)  # Adam's moments as in the middle of training
    state = [
        (np.abs if v.name.startswith("v_") else np.asarray)(
            1e-3 * rng.standard_normal(v.type.shape).astype(np.float32)
        )
        for v in t.inputs[len(args) :]
    ]
    return t, [*args, *state], labels, params


@pytest.mark.parametrize("name", ["mixtral", "qwen2_moe", "glm4_moe"])
def test_an_imported_moe_model_trains_as_torchs_autograd(name: str):
    """One SGD step updates every weight (router, experts, shared expert and its gate) as
    torch's autograd through transformers' own experts does (GLM's gates are gathered
    from its sigmoid scores: ``TakeAlongAxisGrad``)."""
    lm, ids = MODELS[name](), _ids()
    t, args, labels, params = _training_step(lm, ids)
    loss = torch.nn.functional.cross_entropy(
        lm(ids).reshape(-1, VOCAB), torch.from_numpy(labels).reshape(-1)
    )
    loss.backward()
    grads = {weight_name(k): p.grad for k, p in lm.named_parameters()}
    results = ir.execute(t, args)
    np.testing.assert_allclose(results[-1], float(loss.detach()), rtol=1e-5)
    got = dict(zip(params, results))
    by_name = dict(zip((v.name for v in t.inputs), args))
    router = [n for n in params if n.endswith("mlp_gate_weight")]
    assert len(router) == 2 and all(grads[n].abs().max() > 1e-4 for n in router)
    for n in params:
        want = by_name[n] - 0.1 * grads[n].numpy()
        np.testing.assert_allclose(got[n], want, rtol=1e-4, atol=1e-6, err_msg=n)


def _assert_step_equal(t: ir.Function, g: ir.Function, args: list) -> None:
    want = ir.execute(t, args)
    got = ir.collect(g, ir.execute(g, ir.distribute(g, args, source=t)), rtol=1e-4)
    for v, o, w in zip(t.outputs, got, want, strict=True):
        np.testing.assert_allclose(o, w, rtol=1e-4, atol=1e-6, err_msg=v.name)


@pytest.mark.parametrize(
    ("name", "dp", "pp", "m", "ep"),
    [
        ("mixtral", 2, 1, 1, 2),
        ("qwen2_moe", 2, 1, 1, 2),
        ("glm4_moe", 2, 1, 1, 2),
        ("mixtral", 2, 2, 2, 2),
    ],
)
def test_expert_data_and_pipeline_parallel_steps_equal_the_sequential_step(name, dp, pp, m, ep):
    """``T.megatron(..., ep=2)`` finds the imported experts (their weights read through the
    transposes of torch's ``(E, out, in)`` layout): each expert rank holds 2 of the 4
    experts of every layer, tokens reach them by all-to-alls, Adam updates the step as
    the sequential one does."""
    t, args, _, _ = _training_step(MODELS[name](), _ids(4), optimizer="adam")
    g = ir.transforms.megatron(t, dp, 1, pp, m, ep=ep)
    layouts = dict(zip((v.name for v in g.inputs), g.input_layouts))
    for layer in (0, 1):
        for w in ("gate_up_proj", "down_proj"):
            assert f"S(0)@{ep}" in layouts[f"lm_model_layers_{layer}_mlp_experts_{w}"]
    # dispatch and combine, forward and backward, per MoE layer and microbatch
    assert Counter(op.op_type for op in g.ops)["AllToAll"] == 2 * 2 * 2 * m
    _assert_step_equal(t, g, args)


def test_a_capacity_factor_costs_its_load_and_drops_past_it():
    """Dropless (the default) gives each expert ``S`` places a sequence: the simulator
    charges the experts' products ``E / k`` times what ``moe_capacity_factor=1`` (the
    uniform load, ``S k / E`` places) charges. Where the routing is uneven (an expert
    receiving more than its uniform load here) the capped import drops choices and
    differs from torch; a factor whose capacity reaches ``S`` is exact again."""
    lm, ids = mixtral(), _ids()
    uniform = SEQ * TOP_K // EXPERTS
    assert _load(lm, ids) > uniform
    want = _logits(lm, ids)
    exact, _ = ir.from_torch(lm, (ids,))
    capped, capped_args = ir.from_torch(lm, (ids,), moe_capacity_factor=1.0)
    assert {op.attributes["capacity"] for op in _ops(capped, "MoESlots")} == {uniform}
    assert all(op.outputs[0].name.endswith("_slot_capped") for op in _ops(capped, "MoESlots"))
    (dropped,) = ir.execute(capped, capped_args)
    assert np.abs(dropped - want).max() > 1e-3
    whole, whole_args = ir.from_torch(lm, (ids,), moe_capacity_factor=2.0)  # 2 S k / E = S
    np.testing.assert_allclose(ir.execute(whole, whole_args)[0], want, rtol=1e-4, atol=1e-5)

    def expert_flops(f: ir.Function) -> float:
        result = ir.simulate(f, ir.Topology.preset("h100-hgx", 1))
        names = ("_gate_up", "_expert_out")
        return sum(e.flops for e in result.events if e.op.outputs[0].name.endswith(names))

    assert math.isclose(expert_flops(exact), EXPERTS / TOP_K * expert_flops(capped))


@pytest.mark.parametrize("factor", [0, -1.0, float("nan"), float("inf"), "1", True])
def test_a_capacity_factor_that_is_no_positive_number_is_refused(factor):
    with pytest.raises(TorchImportError, match="moe_capacity_factor"):
        ir.from_torch(mixtral(), (_ids(),), moe_capacity_factor=factor)


def test_experts_the_importer_cannot_map_keep_the_clear_error_naming_their_ops():
    """GELU experts are not the gated SiLU experts the importer maps: transformers' sorted
    grouped products stay, and the error lists their ATen ops and says which module was
    left as it is, and why."""
    with pytest.raises(UnsupportedOpsError) as e:
        ir.from_torch(mixtral(hidden_act="gelu"), (_ids(),))
    ops = {op.split(" ")[0] for op in e.value.ops}
    assert {"aten.sort.default", "aten.histc.default", "aten.index_put.default"} <= ops
    assert "aten.topk.default" not in ops  # the router's top-k is imported
    message = str(e.value)
    assert "lm.model.layers.0.mlp.experts (MixtralExperts): activation" in message
    assert "lm.model.layers.1.mlp.experts" in message


def test_the_workbench_imports_with_the_capacity_factor_it_is_given():
    """``Workbench.from_torch`` passes ``moe_capacity_factor`` to the importer: dropless by
    default (``S`` places), the uniform load's places with a factor of one."""
    from workbench import Workbench

    lm, ids = mixtral(), _ids()
    topology = ir.Topology.preset("h100-hgx", 2)
    exact = Workbench.from_torch(lm, (ids,), topology)
    capped = Workbench.from_torch(lm, (ids,), topology, moe_capacity_factor=1.0)
    capacities = [
        {op.attributes["capacity"] for op in _ops(wb.session.base, "MoESlots")}
        for wb in (exact, capped)
    ]
    assert capacities == [{SEQ}, {SEQ * TOP_K // EXPERTS}]
