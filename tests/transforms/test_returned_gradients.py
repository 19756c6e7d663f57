"""A 3D-parallel step returns the gradients a training step returns, laid out as what
they are: all-reduced among the data-parallel replicas (``R``), or reduce-scattered
under ZeRO (``S(k)``), never partial sums.

Found by fuzzing transforms with execution proofs (``benchmarks/fuzz.py``, target
*programs*): ``megatron`` / ``gradient_accumulation`` of ``training(...,
return_gradients=True)`` with dp > 1 labelled the all-reduced gradients ``P@dp``, so
``ir.collect`` summed dp full copies and returned dp times the gradient.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import ir
from ir.transforms import megatron, training


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_returned_gradients_equal_the_sequential_ones(optimizer: str) -> None:
    t = training(ir.models.mlp(8, 4, 8, 4, layers=3), optimizer, return_gradients=True)
    inputs = ir.random_inputs(t)
    want = ir.execute(t, inputs)
    grads = [i for i, v in enumerate(t.outputs) if v.name.startswith("dw")]
    assert len(grads) == 3
    checked = 0
    for dp, tp, pp, zero in itertools.product([2, 4], [1, 2], [1, 2], [0, 1, 2]):
        try:
            g = megatron(t, dp=dp, tp=tp, pp=pp, microbatches=2, zero=zero)
        except ir.DistIRError:  # a split this small program cannot take
            continue
        checked += 1
        levels = [g.output_layouts[i][0] for i in grads]
        assert not any(level.startswith("P") for level in levels), levels
        got = ir.execute_step(g, inputs, t)
        for a, b in zip(got, want):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    assert checked >= 12
