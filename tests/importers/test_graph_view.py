"""The graph view folds an imported transformer's repeated layers as it does the built-in
GPT's: the layers are the same run of registry ops, found structurally."""

from __future__ import annotations

import ir
from widgets.graph import GraphOptions, render_graph

from .conftest import Logits, torch, transformers


def _gpt2(layers: int) -> ir.Function:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=layers,
        n_embd=32,
        n_head=4,
        vocab_size=64,
        n_positions=16,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation="eager",
    )
    lm = Logits(transformers.GPT2LMHeadModel(config).eval())
    f, _ = ir.from_torch(lm, (torch.randint(0, 64, (2, 8)),))
    return f


def test_an_imported_gpt2_folds_every_layer_but_the_first():
    per_layer = len(_gpt2(6).ops) - len(_gpt2(5).ops)
    drawing = render_graph(_gpt2(6), None, GraphOptions(max_ops=80))
    assert [len(hidden) for hidden in drawing.groups.values()] == [5 * per_layer]
