"""Megatron-LM's recomputation granularities against Korthikanti et al. (2022), "Reducing
Activation Recomputation in Large Transformer Models", Table 2 and section 5.

The paper stores ``s b h (34 + 5 a s / h)`` bytes of activations per transformer layer
(16-bit activations, 1-byte dropout masks); its selective recomputation drops the
``5 a s / h`` term, full recomputation keeps ``2 s b h`` (the layer's input). With
Megatron-LM's dropouts (``ir.models.gpt(dropout=, attention_dropout=)``) this GPT has every
term: ``34 s b h + 5 a s^2 b``, ``10 + 24 / t`` under tensor parallelism over ``t`` ranks,
``34 / t`` with sequence parallelism too. Without dropout it has ``32 s b h`` (less the
attention and MLP dropout masks, ``s b h`` each) and ``2 a s^2 b`` (the softmax output; the
paper's 5 adds its dropout mask and dropout output): ``8 + 24 / t`` and ``32 / t``.
Measured on the simulator's memory curve at the start of the backward pass (bfloat16, the
unfused attention, whose scores are ops), equal to the byte.
"""

from __future__ import annotations

import numpy as np
import pytest

import ir
from ir import models, transforms
from ir.errors import ArgumentError
from ir.transforms import RecomputeError, TransformError, megatron, recompute
from ir.types import TupleType

B, S, H, A = 2, 64, 64, 4  # batch, sequence, hidden, heads


def _gpt(layers: int, dtype: str = "bfloat16", **options) -> ir.Function:
    """The unfused attention (its scores and softmax are ops), as Korthikanti et al. count."""
    return models.gpt(
        batch=B,
        seq=S,
        hidden=H,
        heads=A,
        vocab=128,
        layers=layers,
        dtype=dtype,
        attention="unfused",
        **options,
    )


def _input_bytes(g: ir.Function, device: int) -> int:
    def on(t: ir.Type) -> int:
        if isinstance(t, TupleType):
            return sum(on(e) for e in t.elements)
        return t.size_bytes if t.device == device else 0

    return sum(on(v.type) for v in g.inputs)


def _stored_bytes(g: ir.Function, devices: int = 1, device: int = 0) -> float:
    """Live bytes on ``device`` when the backward pass starts, beyond the step's inputs."""
    result = ir.simulate(g, ir.Topology.preset("a100-hgx", devices))
    start = min(
        e.start_s
        for e in result.events
        if e.device == device and ir.get_op(e.op.op_type).extra.get("backward_seed")
    )
    times, live = result.memory_timeline(device)
    return float(live[np.searchsorted(times, start, side="left") - 1]) - _input_bytes(g, device)


LAYERS = 4
T4 = transforms.training(_gpt(LAYERS))
T2 = transforms.training(_gpt(2))


def test_a_layer_stores_korthikantis_bytes_less_the_dropout_terms() -> None:
    per_layer = (_stored_bytes(T4) - _stored_bytes(T2)) / 2
    assert per_layer == S * B * H * (32 + 2 * A * S / H)


def test_selective_recomputation_drops_the_attention_core_term() -> None:
    saved = _stored_bytes(T4) - _stored_bytes(recompute(T4, "selective"))
    assert saved == LAYERS * 2 * A * S * S * B  # the 2as/h term, layer by layer


def test_full_recomputation_keeps_each_layers_input_only() -> None:
    saved = _stored_bytes(T4) - _stored_bytes(recompute(T4, "full"))
    assert saved == LAYERS * (S * B * H * (32 + 2 * A * S / H) - 2 * S * B * H)
    # the first k layers of each of p stages (--recompute-num-layers): k * p layers
    one_of_two = _stored_bytes(T4) - _stored_bytes(recompute(T4, "full", layers=1, stages=2))
    assert one_of_two == saved / 2


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_tensor_parallel_layers_and_selective_recomputation_per_rank(sequence_parallel) -> None:
    tp = 2
    steps = {
        n: megatron(t, 1, tp, 1, 1, sequence_parallel=sequence_parallel)
        for n, t in (
            (4, T4),
            (2, T2),
        )
    }
    per_layer = (_stored_bytes(steps[4], tp) - _stored_bytes(steps[2], tp)) / 2
    replicated = 0 if sequence_parallel else 8  # layer norms' inputs and outputs
    split = (32 - replicated) / tp
    assert per_layer == S * B * H * (replicated + split + 2 * A * S / (H * tp))
    selective = megatron(
        T4, 1, tp, 1, 1, sequence_parallel=sequence_parallel, recompute="selective"
    )
    assert _stored_bytes(steps[4], tp) - _stored_bytes(selective, tp) == (
        LAYERS * 2 * A * S * S * B / tp
    )


def test_the_modes_choose_what_megatron_recomputes() -> None:
    core = transforms.attention_core_activations(T4)
    assert [v.name for v in core[:4]] == ["h0_scores", "h0_scaled", "h0_masked", "h0_probs"]
    assert len(core) == 4 * LAYERS
    names = {v.name for v in transforms.mode_activations(T4, "full", layers=1, stages=2)}
    assert {n.split("_")[0] for n in names} == {"h0", "h2"}  # the first layer of each stage
    assert transforms.mode_activations(T4, "full", layers=0) == []


