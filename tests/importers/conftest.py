"""Tiny transformer models for the importer tests: random weights from small configs,
never a download."""

from __future__ import annotations

import importlib.util
from pathlib import Path

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


def _llama7b_benchmark():
    spec = importlib.util.spec_from_file_location(
        "llama7b_simulation",
        Path(__file__).resolve().parents[2] / "benchmarks" / "llama7b_simulation.py",
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Llama-7B's widths (hidden 4096, 32 heads, MLP 11008, vocabulary 32000) with ``layers``
# layers, bf16, on the meta device: shapes only, never executed. The benchmark's own
# model, so that the tests check the program whose figures it prints.
llama_7b = _llama7b_benchmark().llama_7b


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


class ImageLogits(torch.nn.Module):
    """An image classifier's forward as a module that returns its logits only."""

    def __init__(self, classifier: torch.nn.Module) -> None:
        super().__init__()
        self.classifier = classifier

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.classifier(pixels).logits


CLASSES = 5


def vit() -> torch.nn.Module:
    """A ViT classifier on 16 x 16 RGB images in 4 x 4 patches (16 patches and the class
    token), 2 layers, hidden 32, 4 heads."""
    torch.manual_seed(0)
    config = transformers.ViTConfig(
        image_size=16,
        patch_size=4,
        num_channels=3,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        num_labels=CLASSES,
        attn_implementation="eager",
    )
    return ImageLogits(transformers.ViTForImageClassification(config).eval())


def pixels(batch: int) -> torch.Tensor:
    return torch.randn((batch, 3, 16, 16), generator=torch.Generator().manual_seed(4))


@pytest.fixture
def ids() -> torch.Tensor:
    return torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(1))


MODELS = {"gpt2": gpt2, "llama": llama, "bert": bert}
LMS = ("gpt2", "llama")  # the causal language models (logits over the vocabulary)
