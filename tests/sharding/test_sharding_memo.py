"""The speed-ups of the click -> propagate loop change no answer: memoised strategy choices,
op signature keys, cached mesh groups."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import ir
import ir.models
from ir import FunctionBuilder, TensorType
from ir.sharding import Mesh, MeshError, R, S, propagate
from ir.verify import attributes_key

# the module, not the function of the same name that ir.sharding exports
propagate_impl = importlib.import_module("ir.sharding.propagate")


def small_gpt(training: bool) -> ir.Function:
    return ir.models.gpt(batch=4, seq=8, hidden=16, heads=2, vocab=32, layers=3, training=training)


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("shape", [(2,), (2, 2)])
def test_memoised_choices_give_the_program_an_unmemoised_run_gives(monkeypatch, training, shape):
    f = small_gpt(training)
    annotations = {"tokens": (Mesh(shape), [S(0)] + [R] * (len(shape) - 1))}
    g, report = propagate(f, annotations)
    # Every layer after the first reuses the first layer's choices.
    calls = []
    real_choose = propagate_impl._Materialiser._choose

    def counting(self, op):
        calls.append(op)
        return real_choose(self, op)

    monkeypatch.setattr(propagate_impl._Materialiser, "_choose", counting)
    propagate(f, annotations)
    assert 0 < len(calls) < len(f.ops) / 2
    monkeypatch.setattr(propagate_impl._Materialiser, "_choice_key", lambda self, op: None)
    h, plain = propagate(f, annotations)
    assert str(g) == str(h)
    assert report.strategies == plain.strategies
    assert [str(c) for c in report.collectives] == [str(c) for c in plain.collectives]
    inputs = ir.random_inputs(f, 0)
    for want, got in zip(ir.execute(f, inputs), ir.execute_step(g, inputs, rtol=1e-5), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_signature_keys_tell_attribute_types_apart():
    assert attributes_key({"a": 1}) != attributes_key({"a": 1.0})
    assert attributes_key({"a": 1}) != attributes_key({"a": True})
    assert attributes_key({"a": [1, 2]}) != attributes_key({"a": (1, 2)})
    assert attributes_key({"a": {"b": [1]}}) == attributes_key({"a": {"b": [1]}})
    with pytest.raises(TypeError):
        hash(attributes_key({"a": np.zeros(2)}))


def test_mesh_groups_and_coordinates():
    mesh = Mesh((2, 3), (5, 4, 3, 2, 1, 0))
    assert mesh.groups(0) == [(5, 2), (4, 1), (3, 0)]
    assert mesh.groups(1) == [(5, 4, 3), (2, 1, 0)]
    mesh.groups(1).append(("changed",))  # a copy: the cache stays as it was
    assert mesh.groups(1) == [(5, 4, 3), (2, 1, 0)]
    assert mesh.device_at((1, 2)) == 0
    with pytest.raises(MeshError, match="outside"):
        mesh.device_at((2, 0))
    assert Mesh((2, 3), (5, 4, 3, 2, 1, 0)) == mesh


def square_chain() -> ir.Function:
    """Four MatMuls of one signature whose weights are annotated differently."""
    b = FunctionBuilder("chain")
    x = b.input("x", TensorType((8, 8), device=0))
    ws = [b.input(f"w{i}", TensorType((8, 8), device=0)) for i in range(4)]
    h = x
    for i, w in enumerate(ws):
        h = b.call("Relu", b.call("MatMul", h, w, name=f"m{i}"), name=f"h{i}")
    return b.finish([h])


def test_same_signature_with_other_operand_layouts_is_chosen_afresh(monkeypatch):
    f = square_chain()
    mesh = Mesh((2,))
    annotations = {"w0": (mesh, [S(1)]), "w1": (mesh, [S(0)]), "w2": (mesh, [R]), "x": (mesh, [R])}
    g, report = propagate(f, annotations)
    monkeypatch.setattr(propagate_impl._Materialiser, "_choice_key", lambda self, op: None)
    h, plain = propagate(f, annotations)
    assert str(g) == str(h)
    assert report.strategies == plain.strategies
    assert len({how for _, how in report.strategies}) > 1  # the MatMuls differ
    inputs = ir.random_inputs(f, 0)
    for want, got in zip(ir.execute(f, inputs), ir.execute_step(g, inputs, rtol=1e-5), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
