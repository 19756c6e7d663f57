"""Which inputs are the batch when an imported model's buffers have other leading sizes.

Swin and LeViT (issue 29's zoo) read integer index buffers (relative positions: Swin's
``(256,)``, LeViT's ``(4, 4)``) that torch.export lists before the images. The batch was
"the first non-weight input whose leading size is not 1": the buffer. Data parallelism
then split the index table and failed at the window reshape ("cannot fit Reshape onto a
shard"), which looked like a reshape merging the batch; the merge (batch as the leading
factor of windows) was never the problem. Now, where the leading sizes differ, the batch
is the rows of the labels a loss reads, else of an output. Proven by execution in
float64.
"""

from __future__ import annotations

import numpy as np
import pytest

import ir
from ir.transforms._rewrite import batch_inputs

T = ir.transforms

F64 = ir.DType.float64
BATCH, WINDOWS, TOKENS, HIDDEN = 6, 2, 3, 4
TRAINED = ["table", "wq", "wk", "wv"]


def windows() -> ir.Function:
    """Swin in miniature: an index buffer (first) picks a learned bias; the tokens are cut
    into windows (the batch merged with the windows, leading), attended, merged back."""
    b = ir.FunctionBuilder("windows")
    index = b.input("relative_index", ir.TensorType((TOKENS * TOKENS,), ir.DType.int64, 0))
    table = b.input("table", ir.TensorType((5, 1), F64, 0))
    wq, wk, wv = (b.input(n, ir.TensorType((HIDDEN, HIDDEN), F64, 0)) for n in ("wq", "wk", "wv"))
    x = b.input("x", ir.TensorType((BATCH, WINDOWS * TOKENS, HIDDEN), F64, 0))
    rows = b.call("Reshape", b.call("Embedding", table, index), shape=(1, TOKENS, TOKENS))
    win = b.call("Reshape", x, shape=(BATCH * WINDOWS, TOKENS, HIDDEN), name="windows")
    q, k, v = (b.call("MatMul", win, w, name=n) for w, n in ((wq, "q"), (wk, "k"), (wv, "v")))
    kt = b.call("Transpose", k, perm=(0, 2, 1), name="kt")
    scores = b.call("Add", b.call("MatMul", q, kt, name="scores"), rows, name="biased")
    probs = b.call("Softmax", scores, axis=2, name="probs")
    out = b.call("MatMul", probs, v, name="attended")
    return b.finish(b.call("Reshape", out, shape=(BATCH, WINDOWS * TOKENS, HIDDEN), name="y"))


def _inputs(f: ir.Function) -> list:
    xs = ir.random_inputs(f, 2)
    for i, v in enumerate(f.inputs):
        if v.name == "relative_index":
            xs[i] = np.arange(TOKENS * TOKENS) % 5
    return xs


def _assert_equal(g: ir.Function, f: ir.Function) -> None:
    xs = _inputs(f)
    want = ir.execute(f, xs)
    got = ir.execute_step(g, xs, source=f)
    for v, a, w in zip(f.outputs, got, want, strict=True):
        np.testing.assert_allclose(a, w, rtol=1e-12, atol=1e-14, err_msg=v.name)


def test_the_batch_is_the_images_not_the_index_buffer_before_them() -> None:
    f = windows()
    assert [v.name for v in batch_inputs(f)] == ["x"]  # the output's rows
    t = T.training(ir.models.with_loss(f, kind="mse"), params=TRAINED)
    assert [v.name for v in batch_inputs(t)] == ["x", "labels"]  # the loss's rows


@pytest.mark.parametrize(
    "build",
    [
        lambda t: T.data_parallel(t, 2),
        lambda t: T.megatron(t, 2, 1, 1, 1),
        lambda t: T.megatron(t, 3, 1, 1, 2),
    ],
    ids=["data_parallel", "megatron_dp2", "megatron_dp3_m2"],
)
def test_windows_merged_with_the_batch_split_as_blocks(build) -> None:
    f = windows()
    _assert_equal(T.data_parallel(f, 2), f)
    t = T.training(ir.models.with_loss(f, kind="mse"), params=TRAINED)
    _assert_equal(build(t), t)


def test_a_reshape_that_merges_the_batch_behind_another_axis_is_refused_by_name() -> None:
    """The batch as the trailing factor of a merged axis is no contiguous block."""
    b = ir.FunctionBuilder("trailing")
    w = b.input("w", ir.TensorType((4, 3), F64, 0))
    x = b.input("x", ir.TensorType((8, 4), F64, 0))
    ht = b.call("Transpose", b.call("MatMul", x, w, name="h"), perm=(1, 0), name="ht")
    flat = b.call("Reshape", ht, shape=(24,), name="flat")
    f = b.finish(b.call("Reshape", flat, shape=(3, 8), name="y"))
    with pytest.raises(T.TransformError, match=r"axis 1 of 'ht' .* must stay whole\n  in: flat"):
        T.data_parallel(f, 2)


def test_the_batch_inputs_are_found_once_per_program_and_kept_with_it(monkeypatch) -> None:
    """A search's builds ask the batch inputs of one training step hundreds of times (its
    data plans, stage cuts and constants): found once, kept with the (immutable) program
    (``Function.derived``); each caller gets its own list, and a pickled program (an
    executor's worker's) answers the same."""
    import pickle

    from ir.transforms import _rewrite

    t = T.training(ir.models.with_loss(windows(), kind="mse"), params=TRAINED)
    calls = []
    found = _rewrite._batch_inputs
    monkeypatch.setattr(_rewrite, "_batch_inputs", lambda f: calls.append(f) or found(f))
    first = batch_inputs(t)
    first.append(t.inputs[0])  # the caller's list, not the kept one
    assert [v.name for v in batch_inputs(t)] == ["x", "labels"]
    assert len(calls) == 1
    copy = pickle.loads(pickle.dumps(t))
    assert [v.name for v in batch_inputs(copy)] == ["x", "labels"]
    other = windows()  # another program is its own
    assert [v.name for v in batch_inputs(other)] == ["x"]
    assert len(calls) == 2
