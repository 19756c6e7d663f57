"""Tiny transformer models for the importer tests: random weights from small configs,
never a download."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the importers extra (torch) is not installed")
transformers = pytest.importorskip(
    "transformers", reason="the importers extra (transformers) is not installed"
)


class Logits(torch.nn.Module):
    """A causal LM's forward as a module that returns its logits only (no cache)."""

    def __init__(self, lm: torch.nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.lm(ids, use_cache=False).logits


class Hidden(torch.nn.Module):
    """An encoder's forward as a module that returns its last hidden state."""

    def __init__(self, encoder: torch.nn.Module) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.encoder(ids).last_hidden_state


class MeanSquare(torch.nn.Module):
    """``mean((module(ids) - target) ** 2)``: a scalar loss to train on."""

    def __init__(self, module: torch.nn.Module, target: torch.Tensor) -> None:
        super().__init__()
        self.module = module
        self.register_buffer("target", target)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return ((self.module(ids) - self.target) ** 2).mean()


VOCAB = 64


def gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2,
        n_embd=32,
        n_head=4,
        vocab_size=VOCAB,
        n_positions=16,
        bos_token_id=0,
        eos_token_id=0,
        tie_word_embeddings=False,
        attn_implementation="eager",
    )
    return Logits(transformers.GPT2LMHeadModel(config).eval())


def llama() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        num_hidden_layers=2,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=16,
        attn_implementation="eager",
    )
    return Logits(transformers.LlamaForCausalLM(config).eval())


def bert() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.BertConfig(
        num_hidden_layers=2,
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=4,
        vocab_size=VOCAB,
        max_position_embeddings=16,
        attn_implementation="eager",
    )
    return Hidden(transformers.BertModel(config).eval())


@pytest.fixture
def ids() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(1))


MODELS = {"gpt2": gpt2, "llama": llama, "bert": bert}
LMS = ("gpt2", "llama")  # the causal language models (logits over the vocabulary)
