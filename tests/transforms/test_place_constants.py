"""``place`` keeps an op without operands (a Constant) on its device.

Found by fuzzing transforms with a simulation check (``benchmarks/fuzz.py``, target
*programs*): placing a value of the training step of the seed's data-parallel program
(whose backward starts from ``Constant(value=1.0, device=0)``) moved the Constant to
no device at all, so the placed program executed but could not be simulated
("Constant has no device assigned").
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

import ir
from ir.transforms import place

GOLDEN = Path(__file__).resolve().parents[1] / "ir" / "golden"


def test_every_placement_of_a_program_with_a_constant_keeps_every_op_on_a_device() -> None:
    f = ir.transforms.training(
        ir.parse((GOLDEN / "seed000_data_parallel_training.txt").read_text())
    )
    assert any(op.op_type == "Constant" for op in f.ops)
    topology = ir.Topology.uniform(4)
    inputs = ir.random_inputs(f)
    want = ir.execute(f, inputs)
    names = [v.name for op in f.ops for v in op.outputs if not isinstance(v.type, ir.TupleType)]
    for name in names:
        for device in (0, 3):
            g = place(f, {name: device})
            constants = [op for op in g.ops if op.op_type == "Constant"]
            where = {op.outputs[0].name: op.outputs[0].type.device for op in constants}
            assert where == {"dl": device if name == "dl" else 0}
            assert ir.simulate(g, topology).step_time_s > 0
            for a, b in zip(ir.execute(g, inputs), want):
                np.testing.assert_allclose(a, b, rtol=1e-6)