@pytest.mark.parametrize(
    ("mode", "layers", "args"),
    [
        ("selective", None, (2, 2, 2, 2)),
        ("full", None, (1, 2, 2, 4)),
        ("full", 1, (2, 1, 2, 2)),
        ("full", 1, (1, 1, 2, 4, "interleaved")),
    ],
)
def test_recomputed_steps_equal_the_sequential_step(mode, layers, args) -> None:
    f = models.gpt(batch=8, seq=8, hidden=16, heads=4, vocab=32, layers=4, dtype="float64")
    t = transforms.training(f, optimizer="adam")
    options = {"chunks": 2} if "interleaved" in args else {}
    g = megatron(t, *args, recompute=mode, recompute_layers=layers, **options)
    xs = [
        np.abs(x) if v.name.startswith("v_") else x for v, x in zip(t.inputs, ir.random_inputs(t))
    ]
    got = ir.collect(g, ir.execute(g, ir.distribute(g, xs, source=t)), rtol=1e-9)
    for v, w, o in zip(t.outputs, ir.execute(t, xs), got):
        np.testing.assert_allclose(o, w, rtol=1e-7, atol=1e-10, err_msg=v.name)
    # and the training switch is the same program as recomputing the step
    same = transforms.training(f, optimizer="adam", recompute=mode, recompute_layers=layers)
    assert same.is_equivalent(recompute(t, mode, layers=layers))


def test_bad_modes_say_what_to_do() -> None:
    with pytest.raises(ArgumentError, match=r"a mode \('selective', 'full'\) or a list"):
        recompute(T2, "partial")
    with pytest.raises(RecomputeError, match="with 'full'"):
        recompute(T2, "selective", layers=1)
    with pytest.raises(RecomputeError, match="layers= goes with"):
        recompute(T2, ["h0_gelu"], layers=1)
    mlp = transforms.training(models.mlp(8, 4, 8, 2, layers=3))
    with pytest.raises(RecomputeError, match="no transformer layers"):
        recompute(mlp, "full")
    assert recompute(mlp, "selective").is_equivalent(mlp)  # no attention core: nothing to do
    with pytest.raises(TransformError, match="recompute_layers= goes with"):
        megatron(T2, 1, 1, 1, 1, recompute_layers=1)


def _attention_with_dropout() -> ir.Function:
    """One attention core with dropout on its probabilities (the paper's softmax dropout)."""
    b = ir.FunctionBuilder("attn")
    x = b.input("x", ir.TensorType((2, 8, 16), ir.DType.float32, 0))
    w = {n: b.input(n, ir.TensorType((16, 16), ir.DType.float32, 0)) for n in ("wq", "wk", "wv")}
    labels = b.input("labels", ir.TensorType((2, 8), ir.DType.int64, 0))
    q = b.call("MatMul", x, w["wq"], name="q")
    kt = b.call("Transpose", b.call("MatMul", x, w["wk"], name="k"), perm=(0, 2, 1), name="kt")
    scores = b.call("Scale", b.call("MatMul", q, kt, name="scores"), factor=0.25, name="scaled")
    probs = b.call("Softmax", b.call("CausalMask", scores, name="masked"), name="probs")
    dropped, _ = b.call("Dropout", probs, p=0.1, seed=3, name=["dropped", "keep"])
    y = b.call("MatMul", dropped, b.call("MatMul", x, w["wv"], name="v"), name="ctx")
    return b.finish([b.call("Loss", y, labels, name="l")])


def test_selective_recomputation_replays_the_softmax_dropout_too() -> None:
    t = transforms.training(_attention_with_dropout())
    core = {v.name for v in transforms.attention_core_activations(t)}
    assert core == {"scores", "scaled", "masked", "probs", "dropped", "keep"}
    r = recompute(t, "selective")
    xs = ir.random_inputs(t, 1)
    for a, b in zip(ir.execute(r, xs), ir.execute(t, xs)):
        np.testing.assert_array_equal(a, b)
    # the probabilities (4 bytes), the dropout's output (4) and mask (1) per score
    scores = 2 * 8 * 8
    assert _stored_bytes(t) - _stored_bytes(r) == scores * (4 + 4 + 1)


def test_with_megatrons_dropouts_a_layer_stores_exactly_korthikantis_bytes() -> None:
    drop = {"dropout": 0.1, "attention_dropout": 0.1}
    t4, t2 = (transforms.training(_gpt(n, **drop)) for n in (4, 2))
    sbh, core = S * B * H, 5 * A * S * S * B  # the paper's 5 a s / h term, times s b h
    assert (_stored_bytes(t4) - _stored_bytes(t2)) / 2 == 34 * sbh + core
    assert _stored_bytes(t4) - _stored_bytes(recompute(t4, "selective")) == LAYERS * core
    full = _stored_bytes(t4) - _stored_bytes(recompute(t4, "full"))
    assert full == LAYERS * (34 * sbh + core - 2 * sbh)
    tp = 2
    for sp, whole in ((False, 10 * sbh + 24 * sbh / tp), (True, 34 * sbh / tp)):
        g4, g2 = (megatron(t, 1, tp, 1, 1, sequence_parallel=sp) for t in (t4, t2))
        assert (_stored_bytes(g4, tp) - _stored_bytes(g2, tp)) / 2 == whole + core / tp
