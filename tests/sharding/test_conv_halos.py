"""Spatial sharding of conv nets: Conv2D and pooling split along the height or the width,
at stride 1 or more, with halo exchanges (point-to-point rows or columns between
neighbours, no collective), proven by executing the propagated program and its
per-rank lowering against the sequential one."""

from __future__ import annotations

import numpy as np
import pytest

import ir
from ir import FunctionBuilder, TensorType
from ir.sharding import Mesh, S, check_deadlock, lower_to_ranks, propagate, run_ranked

F64 = ir.DType.float64


def _conv(height: int, width: int, padding, stride, kernel: int = 3) -> ir.Function:
    b = FunctionBuilder("conv")
    x = b.input("x", TensorType((2, height, width, 3), F64, 0))
    w = b.input("w", TensorType((kernel, kernel, 3, 4), F64, 0))
    return b.finish([b.call("Conv2D", x, w, padding=padding, stride=stride, name="y")])


def _conv_pool(height: int, width: int, pool: str, **pool_attrs) -> ir.Function:
    b = FunctionBuilder("conv_pool")
    x = b.input("x", TensorType((2, height, width, 3), F64, 0))
    w = b.input("w", TensorType((3, 3, 3, 4), F64, 0))
    h = b.call("Conv2D", x, w, padding=(1, 1, 1, 1), stride=2, name="c")
    h = b.call("Relu", h, name="h")
    return b.finish([b.call(pool, h, name="y", **pool_attrs)])


def _split_equals_sequential(f: ir.Function, axis: int, devices: int):
    """Propagate ``x`` split along ``axis``; the program and its ranks compute ``f``."""
    g, report = propagate(f, {"x": (Mesh((devices,)), [S(axis)])})
    xs = ir.random_inputs(f, 2)
    (want,) = ir.execute(f, xs)
    np.testing.assert_allclose(ir.execute_step(g, xs)[0], want, rtol=1e-12)
    ranked = lower_to_ranks(g)
    check_deadlock(ranked)
    (got,) = ir.collect(g, run_ranked(ranked, ir.distribute(g, xs, source=f)))
    np.testing.assert_allclose(got, want, rtol=1e-12)
    return report


@pytest.mark.parametrize(
    ("height", "width", "padding", "stride", "axis", "devices"),
    [
        (5, 9, "valid", 1, 2, 2),  # width, stride 1
        (11, 7, "same", 1, 2, 4),  # width, uneven columns
        (9, 5, (1, 1, 1, 1), 2, 1, 2),  # height, stride 2
        (12, 11, (1, 1, 1, 1), (2, 3), 2, 3),  # width, stride 3 (height 2)
        (13, 8, "valid", 2, 1, 3),  # height, stride 2, uneven rows
    ],
)
def test_conv_splits_along_height_or_width_at_any_stride_with_a_halo(
    height, width, padding, stride, axis, devices
):
    report = _split_equals_sequential(_conv(height, width, padding, stride), axis, devices)
    assert report.strategies[0][1] == f"axis 0: halo exchange along tensor axis {axis}"
    assert report.collectives == []  # only the halo's rows or columns move, point to point


@pytest.mark.parametrize(
    ("pool", "attrs", "axis", "devices"),
    [
        ("MaxPool2D", {"kernel": 2}, 1, 2),
        ("AvgPool2D", {"kernel": 3, "stride": 2, "padding": (1, 1, 1, 1)}, 2, 3),
        ("MaxPool2D", {"kernel": 3, "stride": 1, "padding": (1, 1, 1, 1)}, 1, 4),
    ],
)
def test_a_strided_conv_then_pooling_stays_split_with_halos(pool, attrs, axis, devices):
    report = _split_equals_sequential(_conv_pool(13, 12, pool, **attrs), axis, devices)
    halo = f"axis 0: halo exchange along tensor axis {axis}"
    assert [how for _, how in report.strategies] == [halo, f"axis 0: split f{axis}", halo]
    assert report.collectives == []


def test_pooling_pads_max_with_minus_infinity_and_counts_zeros_in_the_average():
    b = FunctionBuilder("pool")
    x = b.input("x", TensorType((1, 2, 2, 1), F64, 0))
    pads = (1, 0, 1, 0)
    f = b.finish(
        [
            b.call("MaxPool2D", x, kernel=2, stride=1, padding=pads, name="m"),
            b.call("AvgPool2D", x, kernel=2, stride=1, padding=pads, name="a"),
        ]
    )
    xs = [-np.arange(1.0, 5.0).reshape(1, 2, 2, 1)]  # all negative: -1 -2 / -3 -4
    biggest, mean = ir.execute(f, xs)
    np.testing.assert_array_equal(biggest[0, :, :, 0], [[-1, -1], [-1, -1]])
    np.testing.assert_array_equal(mean[0, :, :, 0], [[-0.25, -0.75], [-1.0, -2.5]])
