"""Constants a model makes for the whole batch, imported so that the transforms can cut
them per microbatch (issue 29's BLOOM and the Llama-7B pipeline figure).

torch evaluates what depends on no input at import time. A causal mask built at the
batch's shape (every row the same) became a constant input of the batch's leading size,
taken for a batch input and sent from the first pipeline stage to every other one per
microbatch; BLOOM's ALiBi bias, repeated to ``batch * heads`` rows, a constant the 3D
step refused to cut ("whole-batch values made from no batch input"). Now a constant whose
rows are all the same is one row broadcast where it is read, and a broadcast
(``expand``, ``repeat``) of a constant stays an op on the smaller constant, which the
transforms build per microbatch. Proven by execution in float64 against torch and the
sequential step.
"""

from __future__ import annotations

import numpy as np
import pytest

import ir

T = ir.transforms

torch = pytest.importorskip("torch", reason="the importers extra (torch) is not installed")

BATCH, SEQ, HEADS, DIM = 4, 5, 2, 3


class Attention(torch.nn.Module):
    """Two heads of attention with a causal mask made at the batch's shape and an ALiBi-
    like bias repeated to ``batch * heads`` rows, as BLOOM builds it."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = torch.nn.Linear(HEADS * DIM, 3 * HEADS * DIM)
        self.out = torch.nn.Linear(HEADS * DIM, HEADS * DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        mask = torch.triu(torch.full((b, 1, s, s), -1e4, dtype=x.dtype), diagonal=1)
        slopes = torch.tensor([0.5, 0.25], dtype=x.dtype)
        bias = slopes[:, None, None] * torch.arange(s, dtype=x.dtype)[None, None, :]
        bias = bias.repeat(b, 1, 1)  # (b * heads, 1, s)
        q, k, v = self.qkv(x).view(b, s, 3, HEADS, DIM).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-1, -2)).reshape(b * HEADS, s, s) + bias
        scores = scores.view(b, HEADS, s, s) + mask
        y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, HEADS * DIM)
        return self.out(y)


def _imported():
    torch.manual_seed(0)
    module = Attention().double().eval()
    x = torch.randn(BATCH, SEQ, HEADS * DIM, dtype=torch.float64)
    f, args = ir.from_torch(module, (x,))
    return module, x, f, args


def test_the_constants_are_no_bigger_than_a_row_or_the_repeated_block() -> None:
    module, x, f, args = _imported()
    with torch.no_grad():
        want = module(x).numpy()
    np.testing.assert_allclose(ir.execute(f, args)[0], want, rtol=1e-12)
    consts = {v.name: v.type.shape for v in f.inputs if v.name.startswith("const_")}
    assert consts, "the mask and the bias stay constants"
    assert all(shape[0] in (1, HEADS) for shape in consts.values()), consts
    assert [v.name for v in T._rewrite.batch_inputs(f)] == ["x"]


@pytest.mark.parametrize(
    "build",
    [
        lambda t: T.data_parallel(t, 2),
        lambda t: T.pipeline_parallel(t, 2, 2),
        lambda t: T.megatron(t, 2, 1, 1, 1),
        lambda t: T.megatron(t, 1, 1, 2, 2),
        lambda t: T.megatron(t, 2, 1, 1, 2),
    ],
    ids=["data_parallel", "pipeline_parallel", "megatron_dp2", "megatron_pp2", "megatron_dp2_m2"],
)
def test_the_batch_constants_are_made_per_microbatch(build) -> None:
    _, _, f, args = _imported()
    weights = [v.name for v in f.inputs if not v.name.startswith("const_") and v.name != "x"]
    t = T.training(ir.models.with_loss(f, kind="mse"), params=weights)
    labels = np.random.default_rng(0).standard_normal(t.inputs[-1].type.shape)
    xs = [*args, labels]
    g = build(t)
    want = ir.execute(t, xs)
    got = ir.execute_step(g, xs, source=t)
    for v, a, w in zip(t.outputs, got, want, strict=True):
        np.testing.assert_allclose(a, w, rtol=1e-10, atol=1e-12, err_msg=v.name)
