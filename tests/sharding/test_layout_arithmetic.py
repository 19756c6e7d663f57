"""Propagation's arithmetic layout facts equal the per-device enumeration they replace.

``block_shapes`` (every device's block shape by ``split_sizes`` arithmetic),
``shape_fits`` (``Layout.check`` without the message) and the redistribution sizes
built on them depend on the mesh's shape only, so they are memoised across meshes.
Each must answer what ``Layout.local_shape`` / ``Layout.check`` / ``local_types``
answer, uneven and non-dividing splits, nested shards and negative axes included.
"""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ir
from ir.sharding import Layout, Mesh, P, R, S
from ir.sharding.errors import AnnotationError, PropagationError
from ir.sharding.mesh import block_shapes, shape_fits
from ir.sharding.redistribute import _largest_block_bytes, local_types, plan, step_bytes


@st.composite
def cases(draw):
    """A mesh (devices in any order), a shape (any sizes, also smaller than the shards)
    and placements (negative, repeated and out-of-range shard axes too)."""
    mesh_shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=3)))
    devices = draw(st.permutations(range(math.prod(mesh_shape))))
    rank = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(0, 13), min_size=rank, max_size=rank)))
    axes = st.integers(-rank - 1, rank)
    placement = st.one_of(st.just(R), st.builds(P, st.sampled_from(["sum", "max"])), axes.map(S))
    placements = tuple(draw(placement) for _ in mesh_shape)
    return Mesh(mesh_shape, devices), shape, placements


@settings(max_examples=400, deadline=None)
@given(cases())
def test_block_shapes_are_the_local_shapes_device_by_device(case):
    mesh, shape, placements = case
    layout = Layout(mesh, placements)
    want = tuple(layout.local_shape(shape, d) for d in mesh.devices)
    assert block_shapes(shape, mesh.shape, placements) == want
    assert layout.local_shapes(shape) == want


@settings(max_examples=400, deadline=None)
@given(cases())
def test_shape_fits_exactly_when_check_accepts(case):
    mesh, shape, placements = case
    layout = Layout(mesh, placements)
    try:
        layout.check(shape)
        accepted = True
    except AnnotationError:
        accepted = False
    assert shape_fits(shape, mesh.shape, placements) is accepted
    assert layout.fits(shape) is accepted


def test_shape_fits_refuses_empty_shards_and_scalars_like_check():
    mesh = Mesh((2, 3))
    assert shape_fits((6, 2), mesh.shape, (S(0), S(0)))  # 6 -> 3 -> 1 each
    assert not shape_fits((5, 2), mesh.shape, (S(0), S(0)))  # 5 -> 2 -> 3 shards of 2: empty
    assert not shape_fits((), mesh.shape, (S(0), R))
    with pytest.raises(AnnotationError, match="out of range"):
        Layout(mesh, (S(0), R)).check(())


@settings(max_examples=300, deadline=None)
@given(cases(), st.booleans())
def test_largest_block_bytes_are_the_largest_local_type(case, as_tuple):
    mesh, shape, placements = case
    layout = Layout(mesh, placements)
    t: ir.Type = ir.TensorType(shape, ir.DType.int64, device=0)
    if as_tuple:  # a tuple's block is the sum of its elements' blocks on one device
        t = ir.TupleType((t, ir.TensorType(shape, device=1)))
    types = local_types(t, layout)
    for x, s, d in zip(types, layout.local_shapes(shape), mesh.devices):
        parts = x.elements if as_tuple else (x,)
        assert all(e.shape == s and e.device == d for e in parts)
    want = max(x.size_bytes for x in types)
    assert _largest_block_bytes(t, mesh.shape, placements) == want


def test_step_bytes_are_the_gathered_or_the_current_largest_block():
    mesh = Mesh((2, 3))
    t = ir.TensorType((5, 7), device=0)
    layout = Layout(mesh, [S(0), S(1)])
    steps = plan(t.shape, layout, Layout(mesh, [R, R]))
    assert [(s.kind, s.axis) for s in steps] == [("allgather", 1), ("allgather", 0)]
    # gathering axis 1 leaves blocks of (3, 7) on the first row: 21 floats
    assert step_bytes(t, layout, steps[0]) == 3 * 7 * 4
    reduce = plan(t.shape, Layout(mesh, [P(), R]), Layout(mesh, [R, R]))[0]
    assert step_bytes(t, Layout(mesh, [P(), R]), reduce) == 5 * 7 * 4


def test_plans_depend_on_the_mesh_shape_not_its_devices():
    t = ir.TensorType((6, 8), device=0)
    ordered, shuffled = Mesh((2, 4)), Mesh((2, 4), (5, 1, 7, 3, 0, 2, 6, 4))
    texts = [R, P("sum"), S(0), S(1)]
    for a, b in itertools.product(itertools.product(texts, repeat=2), repeat=2):
        answers = []
        for mesh in (ordered, shuffled):
            src, dst = Layout(mesh, a), Layout(mesh, b)
            try:
                steps = plan(t.shape, src, dst)
                answers.append(steps)
            except PropagationError as e:
                answers.append(str(e))
        assert answers[0] == answers[1]


def test_plan_errors_name_the_layouts():
    mesh = Mesh((2, 2))
    with pytest.raises(
        PropagationError,
        match=r"no redistribution from \[S\(0\), S\(0\)\] on mesh \[2, 2\] to \[R, P\(sum\)\] "
        r"on mesh \[2, 2\] \(stuck at \[Replicate\(\), Replicate\(\)\]\)",
    ):
        plan((4, 4), Layout(mesh, [S(0), S(0)]), Layout(mesh, [R, P()]))
    with pytest.raises(
        PropagationError, match=r"cannot make a Partial \(P\(sum\)\) value out of R"
    ):
        plan((4, 4), Layout(mesh, [R, R]), Layout(mesh, [P(), R]))
    with pytest.raises(PropagationError, match="cannot redistribute between meshes"):
        plan((4, 4), Layout(mesh, [R, R]), Layout(Mesh((4,)), [R]))
