"""The ready transforms' ep, cp and ZeRO knobs (issue 28): offered where the model allows
them, applied through ``T.megatron`` (the step the session shows executes equal to the
sequential one), kept by session files (and files saved before them still load)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import ir
from ir import models, transforms
from ir.limits import MAX_DEVICES
from workbench import Session, Strategy
from workbench.dashboard import Workbench
from workbench.session import SessionError

F64 = ir.DType.float64
MOE = transforms.training(
    models.gpt(8, 8, 16, 4, 32, 1, dtype=F64, experts=4, top_k=2), optimizer="adam"
)
TOPOLOGY = ir.Topology.preset("a100-hgx", 4)


def _executes_as_sequential(base: ir.Function, g: ir.Function) -> None:
    xs = [
        np.abs(x) if v.name.startswith("v_") else x
        for v, x in zip(base.inputs, ir.random_inputs(base, 0))
    ]
    want = ir.execute(base, xs)
    got = ir.collect(g, ir.execute(g, ir.distribute(g, xs, source=base)), rtol=1e-9)
    for v, w, o in zip(base.outputs, want, got):
        np.testing.assert_allclose(o, w, rtol=1e-7, atol=1e-10, err_msg=v.name)


def _apply(wb: Workbench) -> None:
    next(b for b in wb.strategy_buttons if "distir-apply-strategy" in b._dom_classes).click()


def test_the_ep_and_zero_knobs_apply_megatron_and_the_step_executes_as_sequential() -> None:
    wb = Workbench(MOE, TOPOLOGY)
    assert not wb.ep.disabled and wb.ep.max == 4 and not wb.zero.disabled and not wb.cp.disabled
    wb.dp.value, wb.hp.value, wb.ep.value, wb.zero.value = 2, 2, 2, 3
    _apply(wb)
    assert wb.session.error is None
    assert wb.session.strategy == Strategy(dp=2, hp=2, ep=2, zero=3)
    assert "ep=2, ZeRO-3" in wb.summary.value
    g = wb.session.current.function
    assert any(op.op_type == "AllToAll" for op in g.ops)  # tokens sent to their experts
    want = transforms.megatron(MOE, 2, 2, 1, 1, "gpipe", ep=2, zero=3)
    assert wb.session.result.step_time_s == ir.simulate(want, TOPOLOGY).step_time_s
    _executes_as_sequential(MOE, g)


def test_the_cp_knob_splits_each_sequence() -> None:
    t = transforms.training(models.gpt(4, 8, 16, 4, 32, 1, dtype=F64), optimizer="sgd")
    wb = Workbench(t, TOPOLOGY)
    assert wb.ep.disabled and "experts=E" in wb.ep.tooltip  # a dense model: no ep
    wb.dp.value, wb.cp.value = 2, 2
    _apply(wb)
    assert wb.session.strategy == Strategy(dp=2, cp=2) and wb.session.error is None
    assert wb.session.strategy.num_devices == 4
    _executes_as_sequential(t, wb.session.current.function)


def test_knobs_a_program_does_not_allow_are_off_with_the_reason() -> None:
    wb = Workbench(models.mlp(16, 8, 8, 4, layers=2), TOPOLOGY)  # forward, no attention
    for name, words in (("ep", "experts"), ("cp", "attention"), ("zero", "optimizer")):
        knob = getattr(wb, name)
        assert knob.disabled and words in knob.tooltip, name
    # a disabled knob's value is not applied
    wb.dp.value, wb.ep.value, wb.zero.value = 2, 1, 2
    _apply(wb)
    assert wb.session.strategy == Strategy(dp=2)


def test_bad_degrees_are_refused_naming_the_rule() -> None:
    with pytest.raises(SessionError, match="ep=3 must divide dp=4"):
        Strategy(dp=4, ep=3)
    with pytest.raises(SessionError, match="zero must be 0, 1, 2 or 3"):
        Strategy(dp=2, zero=4)
    with pytest.raises(SessionError, match="dp x cp x hp x pp"):
        Strategy(dp=MAX_DEVICES, cp=2)
    assert Strategy.parse("dp=4, ep=2, cp=2, zero=3") == Strategy(dp=4, ep=2, cp=2, zero=3)
    s = Session(MOE, TOPOLOGY)
    assert not s.set_strategy(dp=4, cp=2)
    assert "dp x cp x hp x pp = 8 devices" in s.error


def test_a_searched_row_with_ep_and_zero_is_applied_as_simulated() -> None:
    wb = Workbench(MOE, TOPOLOGY)
    result = wb.search(dp=(4,), tp=(1,), pp=(1,), ep=(2,), zero=(3,))
    row = next(r for r in result.rows if r.ok)
    assert (row.strategy.ep, row.strategy.zero) == (2, 3)
    assert wb.apply_search_row(row)
    assert (wb.dp.value, wb.ep.value, wb.zero.value) == (4, 2, 3)
    assert wb.session.result.step_time_s == row.step_time_s


def test_a_session_file_keeps_ep_cp_and_zero_and_an_older_file_still_loads(tmp_path) -> None:
    wb = Workbench(MOE, TOPOLOGY)
    assert wb.set_strategy(dp=2, ep=2, zero=1)
    assert wb.set_strategy(dp=2, cp=2, zero=3)
    path = wb.save(tmp_path / "s.json")
    loaded = Session.load(path)
    assert loaded.strategy == Strategy(dp=2, cp=2, zero=3)
    assert loaded.undo() and loaded.strategy == Strategy(dp=2, ep=2, zero=1)
    # the Load button puts the knobs where the file's strategy is
    wb.set_strategy(Strategy())
    wb.file_path.value = str(path)
    wb.load_button.click()
    assert (wb.dp.value, wb.cp.value, wb.ep.value, wb.zero.value) == (2, 2, 1, 3)
    # a file written before these knobs existed: no ep, cp or zero keys
    doc = json.loads(path.read_text())
    for state in (doc, *doc["history"]["undo"], *doc["history"]["redo"]):
        for key in ("ep", "cp", "zero"):
            state["strategy"].pop(key)
    old = tmp_path / "old.json"
    old.write_text(json.dumps(doc))
    s = Session.load(old)
    assert s.strategy == Strategy(dp=2) and s.undo() and s.strategy == Strategy(dp=2)
