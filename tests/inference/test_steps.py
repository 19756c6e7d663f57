"""Prefill and decode steps execute equal to the full forward: the logits of a prompt's
last position after prefill, then of each next position after each decode step on the
cache the previous step returned (numpy, float64), for a Llama-style model with grouped-
query attention and for the GPT; and under tensor, pipeline and replica parallelism."""

from __future__ import annotations

import numpy as np
import pytest
from _serving import empty_cache, forward_values, gpt, llama, step_inputs

import ir
from ir import transforms
from ir.inference import (
    ServingError,
    ServingStrategy,
    decode_step,
    parallel_step,
    prefill_step,
    step,
)

MODELS = {"llama-gqa": llama, "gpt-gqa": gpt, "llama-mqa": lambda **k: llama(kv_heads=1, **k)}


def _generate(f: ir.Function, values: dict, prompt: int, batch: int | None = None):
    """Logits of positions prompt-1 .. S-1 from a prefill, then decode steps."""
    tokens = values["tokens"] if batch is None else values["tokens"][:batch]
    p = prefill_step(f, prompt, batch=batch)
    logits, *cache = ir.execute(p, step_inputs(p, values, tokens[:, :prompt], empty_cache(p)))
    out = [logits[:, 0]]
    for c in range(prompt, tokens.shape[1]):
        d = decode_step(f, c, batch=batch)
        logits, *cache = ir.execute(d, step_inputs(d, values, tokens[:, c : c + 1], cache))
        out.append(logits[:, 0])
    return np.stack(out, axis=1)


@pytest.mark.parametrize("name", list(MODELS))
def test_prefill_then_decode_equals_the_full_forward(name):
    f = MODELS[name]()
    values = forward_values(f, seed=1)
    full = ir.execute(f, [values[v.name] for v in f.inputs])[0]
    got = _generate(f, values, prompt=4)
    np.testing.assert_allclose(got, full[:, 3:], rtol=1e-10, atol=1e-12)


def test_a_step_of_another_batch_follows_the_batch_axis():
    f = llama(batch=2)
    values = forward_values(llama(batch=3), seed=2)  # the same weights, three sequences
    full = ir.execute(llama(batch=3), [values[v.name] for v in llama(batch=3).inputs])[0]
    got = _generate(f, values, prompt=6, batch=3)
    np.testing.assert_allclose(got, full[:, 5:], rtol=1e-10, atol=1e-12)


def test_prefill_keeps_every_position_when_asked_and_chunks_continue_it():
    f = gpt()
    values = forward_values(f, seed=3)
    full = ir.execute(f, [values[v.name] for v in f.inputs])[0]
    p = prefill_step(f, 5, logits="all")
    logits, *cache = ir.execute(p, step_inputs(p, values, values["tokens"][:, :5], empty_cache(p)))
    np.testing.assert_allclose(logits, full[:, :5], rtol=1e-10)
    chunk = step(f, 5, 3, logits="all")  # a chunked prefill of three more positions
    logits, *_ = ir.execute(chunk, step_inputs(chunk, values, values["tokens"][:, 5:8], cache))
    np.testing.assert_allclose(logits, full[:, 5:8], rtol=1e-10)


def test_the_cache_is_state_in_and_out_with_kv_heads_and_the_context():
    d = decode_step(llama(), 7)
    past = [v for v in d.inputs if v.name.startswith("past_")]
    present = d.outputs[1:]
    assert [v.name for v in past] == ["past_key_0", "past_value_0", "past_key_1", "past_value_1"]
    assert [v.name for v in present] == [
        n.replace("past", "present") for n in (v.name for v in past)
    ]
    assert {v.type.shape for v in past} == {(2, 2, 7, 8)}  # (batch, kv heads, context, dh)
    assert {v.type.shape for v in present} == {(2, 2, 8, 8)}
    p = prefill_step(llama(), 5)
    assert {v.type.shape for v in p.outputs[1:]} == {(2, 2, 5, 8)}
    assert p.outputs[0].type.shape == (2, 1, 50)  # the last position's logits
    assert "labels" not in [v.name for v in p.inputs] and "Loss" not in [o.op_type for o in p.ops]


