"""Inputs of the wrong size, nesting or kind to the executor and the layouts are project
errors naming the input, found before anything is copied.

Found by fuzzing the executor (``benchmarks/fuzz.py``, target *inputs*): a broadcast
view of 10^13 elements (which costs nothing) was copied by ``ir.distribute`` while being
split (MemoryError), a list of two of them by ``ir.execute`` while being converted;
``ir.collect`` took ints, strings and wrong nestings into numpy (TypeError, ValueError,
UFuncTypeError); ``distribute`` / ``collect`` took anything for the step.
"""

from __future__ import annotations

import numpy as np
import pytest

import ir
from ir import LayoutError
from ir.sharding import Mesh, propagate

HUGE = np.broadcast_to(np.float32(0), (10**6, 10**7))  # 40 TB if ever copied


@pytest.fixture(scope="module")
def programs() -> tuple[ir.Function, list, dict]:
    f = ir.models.mlp(8, 16, 32, 4)
    steps = {
        "dp": ir.transforms.data_parallel(f, 2),
        "hp": ir.transforms.horizontal_parallel(f, 2),
        "propagated": propagate(f, {"x": (Mesh((2, 2)), ["S(0)", "R"])})[0],
    }
    return f, ir.random_inputs(f), steps


@pytest.mark.parametrize("huge", [HUGE, HUGE.T, [HUGE, HUGE], (HUGE,), [[HUGE]]])
@pytest.mark.parametrize("position", [0, 2])
def test_a_huge_input_is_refused_by_shape_without_a_copy(programs, huge, position) -> None:
    f, inputs, steps = programs
    wrong = [*inputs[:position], huge, *inputs[position + 1 :]]
    name = f.inputs[position].name
    with pytest.raises(ir.ExecutionError, match=f"input '{name}' has shape"):
        ir.execute(f, wrong)
    for step in steps.values():
        with pytest.raises(ir.DistIRError, match=f"{name}.*shape"):
            ir.execute_step(step, wrong, f)


def test_distribute_checks_the_whole_shape_before_splitting(programs) -> None:
    f, inputs, steps = programs
    for step in steps.values():
        for bad in (inputs[0].T, inputs[0][:3], inputs[0][None], inputs[0].reshape(-1)):
            with pytest.raises(LayoutError, match=r"input 'wA': a value of shape .* \(16, 32\)"):
                ir.distribute(step, [bad, *inputs[1:]], f)


@pytest.mark.parametrize(
    "value", [None, "ab", b"ab", {"a": 1}, ("dp", 2), [[1, 2], [3]], np.ones((3, 5))]
)
def test_collect_refuses_outputs_that_are_not_pieces(programs, value) -> None:
    f, inputs, steps = programs
    for step in steps.values():
        outs = list(ir.execute(step, ir.distribute(step, inputs, f)))
        for i in range(len(outs)):
            wrong = [*outs[:i], value, *outs[i + 1 :]]
            with pytest.raises(LayoutError, match=step.outputs[i].name):
                ir.collect(step, wrong)
        with pytest.raises(LayoutError, match="outputs"):
            ir.collect(step, outs[:-1])
        with pytest.raises(LayoutError, match="outputs must be"):
            ir.collect(step, value if not isinstance(value, (list, tuple)) else None)


@pytest.mark.parametrize("value", [None, 3, "mlp", [], np.array([1, 2])])
def test_the_step_and_source_must_be_functions(programs, value) -> None:
    f, inputs, steps = programs
    step = steps["dp"]
    with pytest.raises(LayoutError, match=r"step must be an ir\.Function"):
        ir.distribute(value, inputs, f)
    with pytest.raises(LayoutError, match=r"step must be an ir\.Function"):
        ir.collect(value, [])
    if value is not None:
        with pytest.raises(LayoutError, match=r"source must be an ir\.Function"):
            ir.execute_step(step, inputs, value)
    for rtol in (-1.0, "x", None, float("nan"), [1e-9]):
        with pytest.raises(ir.DistIRError, match="rtol"):
            ir.execute_step(step, inputs, f, rtol=rtol)
