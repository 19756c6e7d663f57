"""A 3D step of one batch piece (``dp = microbatches = 1``) is a steady-state step too.

With one piece the data level has no partial sums to reduce, so each optimizer step ran
inside the piece and its results left as per-microbatch outputs: the updated weights and
optimizer state came out as a tuple of one microbatch, laid out ``("S(0)", "S(0)@1",
...)``, where the inputs they replace are laid out ``("R@1", ...)``. The first step
collected right; a second step on the first one's outputs (a training loop, the torch
backend's carry) could not take them. Now each is returned in its input's layout.
"""

from __future__ import annotations

import pytest
from _parallel_programs import assert_same

import ir
from ir import models, transforms
from ir.transforms._emit import carried_inputs

F64 = ir.DType.float64
GPT = transforms.training(models.gpt(4, 4, 8, 2, 8, 2, dtype=F64), "adam")
MLP = transforms.training(models.mlp(4, 4, 8, 4, layers=3, dtype=F64), "sgd")


@pytest.mark.parametrize(
    "t, options",
    [
        (MLP, {}),
        (MLP, {"tp": 2}),
        (MLP, {"pp": 3}),
        (GPT, {"tp": 2, "pp": 2}),
        (GPT, {"cp": 2, "sequence_parallel": True}),
        (GPT, {"tp": 2, "chunks": 2, "schedule": "interleaved", "recompute": "full"}),
    ],
    ids=["mlp", "mlp-tp2", "mlp-pp3", "gpt-tp2-pp2", "gpt-cp2", "gpt-interleaved"],
)
def test_a_one_piece_steps_updates_feed_its_next_step(t: ir.Function, options: dict) -> None:
    g = transforms.megatron(t, **options)
    position = {v: i for i, v in enumerate(t.inputs)}
    carried = carried_inputs(t)
    assert carried
    for out, source in carried.items():
        assert g.output_layouts[t.outputs.index(out)] == g.input_layouts[position[source]]
    assert_same(t, g, steps=3)
