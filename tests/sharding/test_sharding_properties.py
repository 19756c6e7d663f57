"""Properties of layouts over random shapes, meshes and placements (hypothesis)."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from ir.sharding import Layout, Mesh, P, R, S, ShardingSpec


@st.composite
def layouts(draw):
    rank = draw(st.integers(1, 3))
    mesh_shape = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=2)))
    placements = [
        draw(st.sampled_from([R, P("sum"), P("max"), *(S(d) for d in range(rank))]))
        for _ in mesh_shape
    ]
    # every tensor axis at least as long as the shards it is cut into
    need = [1] * rank
    for n, p in zip(mesh_shape, placements):
        if isinstance(p, S):
            need[p.dim] *= n
    shape = tuple(draw(st.integers(k, k + 4)) for k in need)
    return Layout(Mesh(mesh_shape), placements), shape


@settings(max_examples=60, deadline=None)
@given(layouts(), st.integers(0, 2**16))
def test_merge_of_split_is_the_tensor_and_blocks_tile_it(case, seed):
    layout, shape = case
    x = np.random.default_rng(seed).standard_normal(shape)
    parts = layout.split(x)
    np.testing.assert_allclose(layout.merge(parts), x)
    for d, part in zip(layout.mesh.devices, parts):
        assert part.shape == layout.local_shape(shape, d)
    # the distinct blocks cover the tensor exactly once (replicas share a block)
    blocks = {tuple(layout.local_bounds(shape, d)) for d in layout.mesh.devices}
    assert sum(math.prod(b - a for a, b in bounds) for bounds in blocks) == math.prod(shape)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 9), st.integers(1, 4), st.integers(1, 3))
def test_onnx_split_sizes_follow_the_remainder_rule(n, k, replicas):
    if k > n:
        return
    groups = {-(i + 1): list(range(i * replicas, (i + 1) * replicas)) for i in range(k)}
    spec = ShardingSpec(list(groups), [(0, k)], groups)
    sizes = [len(b) for b in spec.shards(np.arange(n))]
    assert sizes == [n // k + (1 if i < n % k else 0) for i in range(k)]
    np.testing.assert_array_equal(spec.merge(spec.split(np.arange(n))), np.arange(n))
