"""The SPMD plans of data and tensor parallelism type a repeated layer's ops once: each
later copy is added like the first (``FunctionBuilder.add_like``), and the program is the
one the type rules give when asked every time."""

from __future__ import annotations

import importlib

import ir
from ir import FunctionBuilder, models, transforms
from ir.transforms.horizontal import horizontal_plan

spmd_module = importlib.import_module("ir.transforms._spmd")


def gpt(layers: int) -> ir.Function:
    return models.gpt(batch=8, seq=8, hidden=16, heads=2, vocab=32, layers=layers, training=True)


def test_copied_layers_build_the_program_the_type_rules_give(monkeypatch):
    t = gpt(3)
    g = transforms.megatron(t, 2, 2, 2, 2)
    monkeypatch.setattr(FunctionBuilder, "add_like", FunctionBuilder.add_op_like)
    assert str(transforms.megatron(t, 2, 2, 2, 2)) == str(g)
    ir.verify(g)


def test_more_layers_localize_no_more_ops(monkeypatch):
    localized = []
    real = spmd_module.localize_op

    def counting(builder, op, *args):
        localized.append(op)
        return real(builder, op, *args)

    monkeypatch.setattr(spmd_module, "localize_op", counting)
    counts = {}
    for layers in (2, 4):
        localized.clear()
        horizontal_plan(gpt(layers), 2)
        counts[layers] = len(localized)
    assert counts[4] == counts[2]  # layers 3 and 4 are copies of layer 2
