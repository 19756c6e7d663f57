"""Propagation types a repeated redistribution or local op once: a layer's later copies
are added like the first (``FunctionBuilder.add_like``), and the program is the one the
type rules give when asked every time."""

from __future__ import annotations

import importlib

import numpy as np

import ir
import ir.models
from ir import FunctionBuilder
from ir.sharding import Mesh, R, S, propagate

builder_module = importlib.import_module("ir.builder")
COLLECTIVES = {"AllReduce", "AllGather", "ReduceScatter", "AllToAll", "KeepShard"}


def annotated_gpt(layers: int) -> tuple[ir.Function, dict]:
    """A GPT training step, its heads and MLP split over the second axis of a 2x2 mesh."""
    f = ir.models.gpt(batch=4, seq=8, hidden=16, heads=2, vocab=32, layers=layers, training=True)
    mesh = Mesh((2, 2))
    annotations = {"tokens": (mesh, [S(0), R])}
    for v in f.inputs:
        for suffix, dim in (("wq", 1), ("wk", 1), ("wv", 1), ("wo", 0), ("w1", 1), ("w2", 0)):
            if v.name.endswith(suffix):
                annotations[v.name] = (mesh, [R, S(dim)])
    return f, annotations


def test_copied_repeats_build_the_program_the_type_rules_give(monkeypatch):
    f, annotations = annotated_gpt(3)
    g, report = propagate(f, annotations)
    monkeypatch.setattr(FunctionBuilder, "add_like", FunctionBuilder.add_op_like)
    h, plain = propagate(f, annotations)
    assert str(g) == str(h)
    assert [str(c) for c in report.collectives] == [str(c) for c in plain.collectives]
    ir.verify(g)
    inputs = ir.random_inputs(f, 0)
    for want, got in zip(ir.execute(f, inputs), ir.execute_step(g, inputs, rtol=1e-5), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_more_layers_ask_the_type_rules_no_more_about_collectives_and_pmaps(monkeypatch):
    asked: list[str] = []
    real = builder_module.infer_types

    def counting(opdef, *args):
        asked.append(opdef.name)
        return real(opdef, *args)

    monkeypatch.setattr(builder_module, "infer_types", counting)
    counts = {}
    for layers in (2, 4):
        asked.clear()
        g, _ = propagate(*annotated_gpt(layers))
        built = [op.op_type for op in g.ops]
        counts[layers] = {
            kind: (asked.count(kind), built.count(kind)) for kind in (*COLLECTIVES, "Pmap")
        }
    for kind, (asked_2, built_2) in counts[2].items():
        asked_4, built_4 = counts[4][kind]
        assert asked_4 == asked_2, kind  # layers 3 and 4 copy layers 1 and 2
        assert built_4 >= built_2
    assert counts[4]["Pmap"][1] > counts[4]["Pmap"][0]  # copies, not questions
    assert sum(built for _, built in counts[4].values()) > sum(a for a, _ in counts[4].values())
