"""ONNX ShardingSpec (seed 001), mesh layouts, conversion, and the errors of bad annotations."""

from __future__ import annotations

import numpy as np
import pytest

from ir.sharding import (
    AnnotationError,
    Layout,
    Mesh,
    MeshError,
    P,
    R,
    S,
    ShardingSpec,
    placement,
)

X = np.array([[1, 2], [3, 4]])


def _lists(parts):
    return [p.tolist() for p in parts]


# -- the seed's worked examples, exactly ------------------------------------------------


def test_seed_split_on_axis_0():
    spec = ShardingSpec(devices=[0, 1], sharded_dims=[(0, 2)])
    assert _lists(spec.split(X)) == [[[1, 2]], [[3, 4]]]


def test_seed_split_on_axis_1():
    spec = ShardingSpec(devices=[0, 1], sharded_dims=[(1, 2)])
    assert _lists(spec.split(X)) == [[[1], [3]], [[2], [4]]]


def test_seed_split_on_both_axes_over_four_devices():
    spec = ShardingSpec(devices=[0, 1, 2, 3], sharded_dims=[(0, 2), (1, 2)])
    assert _lists(spec.split(X)) == [[[1]], [[2]], [[3]], [[4]]]


def test_seed_replication_through_a_device_map():
    spec = ShardingSpec(devices=[-1], sharded_dims=[], device_map={-1: [0, 1]})
    assert _lists(spec.split(X)) == [[[1, 2], [3, 4]], [[1, 2], [3, 4]]]
    assert spec.physical_devices == (0, 1)


def test_seed_mixed_split_and_broadcast():
    spec = ShardingSpec(
        devices=[-1, -2], sharded_dims=[(0, 2)], device_map={-1: [0, 1], -2: [2, 3]}
    )
    # The seed prints [[2,3]] for devices 2 and 3: a typo. Axis 0's second half of
    # [[1, 2], [3, 4]] is [[3, 4]], which is what the split loop the seed gives produces.
    assert _lists(spec.split(X)) == [[[1, 2]], [[1, 2]], [[3, 4]], [[3, 4]]]


@pytest.mark.parametrize(
    "spec",
    [
        ShardingSpec([0, 1], [(0, 2)]),
        ShardingSpec([0, 1], [(1, 2)]),
        ShardingSpec([0, 1, 2, 3], [(0, 2), (1, 2)]),
        ShardingSpec([3, 2, 1, 0], [(1, 2), (0, 2)]),
        ShardingSpec([-1], [], {-1: [0, 1]}),
        ShardingSpec([-1, -2], [(0, 2)], {-1: [0, 1], -2: [2, 3]}),
    ],
)
def test_merge_undoes_split(spec):
    x = np.arange(20.0).reshape(4, 5)
    np.testing.assert_array_equal(spec.merge(spec.split(x)), x)


def test_uneven_split_gives_the_first_shards_one_more():
    spec = ShardingSpec([0, 1, 2], [(0, 3)])
    parts = spec.split(np.arange(7))
    assert [len(p) for p in parts] == [3, 2, 2]
    np.testing.assert_array_equal(spec.merge(parts), np.arange(7))


# -- mesh layouts ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "placements",
    [
        [S(0), S(1)],
        [S(1), S(0)],
        [S(0), S(0)],
        [R, S(1)],
        [P("sum"), S(0)],
        [S(1), P("max")],
        [P("mean"), R],
    ],
)
def test_layout_merge_undoes_split_on_a_2x3_mesh_with_uneven_blocks(placements):
    layout = Layout(Mesh((2, 3), (4, 5, 6, 7, 8, 9)), placements)
    x = np.random.default_rng(0).standard_normal((7, 8))
    parts = layout.split(x)
    assert len(parts) == 6
    np.testing.assert_allclose(layout.merge(parts), x)
    for d, part in zip(layout.mesh.devices, parts):
        assert part.shape == layout.local_shape(x.shape, d)


