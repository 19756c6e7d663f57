"""The torch kernels of ranked programs compute what the registry's numpy kernels compute,
on every example the registry walk uses, and cover every op of the MLP and GPT steps."""

from __future__ import annotations

import numpy as np
import pytest

import ir
import ir.models
from ir import transforms
from ir.execute import input_value_ranges
from ir.registry import TypeContext
from ir.sharding import lower_to_ranks
from ir.types import TupleType

torch = pytest.importorskip("torch", reason="torch is not installed (pip install torch)")

from ir.backends.torch_kernels import TORCH_KERNELS  # noqa: E402


def _random(t, rng, value_range=None):
    if isinstance(t, TupleType):
        return tuple(_random(e, rng) for e in t.elements)
    if value_range is not None and value_range[1] is not None:  # labels, token ids
        return rng.integers(value_range[0], value_range[1], t.shape).astype(t.dtype.numpy)
    if t.dtype.is_float:
        return rng.uniform(-1.0, 1.0, t.shape).astype(t.dtype.numpy)
    return rng.integers(0, 2, t.shape).astype(t.dtype.numpy)


def _torch(x):
    return tuple(_torch(e) for e in x) if isinstance(x, tuple) else torch.from_numpy(x.copy())


def _numpy(y):
    return tuple(_numpy(e) for e in y) if isinstance(y, tuple) else y.numpy()


def _one_op(name: str, example: TypeContext) -> ir.Function:
    b = ir.FunctionBuilder("one")
    xs = [b.input(f"x{i}", t) for i, t in enumerate(example.input_types)]
    return b.finish(list(b.add_op(name, xs, example.attributes).outputs))


def _same(got, want, where: str) -> None:
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want), where
        for g, w in zip(got, want):
            _same(g, w, where)
        return
    assert np.shape(got) == np.shape(want), where
    assert np.asarray(got).dtype == np.asarray(want).dtype, where
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-6, err_msg=where)


@pytest.mark.parametrize("name", sorted(TORCH_KERNELS))
def test_torch_kernel_equals_the_numpy_kernel_on_the_registry_examples(name):
    op = ir.get_op(name)
    rng = np.random.default_rng(0)
    for scale in (1, 2):
        for k, raw in enumerate(op.extra["examples"](scale)):
            example = TypeContext(raw.input_types, op.complete_attributes(raw.attributes))
            where = f"{name} example {k} at scale {scale}"
            ranges = input_value_ranges(_one_op(name, example))
            inputs = [_random(t, rng, ranges.get(i)) for i, t in enumerate(example.input_types)]
            if name == "Adam":  # its second moment must be >= 0
                inputs[3] = np.abs(inputs[3])
            if name == "MasterAdam":
                inputs[4] = np.abs(inputs[4])
            if name in ("Sqrt", "Log", "Power"):  # in their domain: positive (bases)
                inputs[0] = np.abs(inputs[0]) + 0.1
            want = op.kernel(inputs, example.attributes)
            got = TORCH_KERNELS[name]([_torch(x) for x in inputs], example.attributes)
            assert len(got) == len(want), where
            for g, w in zip(got, want):
                # the backend casts results to the type's dtype; here compare values
                g = _numpy(g)
                if not isinstance(w, tuple):
                    g = np.asarray(g).astype(np.asarray(w).dtype)
                _same(g, w, where)


def _ops_of_steps() -> set[str]:
    f64 = ir.DType.float64
    mlp = ir.models.mlp(8, 4, 6, 4, layers=2, dtype=f64)
    gpt = ir.models.gpt(4, 4, 8, 2, 12, 1, dtype=f64)
    unfused = ir.models.gpt(4, 4, 8, 2, 12, 1, dtype=f64, attention="unfused")
    steps = [
        transforms.megatron(transforms.training(unfused), 2, 2, 1, 2),
        transforms.megatron(transforms.training(gpt), 2, 2, 2, 2),  # vocabulary-parallel
        transforms.megatron(transforms.training(gpt), 2, 1, 2, 2),  # whole vocabulary
        transforms.megatron(transforms.training(gpt, optimizer="adam"), 1, 2, 1, zero=1),
        transforms.megatron(transforms.training(gpt), 1, 2, 1, sequence_parallel=True),
        transforms.megatron(transforms.training(mlp, optimizer="adam"), 2, 1, 2, 2),
        transforms.pipeline_parallel(transforms.training(mlp), 2, 2, "interleaved"),
        gpt,
        mlp,
    ]
    found = set()
    for g in steps:
        for program in lower_to_ranks(transforms.unroll_pmap(g)).unique:
            found |= {op.op_type for op in program.ops}
    return found


def test_every_op_of_the_mlp_and_gpt_steps_has_a_torch_kernel():
    ops = _ops_of_steps() - {"SendTo", "RecvFrom", "RankCollective"}
    assert {"Adam", "LayerNormGrad", "EmbeddingGrad", "SoftmaxGrad", "Split"} <= ops
    assert {"Attention", "AttentionGrad", "CausalMask"} <= ops  # the fused and unfused GPT
    assert {"VocabEmbeddingGrad", "ClassSumExp", "CrossEntropyGrad", "Arange"} <= ops
    assert ops <= set(TORCH_KERNELS), sorted(ops - set(TORCH_KERNELS))
