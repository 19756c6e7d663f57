"""Hugging Face architectures as they come (``benchmarks/hf_zoo.py``): built from small
configs with random weights and every other setting at its default (scaled dot-product
attention, ``use_cache=True``), each imports, executes equal to torch (caches included),
trains equal to torch's autograd and SGD, and shards by data, tensor and pipeline
parallelism with the step equal to the sequential one.

Every run checks a decoder (Llama), a decoder with tied embeddings (GPT-2), a mixture of
experts (Mixtral), an encoder (BERT), an encoder-decoder's encoder (Whisper: 1-d
convolutions), a CNN (ConvNeXt: depthwise convolutions) and a vision transformer (ViT:
import, execution, training);
``-m slow`` runs the whole zoo and checks each row of the table in ``docs/importers.md``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="the importers extra (transformers) is missing")
os.environ["HF_HUB_OFFLINE"] = "1"  # the zoo builds from configs; nothing is downloaded

_SPEC = importlib.util.spec_from_file_location(
    "hf_zoo", Path(__file__).resolve().parents[2] / "benchmarks" / "hf_zoo.py"
)
zoo = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = zoo  # its dataclasses look their module up while it loads
_SPEC.loader.exec_module(zoo)

SAMPLE = ("llama", "gpt2", "bert", "whisper_encoder", "convnext", "mixtral")
EVERY = (*zoo.COLUMNS,)


def test_the_zoo_has_fifteen_architectures_of_every_family():
    families = {a.family for a in zoo.ZOO.values()}
    assert families == {
        "decoder",
        "encoder",
        "encoder-decoder encoder",
        "vision transformer",
        "CNN",
    }
    assert len(zoo.ZOO) >= 15


@pytest.mark.parametrize("name", SAMPLE)
def test_an_architecture_imports_executes_trains_and_shards(name: str):
    row = zoo.run(zoo.ZOO[name])
    assert all(row.checks.get(c) for c in EVERY), row.why


def test_a_vision_transformer_imports_executes_and_trains():
    arch = zoo.ZOO["vit"]
    module, inputs, f, args = zoo.check_forward(arch, 2)
    zoo.check_training(arch, module, inputs, f, args)


def _documented() -> dict[str, str]:
    text = zoo.DOCS.read_text()
    table = text[text.index(zoo.BEGIN) : text.index(zoo.END)]
    return {line.split(" | ")[0][2:]: line for line in table.splitlines() if line.startswith("| ")}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(zoo.ZOO))
def test_every_architecture_imports_executes_trains_and_is_as_documented(name: str):
    row = zoo.run(zoo.ZOO[name])
    assert all(row.checks.get(c) for c in ("imports", "executes", "trains")), row.why
    line = zoo.table([row]).splitlines()[-3]
    assert _documented()[name].split(" | ")[:9] == line.split(" | ")[:9], (
        "docs/importers.md's zoo table is out of date: python benchmarks/hf_zoo.py --write-docs"
    )
