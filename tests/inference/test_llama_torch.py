"""ir.models.llama is Hugging Face's Llama: with the same weights its forward equals
``transformers.LlamaForCausalLM``'s (float64), and a prefill then decode steps give the
logits and the KV cache that the torch model gives with ``use_cache=True``. The prefill
and decode steps exported to ONNX (RMSNormalization, RotaryEmbedding, Attention at opset
23, with their past and present caches) run in onnxruntime equal to torch.

Hugging Face computes the rotary angles in float32 (``LlamaRotaryEmbedding``); the
registry's ``Rotary`` in float64, so the two agree to ~1e-7, not to float64's last bits.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest
from _serving import empty_cache, step_inputs

import ir
from ir.inference import decode_step, prefill_step

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")

LAYERS, SEQ, BATCH = 2, 12, 2


@pytest.fixture(scope="module")
def pair():
    """A random Llama in torch and the same weights for ir.models.llama, by input name."""
    cfg = transformers.LlamaConfig(
        vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(cfg).double().eval()
    sd = {k: v.numpy() for k, v in hf.state_dict().items()}
    w = {"wte": sd["model.embed_tokens.weight"], "norm_g": sd["model.norm.weight"]}
    w["w_head"] = sd["lm_head.weight"].T
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        w[f"h{i}_attn_norm_g"] = sd[p + "input_layernorm.weight"]
        w[f"h{i}_mlp_norm_g"] = sd[p + "post_attention_layernorm.weight"]
        for c in "qkvo":
            w[f"h{i}_attn_w{c}"] = sd[p + f"self_attn.{c}_proj.weight"].T
        for ours, theirs in (("gate", "gate_proj"), ("up", "up_proj"), ("down", "down_proj")):
            w[f"h{i}_mlp_w_{ours}"] = sd[p + f"mlp.{theirs}.weight"].T
    w["tokens"] = np.random.default_rng(1).integers(0, 50, (BATCH, SEQ))
    f = ir.models.llama(BATCH, SEQ, 32, 4, 50, LAYERS, kv_heads=2, ffn=48, dtype="float64")
    return hf, f, w


# the keyword a model's forward takes its cache by (transformers 5 renames past_key_values)
_CACHE = (
    "cache"
    if "cache" in inspect.signature(transformers.LlamaForCausalLM.forward).parameters
    else "past_key_values"
)


def _cache_of(past, layer: int):
    """(keys, values) of one layer of a transformers cache, whatever its version calls them."""
    if hasattr(past, "layers"):
        return past.layers[layer].keys, past.layers[layer].values
    return past[layer][0], past[layer][1]


def test_the_forward_equals_transformers_llama(pair):
    hf, f, w = pair
    ours = ir.execute(f, [w.get(v.name, w["tokens"]) for v in f.inputs])[0]
    theirs = hf(torch.tensor(w["tokens"])).logits.detach().numpy()
    np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)


def test_prefill_and_decode_equal_transformers_with_use_cache(pair):
    hf, f, w = pair
    tokens, prompt = w["tokens"], 7
    with torch.no_grad():
        out = hf(torch.tensor(tokens[:, :prompt]), use_cache=True)
    p = prefill_step(f, prompt)
    logits, *cache = ir.execute(p, step_inputs(p, w, tokens[:, :prompt], empty_cache(p)))
    np.testing.assert_allclose(logits[:, 0], out.logits[:, -1].numpy(), rtol=1e-6, atol=1e-6)
    for c in range(prompt, SEQ):
        for layer in range(LAYERS):
            keys, values = _cache_of(out.past_key_values, layer)
            np.testing.assert_allclose(cache[2 * layer], keys.numpy(), rtol=1e-6, atol=1e-6)
            np.testing.assert_allclose(cache[2 * layer + 1], values.numpy(), rtol=1e-6, atol=1e-6)
        with torch.no_grad():
            out = hf(
                torch.tensor(tokens[:, c : c + 1]), use_cache=True, **{_CACHE: out.past_key_values}
            )
        d = decode_step(f, c)
        logits, *cache = ir.execute(d, step_inputs(d, w, tokens[:, c : c + 1], cache))
        np.testing.assert_allclose(logits[:, 0], out.logits[:, -1].numpy(), rtol=1e-6, atol=1e-6)


def test_onnx_prefill_and_decode_run_in_onnxruntime_equal_to_torch(pair, tmp_path):
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")
    hf, _, w = pair
    f32 = ir.models.llama(BATCH, SEQ, 32, 4, 50, LAYERS, kv_heads=2, ffn=48)
    w32 = {k: v.astype(np.float32) if v.dtype == np.float64 else v for k, v in w.items()}
    tokens, prompt = w["tokens"], 7
    with torch.no_grad():
        full = hf(torch.tensor(tokens)).logits.numpy()
    cache: list = []
    for step, window in (
        (prefill_step(f32, prompt), slice(0, prompt)),
        (decode_step(f32, prompt), slice(prompt, prompt + 1)),
    ):
        args = step_inputs(step, w32, tokens[:, window], cache or empty_cache(step))
        path = tmp_path / f"{step.name}.onnx"
        model = ir.to_onnx(step, path)
        assert model.opset_import[0].version == 23
        assert {"RMSNormalization", "RotaryEmbedding", "Attention"} <= {
            n.op_type for n in model.graph.node
        }
        session = ort.InferenceSession(str(path))
        names = [i.name for i in session.get_inputs()]
        got = session.run(None, dict(zip(names, args)))
        want = ir.execute(step, args)
        for g, x in zip(got, want):
            np.testing.assert_allclose(g, x, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(got[0][:, 0], full[:, window.stop - 1], rtol=1e-3, atol=1e-4)
        cache = got[1:]


@pytest.mark.parametrize("use_cache", [False, True])
def test_an_imported_llama_serves_equal_to_torch(use_cache):
    """``ir.from_torch`` of a Hugging Face Llama (its causal mask and rotary tables folded
    into constant inputs, its projections on (positions, features) views; with
    ``use_cache=True`` its own cache as extra outputs): prefill then decode give torch's
    logits. A batch of several sequences merges batch and positions in those views: refused,
    saying to import with batch 1."""
    cfg = transformers.LlamaConfig(
        vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
        tie_word_embeddings=False, use_cache=use_cache,
    )  # fmt: skip
    torch.manual_seed(1)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 50, (1, 10))
    f, args = ir.from_torch(hf, (ids,))
    values = {v.name: a for v, a in zip(f.inputs, args)}
    with torch.no_grad():
        full = hf(ids).logits.numpy()
    tokens, prompt = ids.numpy(), 4
    p = prefill_step(f, prompt, tokens="input_ids")
    # the cache keeps the model's 2 kv heads (before Hugging Face's repeat_kv), and the
    # step's outputs are the logits and its own cache (not the export's)
    assert {v.type.shape[1] for v in p.inputs if v.name.startswith("past_")} == {2}
    assert [v.name for v in p.outputs][1:] == [
        v.name.replace("past", "present") for v in p.inputs[-4:]
    ]
    logits, *cache = ir.execute(p, _named(p, values, tokens[:, :prompt], empty_cache(p)))
    np.testing.assert_allclose(logits[:, 0], full[:, prompt - 1], rtol=1e-4, atol=1e-5)
    for c in range(prompt, 10):
        d = decode_step(f, c, tokens="input_ids")
        logits, *cache = ir.execute(d, _named(d, values, tokens[:, c : c + 1], cache))
        np.testing.assert_allclose(logits[:, 0], full[:, c], rtol=1e-4, atol=1e-5)
    two, _ = ir.from_torch(hf, (torch.randint(0, 50, (2, 10)),))
    with pytest.raises(ir.inference.ServingError, match="import the model with batch 1"):
        decode_step(two, 4, tokens="input_ids")


def _named(step, values, tokens, cache) -> list:
    cache = iter(cache)
    return [
        tokens if v.name == "input_ids" else next(cache) if v.name.startswith("past_")
        else values[v.name]
        for v in step.inputs
    ]  # fmt: skip
