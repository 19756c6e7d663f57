"""Values that gave silently wrong results are refused, naming the op and the value
(issue 17, class 4).

Before: a Loss label of -1 was read as the last class, an Embedding id of -3 wrapped
around, float labels were truncated, complex inputs lost their imaginary part, None
became NaN, floats in a ShardingSpec were truncated, a NaN link latency gave a step faster
than zero latency; ``random_inputs`` drew labels from [0, 4) whatever the class count and
gave Adam's second moment negative values.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import ir
from ir.sharding.errors import AnnotationError
from ir.sharding.spec import ShardingSpec
from ir.transforms import data_parallel
from ir.transforms.autodiff import training
from ir.types import DType, TensorType


def _loss_program(rows: int, classes: int, op: str) -> ir.Function:
    b = ir.FunctionBuilder("f")
    y = b.input("y", TensorType((rows, classes), device=0))
    z = b.input("z", TensorType((rows,), DType.int64, device=0))
    return b.finish([b.call(op, y, z)])


@settings(max_examples=150, deadline=None)
@given(
    st.integers(1, 6),
    st.sampled_from(["Loss", "LossGrad"]),
    st.data(),
)
def test_class_labels_outside_the_class_count_are_refused(classes: int, op: str, data):
    labels = data.draw(st.lists(st.integers(-8, 8), min_size=1, max_size=5), label="labels")
    f = _loss_program(len(labels), classes, op)
    y = np.zeros((len(labels), classes), np.float32)
    if all(0 <= z < classes for z in labels):
        ir.execute(f, [y, np.array(labels)])
        return
    bad = next(z for z in labels if not 0 <= z < classes)
    with pytest.raises(ir.ExecutionError, match=rf"^{op}: class labels z must be in \[0, "):
        ir.execute(f, [y, np.array(labels)])
    with pytest.raises(ir.ExecutionError, match=rf"got {bad} at index"):
        ir.execute(f, [y, np.array(labels)])


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.one_of(st.floats(-3, 5), st.sampled_from([float("nan"), float("inf"), -float("inf")])),
        min_size=1,
        max_size=4,
    )
)
def test_float_labels_are_taken_only_when_whole(labels):
    b = ir.FunctionBuilder("f")
    y = b.input("y", TensorType((len(labels), 5), device=0))
    z = b.input("z", TensorType((len(labels),), device=0))  # float-typed labels
    f = b.finish([b.call("Loss", y, z)])
    args = [np.zeros((len(labels), 5), np.float32), np.array(labels, np.float32)]
    if all(float(z).is_integer() and 0 <= z < 5 for z in np.float32(labels)):
        ir.execute(f, args)
    else:
        with pytest.raises(ir.ExecutionError, match=r"^Loss: class labels z must be"):
            ir.execute(f, args)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 6), st.lists(st.integers(-8, 8), min_size=1, max_size=5))
def test_embedding_ids_outside_the_table_are_refused(rows: int, ids):
    b = ir.FunctionBuilder("f")
    table = b.input("table", TensorType((rows, 2), device=0))
    i = b.input("i", TensorType((len(ids),), DType.int64, device=0))
    dy = b.input("dy", TensorType((len(ids), 2), device=0))
    f = b.finish(
        [b.call("Embedding", table, i), b.call("EmbeddingGrad", i, dy, num_embeddings=rows)]
    )
    args = [np.ones((rows, 2), np.float32), np.array(ids), np.ones((len(ids), 2), np.float32)]
    if all(0 <= k < rows for k in ids):
        (e, grad) = ir.execute(f, args)
        assert e.shape == (len(ids), 2) and grad.sum() == 2 * len(ids)
    else:
        with pytest.raises(ir.ExecutionError, match=r"^Embedding: ids must be in \[0, "):
            ir.execute(f, args)


def _identity(dtype: DType, n: int) -> ir.Function:
    b = ir.FunctionBuilder("f")
    x = b.input("x", TensorType((n,), dtype, device=0))
    return b.finish([b.call("Identity", x)])


ODD_ARRAYS = st.one_of(
    hnp.arrays(np.complex128, 3, elements=st.complex_numbers(max_magnitude=5)),
    hnp.arrays(np.float64, 3, elements=st.floats(allow_nan=True, allow_infinity=True)),
    hnp.arrays(np.int64, 3),
    hnp.arrays(np.bool_, 3),
    st.lists(st.one_of(st.none(), st.floats(-2, 2), st.text(max_size=2)), min_size=3, max_size=3),
)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(list(DType)), ODD_ARRAYS)
def test_inputs_that_conversion_would_change_are_refused(dtype: DType, x):
    f = _identity(dtype, 3)
    arr = np.asarray(x)
    try:
        (y,) = ir.execute(f, [x])
    except ir.ExecutionError as e:
        assert "input 'x'" in str(e)
        return
    assert arr.dtype.kind in "biuf", f"{arr.dtype} was taken as {dtype.value}"
    if not dtype.is_float:  # nothing truncated, wrapped or cut off
        assert np.array_equal(y.astype(np.float64), arr.astype(np.float64))


@pytest.mark.parametrize("x", [[1 + 2j, 0, 0], [None, 1.0, 2.0], ["a", "b", "c"]])
def test_the_reported_inputs_are_refused_for_float_programs(x):
    with pytest.raises(ir.ExecutionError, match=r"^input 'x' holds"):
        ir.execute(_identity(DType.float32, 3), [x])


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.integers(0, 7),
            st.floats(allow_nan=True),
            st.booleans(),
            st.text(max_size=2),
            st.sampled_from([np.int64(3), np.float64(2.0)]),
        ),
        min_size=2,
        max_size=2,
    )
)
def test_a_sharding_spec_takes_only_integers(devices):
    whole = all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) for d in devices)
    try:
        spec = ShardingSpec(devices, [(0, 2)])
    except AnnotationError as e:
        assert not whole or len(set(devices)) < 2, e
        return
    assert whole and spec.devices == tuple(int(d) for d in devices)


@settings(max_examples=60, deadline=None)
@given(st.floats(allow_nan=True, allow_infinity=True))
def test_a_link_latency_must_be_a_finite_number_at_least_zero(latency: float):
    if 0 <= latency < float("inf"):
        topology = ir.Topology.uniform(2, link_latency_s=latency)
        assert topology.latency(0, 1) == latency
    else:
        with pytest.raises(ir.TopologyError, match="latenc"):
            ir.Topology.uniform(2, link_latency_s=latency)


@settings(max_examples=25, deadline=None)
@given(
    st.integers(1, 5),
    st.sampled_from(["sgd", "adam"]),
    st.sampled_from([1, 2]),
    st.integers(0, 2**16),
)
def test_random_inputs_fit_the_programs_that_read_them(classes, optimizer, degree, seed):
    f = training(ir.models.mlp(4, 3, 4, classes), optimizer)
    if degree > 1:
        f = data_parallel(f, degree, inputs="distribute")
    inputs = ir.random_inputs(f, seed=seed)
    for v, x in zip(f.inputs, inputs):
        if v.name == "z":
            assert np.min(x) >= 0 and np.max(x) < classes
        if v.name.startswith("v_"):  # Adam's second moments
            assert np.min(x) >= 0
    results = ir.execute(f, inputs)
    assert all(np.all(np.isfinite(r)) for r in results if isinstance(r, np.ndarray))
