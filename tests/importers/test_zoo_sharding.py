"""The zoo's architectures that issue 29 found unshardable, sharded.

Each is its ``transformers`` class from ``benchmarks/hf_zoo.py``'s small config, in
float64 (Gemma's in float32, see ``FLOAT32``), with a batch of 4; its training step (a
loss on its first output, SGD) is distributed and executed equal to the sequential step
(rtol 1e-9; 1e-4 in float32). What failed before:

* Gemma, Gemma2, ResNet, EfficientNet under a pipeline: "the pipeline schedule
  deadlocks" (a weight scaled through ``1 + w`` or a reshape: its gradient chain ran on
  two stages);
* ViT, DeiT, DINOv2, BEiT (class token), RoBERTa, XLM-R (token type ids), BLOOM (ALiBi
  bias) under ``megatron`` with data or pipeline parallelism: whole-batch values made
  from no batch input;
* Swin, LeViT under data parallelism: an index buffer taken for the batch.

A sample runs every time; ``-m slow`` runs them all.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import numpy as np
import pytest

import ir

pytest.importorskip("transformers", reason="the importers extra (transformers) is missing")
os.environ["HF_HUB_OFFLINE"] = "1"

_SPEC = importlib.util.spec_from_file_location(
    "hf_zoo", Path(__file__).resolve().parents[2] / "benchmarks" / "hf_zoo.py"
)
zoo = sys.modules.get("hf_zoo") or importlib.util.module_from_spec(_SPEC)
if "hf_zoo" not in sys.modules:
    sys.modules["hf_zoo"] = zoo
    _SPEC.loader.exec_module(zoo)

T = ir.transforms
BUILDS = {
    "megatron_dp2": lambda t: T.megatron(t, 2, 1, 1, 1),
    "megatron_pp2": lambda t: T.megatron(t, 1, 1, 2, 2),
    "megatron_dp2_pp2": lambda t: T.megatron(t, 2, 1, 2, 2),
    "pipeline_parallel": lambda t: T.pipeline_parallel(t, 2, 2, "1f1b"),
    "data_parallel": lambda t: T.data_parallel(t, 2),
}
SAMPLE = [
    ("gemma", "megatron_pp2"),
    ("resnet", "pipeline_parallel"),
    ("vit", "megatron_dp2_pp2"),
    ("bloom", "megatron_dp2_pp2"),
    ("swin", "megatron_dp2"),
]
SLOW = [
    ("gemma", "pipeline_parallel"),
    ("gemma2", "megatron_pp2"),
    ("resnet", "megatron_pp2"),
    ("efficientnet", "megatron_pp2"),
    ("deit", "megatron_dp2_pp2"),
    ("dinov2", "megatron_pp2"),
    ("beit", "megatron_pp2"),
    ("roberta", "megatron_dp2_pp2"),
    ("xlm_roberta", "megatron_pp2"),
    ("bloom", "pipeline_parallel"),
    ("swin", "data_parallel"),
    ("levit", "megatron_dp2_pp2"),
]


# Gemma's norms compute in float32 whatever the model's dtype (``x.float()``, ``1 +
# w.float()``): in float64 the step casts the scale's gradient back after it is summed over
# the replicas, which megatron does not run (only optimizer steps follow the all-reduce).
# They run in float32, as the zoo does.
FLOAT32 = {"gemma", "gemma2"}


def zoo_step(name: str, batch: int = 4):
    """The architecture's SGD step (float64 unless in FLOAT32), its arguments, and the
    relative tolerance its sharded step is held to."""
    arch = zoo.ZOO[name]
    module, inputs = zoo.model(arch), arch.inputs(batch)
    if name not in FLOAT32:
        module = module.double()
        inputs = tuple(x.double() if x.is_floating_point() else x for x in inputs)
    f, args = ir.from_torch(module, inputs)
    t, targs, _, _ = zoo.training_step(arch, module, inputs, f, args)
    if name in FLOAT32:
        return t, targs, 1e-4
    targs = [np.asarray(x, np.float64) if np.asarray(x).dtype == np.float32 else x for x in targs]
    return t, targs, 1e-9


# LeViT's attention-index buffers are (16, 16) and (4, 4): at a batch of 4 the second
# would be taken for a batch input (a buffer may hold batch data), so LeViT takes 8.
BATCH = {"levit": 8}


def _check(name: str, how: str) -> None:
    t, targs, rtol = zoo_step(name, BATCH.get(name, 4))
    g = BUILDS[how](t)
    want = ir.execute(t, targs)
    got = ir.execute_step(g, targs, source=t, rtol=rtol)
    for v, a, w in zip(t.outputs, got, want, strict=True):
        np.testing.assert_allclose(
            a, w, rtol=rtol, atol=rtol / 1e3, err_msg=f"{name} {how}: {v.name}"
        )


@pytest.mark.parametrize(("name", "how"), SAMPLE)
def test_an_architecture_issue_29_could_not_shard_shards(name: str, how: str) -> None:
    _check(name, how)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "how"), SLOW)
def test_every_architecture_issue_29_could_not_shard_shards(name: str, how: str) -> None:
    _check(name, how)