def test_a_decode_step_computes_one_position_and_appends_it_in_place():
    d = decode_step(llama(), 7)
    rows = {v.type.shape[1] for op in d.ops for v in op.outputs if v.type.rank == 3}
    assert rows == {1}  # every (batch, positions, features) value has the new position only
    appends = [op for op in d.ops if op.op_type == "CacheAppend"]
    assert len(appends) == 4
    cost = ir.get_op("CacheAppend").cost_rule(
        ir.registry.CostContext(
            tuple(v.type for v in appends[0].inputs), (appends[0].outputs[0].type,), {"axis": 2}
        )
    )
    new_bytes = appends[0].inputs[1].type.size_bytes
    assert (cost.bytes_read, cost.bytes_written) == (new_bytes, new_bytes)
    rot = [op.attributes["offset"] for op in d.ops if op.op_type == "Rotary"]
    assert set(rot) == {7}


@pytest.mark.parametrize(("dp", "tp", "pp"), [(1, 2, 1), (2, 2, 1), (1, 2, 2), (2, 1, 2)], ids=str)
@pytest.mark.parametrize("kind", ["prefill", "decode"])
def test_parallel_steps_execute_equal_to_the_step(dp, tp, pp, kind):
    f = llama(batch=4)
    s = prefill_step(f, 5) if kind == "prefill" else decode_step(f, 5)
    g = transforms.megatron(s, dp, tp, pp, pp if kind == "decode" else 1)
    xs = ir.random_inputs(s, seed=4)
    for got, want in zip(ir.execute_step(g, xs), ir.execute(s, xs)):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    layouts = dict(zip([v.name for v in g.inputs], g.input_layouts))
    # the cache of each kv head lives with its tensor rank, split over replicas by batch
    assert layouts["past_key_0"] == ("S(0)", f"S(0)@{dp}", f"S(1)@{tp}" if tp > 1 else "R@1")


def test_contexts_beyond_the_positions_are_refused_by_how_much():
    f = llama(seq=10)
    with pytest.raises(ServingError, match="beyond the model's 10 positions by 1"):
        decode_step(f, 10)
    with pytest.raises(ServingError, match="by 2"):
        prefill_step(f, 12)
    decode_step(f, 9)  # the last position


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: ir.models.gpt(2, 8, 16, 2, 20, 1, attention="unfused"), "mixes every position"),
        (lambda: ir.models.gpt(2, 8, 16, 2, 20, 1, dropout=0.1), "dropout"),
        (lambda: ir.models.mlp(4, 3, 5, 2), "token ids"),
    ],
    ids=["unfused attention", "dropout", "no tokens"],
)
def test_forward_programs_a_step_cannot_serve_are_refused(make, message):
    with pytest.raises(ServingError, match=message):
        decode_step(make(), 3)


def test_bad_counts_are_project_errors():
    f = llama()
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ServingError):
            decode_step(f, bad)
    with pytest.raises(ServingError, match="logits"):
        prefill_step(f, 3, logits="first")
    with pytest.raises(ServingError, match="no input 'ids'"):
        prefill_step(f, 3, tokens="ids")


def test_a_single_kv_head_under_tensor_parallelism_is_refused_not_replicated():
    """Multi-query attention's decode step: its key/value projection splits along the head's
    channels, which attention cannot take, so the tensor plan would leave the attention whole
    on every device. That is refused (a TensorReplicationError as a ServingError), never a
    silent replication; its prefill splits the query heads and keeps the kv head whole."""
    f = llama(batch=4, kv_heads=1)
    with pytest.raises(ServingError, match="left it whole on every device"):
        parallel_step(decode_step(f, 5), ServingStrategy(2))
    g = parallel_step(prefill_step(f, 5), ServingStrategy(2))
    layouts = dict(zip((v.name for v in g.inputs), g.input_layouts))
    assert layouts["h0_attn_wq"][-1] == "S(1)@2" and layouts["h0_attn_wk"][-1] == "R@2"
