"""Outputs the 3D step mishandled (issue 29's Mistral, found while sharding the zoo).

``megatron`` raised a raw ``KeyError`` for an input returned unchanged (a scalar int
input, say), and labelled a 0-d output computed in every piece (of no batch row) as
split along axis 0, on which ``ir.layout.collect`` raised numpy's ``ValueError``
("zero-dimensional arrays cannot be concatenated"). Now the step returns its pieces'
copy of such an input, a replicated output is laid out ``R``, and a layout that splits
an axis a value does not have is a ``LayoutError`` where it is made and where it is read.
"""

from __future__ import annotations

import numpy as np
import pytest

import ir
from ir.layout import LayoutError, check_levels, collect_value, with_layouts

T = ir.transforms

F64 = ir.DType.float64
CONFIGS = [(2, 1, 1, 1), (1, 2, 1, 1), (1, 1, 2, 2), (2, 2, 2, 2)]


def two_layers(extra: str) -> ir.Function:
    """An MLP that also returns an input ``n`` unchanged (``"returned"``: a scalar int,
    ``"returned_tensor"``: a vector) or ``n + n`` (``"computed"``: a 0-d output)."""
    b = ir.FunctionBuilder("mlp")
    w1 = b.input("w1", ir.TensorType((4, 6), F64, 0))
    w2 = b.input("w2", ir.TensorType((6, 3), F64, 0))
    x = b.input("x", ir.TensorType((8, 4), F64, 0))
    shape = (5,) if extra == "returned_tensor" else ()
    n = b.input("n", ir.TensorType(shape, ir.DType.int64, 0))
    h = b.call("Relu", b.call("MatMul", x, w1, name="a"), name="h")
    y = b.call("MatMul", h, w2, name="y")
    return b.finish([y, b.call("Add", n, n, name="m") if extra == "computed" else n])


def _assert_equal(g: ir.Function, f: ir.Function) -> None:
    xs = ir.random_inputs(f, 1)
    want = ir.execute(f, xs)
    got = ir.execute_step(g, xs, source=f)
    for v, a, w in zip(f.outputs, got, want, strict=True):
        np.testing.assert_allclose(a, w, rtol=1e-12, err_msg=v.name)


@pytest.mark.parametrize("extra", ["returned", "returned_tensor", "computed"])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "dp{}_tp{}_pp{}_m{}".format(*c))
@pytest.mark.parametrize("training", [False, True], ids=["forward", "step"])
def test_megatron_returns_an_input_and_a_scalar_of_no_row(extra, config, training) -> None:
    f = two_layers(extra)
    if training:
        f = T.training(ir.models.with_loss(f, kind="mse"), params=["w1", "w2"])
    g = T.megatron(f, *config)
    _assert_equal(g, f)
    i = next(i for i, v in enumerate(f.outputs) if v.name in ("n", "m"))
    assert g.output_layouts[i][:2] == ("R", f"R@{config[0]}")  # every piece's copy


def test_a_layout_that_splits_an_axis_a_scalar_does_not_have_is_refused() -> None:
    t = ir.TupleType((ir.TensorType((), F64, 0), ir.TensorType((), F64, 1)))
    with pytest.raises(LayoutError, match=r"splits axis 0, but its pieces .* have rank 0"):
        check_levels(("S(0)@2",), t, "output 'm'")
    with pytest.raises(LayoutError, match="output 'm': the layout splits axis 0, but its pieces"):
        collect_value((np.float64(1.0), np.float64(2.0)), t, ("S(0)@2",), "output 'm'")
    b = ir.FunctionBuilder("pair")
    x = b.input("x", t)
    g = b.finish(x)
    with pytest.raises(LayoutError, match="splits axis 0"):
        with_layouts(g, {"x": ("R@2",)}, [("S(0)@2",)])
    assert collect_value((np.float64(1.0), np.float64(1.0)), t, ("R@2",)) == 1.0