def test_nested_shards_split_the_outer_mesh_axis_first():
    layout = Layout(Mesh((2, 2)), [S(0), S(0)])
    assert [p.tolist() for p in layout.split(np.arange(8))] == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_partial_sum_split_reduces_back():
    layout = Layout(Mesh((2,)), [P("sum")])
    parts = layout.split(np.ones(3))
    assert sum(p.sum() for p in parts) == 3


def test_placement_text_round_trips():
    for p in (S(2), R, P("sum"), P("min")):
        assert placement(str(p)) == p
    with pytest.raises(AnnotationError, match="is not one of"):
        placement("Q(1)")


def test_mesh_groups_follow_rows_and_columns():
    mesh = Mesh((2, 4), list(range(10, 18)))
    assert mesh.groups(0) == [(10, 14), (11, 15), (12, 16), (13, 17)]
    assert mesh.groups(1) == [(10, 11, 12, 13), (14, 15, 16, 17)]


# -- conversion between the notations --------------------------------------------------------


def test_onnx_mixed_spec_is_a_2x2_mesh_sharded_then_replicated():
    spec = ShardingSpec([-1, -2], [(0, 2)], {-1: [0, 1], -2: [2, 3]})
    layout = spec.to_layout()
    assert layout.mesh == Mesh((2, 2), (0, 1, 2, 3))
    assert layout.placements == (S(0), R)
    x = np.arange(12.0).reshape(4, 3)
    np.testing.assert_array_equal(np.stack(layout.split(x)), np.stack(spec.split(x)))


@pytest.mark.parametrize(
    ("mesh", "placements"),
    [
        (Mesh((2, 2)), [S(0), S(1)]),
        (Mesh((2, 2)), [R, S(1)]),
        (Mesh((2, 3)), [S(1), R]),
        (Mesh((4,)), [R]),
    ],
)
def test_layout_to_onnx_and_back_splits_alike(mesh, placements):
    layout = Layout(mesh, placements)
    spec = ShardingSpec.from_layout(layout)
    x = np.arange(30.0).reshape(5, 6)
    by_device_layout = dict(zip(mesh.devices, layout.split(x)))
    by_device_spec = dict(zip(spec.physical_devices, spec.split(x)))
    assert by_device_layout.keys() == by_device_spec.keys()
    for d in mesh.devices:
        np.testing.assert_array_equal(by_device_layout[d], by_device_spec[d])


def test_partial_and_twice_sharded_layouts_have_no_onnx_spec():
    with pytest.raises(AnnotationError, match="Partial"):
        ShardingSpec.from_layout(Layout(Mesh((2,)), [P("sum")]))
    with pytest.raises(AnnotationError, match="twice"):
        ShardingSpec.from_layout(Layout(Mesh((2, 2)), [S(0), S(0)]))


# -- impossible annotations -------------------------------------------------------------------


def test_axis_out_of_range_names_the_value_and_the_rule():
    with pytest.raises(AnnotationError, match=r"'w1'.*tensor axis 2 is out of range"):
        Layout(Mesh((2,)), [S(2)]).check((4, 4), "w1")
    with pytest.raises(AnnotationError, match=r"'x'.*axis 3 is out of range"):
        ShardingSpec([0, 1], [(3, 2)]).check((4, 4), "x")


def test_more_shards_than_elements_names_the_value_and_the_rule():
    with pytest.raises(AnnotationError, match=r"'b'.*more shards than elements"):
        Layout(Mesh((4,)), [S(0)]).check((3,), "b")
    with pytest.raises(AnnotationError, match=r"'b'.*more shards than elements"):
        ShardingSpec([0, 1, 2], [(0, 3)]).check((2,), "b")


def test_mesh_device_list_must_fit_the_shape():
    with pytest.raises(MeshError, match="holds 4 devices, but 3 are listed"):
        Mesh((2, 2), (0, 1, 2))
    with pytest.raises(MeshError, match="device 7 is not in the mesh"):
        Mesh((2,)).coord_of(7)


def test_spec_needs_one_device_per_shard():
    with pytest.raises(AnnotationError, match=r"one device \(or group\) per shard"):
        ShardingSpec([0, 1, 2], [(0, 2)])
