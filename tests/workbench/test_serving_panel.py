"""The dashboard's serving mode as widgets (the browser test draws them): a choice gives
new figures and views, a choice the model or the GPUs cannot take is said in the status
line and changes nothing, a placement chosen on the decode step changes TPOT, and the
Workbench switches between its training step and serving."""

from __future__ import annotations

import pytest

import ir
from ir.inference import RequestMix, ServingStrategy
from workbench import Workbench
from workbench.serving import ServingSession
from workbench.serving_panel import PROGRAM, ServingPanel
from workbench.tasks import Activity


@pytest.fixture
def panel() -> ServingPanel:
    f = ir.models.llama(1, 1024, 512, 8, 1000, 2, kv_heads=4, ffn=1024, dtype="bfloat16")
    topology = ir.Topology.preset("a100-hgx", 4)
    session = ServingSession(f, topology, RequestMix(256, 64, 8), ServingStrategy(tp=4))
    return ServingPanel(session)


def test_the_views_show_the_session_and_follow_a_choice(panel: ServingPanel) -> None:
    assert "tp4 on a100-hgx-4" in panel.summary.value
    assert "decode step" in panel.gantt.figure["layout"]["title"]["text"]
    assert "on 4 devices" in panel.gantt.figure["layout"]["title"]["text"]
    assert panel.memory.figure["layout"]["title"]["text"].startswith("KV cache on GPU")
    tpot = panel.session.metrics.tpot_s
    assert panel.choose(tp=2, replicas=2, batch=16)
    assert panel.session.strategy == ServingStrategy(2, 1, 2)
    assert panel.session.metrics.tpot_s != tpot and "tp2 x2" in panel.summary.value
    assert (panel.degree_boxes["tp"].value, panel.mix_boxes["batch"].value) == (2, 16)
    assert "on 2 devices" in panel.gantt.figure["layout"]["title"]["text"]  # one replica
    # the placements are one replica's, a value split over its 2 GPUs
    assert ("h0_mlp_w_gate: S(1)", "h0_mlp_w_gate") in panel.placement_list.options
    assert panel.session.annotations()["h0_mlp_w_gate"][0].shape == (2,)
    # a pipeline's stages are not placed here: said, and no choice offered
    assert panel.choose(tp=2, pp=2, replicas=1)
    assert panel.placement_list.options == () and "choose pp = 1" in panel.placement_note.value
    assert panel.placement_choice.layout.display == "none"
    assert not panel.place("h0_mlp_w_gate", "R") and "choose pp = 1" in panel.placement_note.value
    assert panel.choose(pp=1, replicas=2) and panel.placement_choice.layout.display is None


@pytest.mark.parametrize(
    ("choice", "said"),
    [
        ({"tp": 3}, "does not divide the 4 key/value heads (layer 0: 4 = 1 x 3 + 1, 1 left over)"),
        ({"prompt_len": 1000, "output_len": 100}, "beyond the model's 1024 positions by 76"),
        ({"tp": 8}, "needs 8 GPUs; a100-hgx-4 has 4 (4 short"),
        ({"batch": 10**6}, r"does not fit tp4 on a100-hgx-4: the largest is"),
        ({"model": "llama-9"}, "unknown Llama shape 'llama-9'"),
    ],
)
def test_a_choice_that_cannot_be_served_is_said_and_changes_nothing(panel, choice, said) -> None:
    before = panel.session
    assert not panel.choose(**choice)
    assert panel.session is before
    assert said in panel.status.value.replace("&#x27;", "'"), panel.status.value
    assert panel.degree_boxes["tp"].value == 4 and panel.mix_boxes["batch"].value == 8


def test_a_placement_on_the_decode_step_changes_tpot(panel: ServingPanel) -> None:
    values = dict((v, label) for label, v in panel.placement_list.options)
    assert values["h0_mlp_w_gate"] == "h0_mlp_w_gate: S(1)"
    assert values["past_key_0"].startswith("past_key_0: S(")  # the cache split by kv heads
    base = panel.session.annotated().tpot_s
    panel.placement_list.value = "h0_mlp_w_gate"
    assert panel.placement_choice.options == ("R", "S(0)", "S(1)")
    panel.placement_choice.value = "R"  # what a click does
    after = panel.session.annotated().tpot_s
    assert after > base  # every GPU reads the whole weight
    assert "TPOT" in panel.placement_note.value and "distir-serving-tpot-after" in (
        panel.placement_note.value
    )
    assert "h0_mlp_w_gate R" in panel.gantt.figure["layout"]["title"]["text"]
    assert dict((v, label) for label, v in panel.placement_list.options)["h0_mlp_w_gate"] == (
        "h0_mlp_w_gate: R"
    )
    assert not panel.place("past_key_0", "S(7)")  # the cache has 4 axes
    assert panel.session.annotated().tpot_s == pytest.approx(after)


def test_the_workbench_serves_its_own_forward_program_or_else_a_llama() -> None:
    gpt = ir.models.gpt(2, 64, 64, 4, 100, 2, dtype="bfloat16")
    wb = Workbench(gpt, ir.Topology.preset("a100-hgx", 4))
    panel = wb.serve()
    assert panel.session.forward is gpt and panel.model.value == PROGRAM
    assert panel.session.strategy == ServingStrategy(tp=4)  # its 4 heads over the 4 GPUs
    assert (panel.session.mix.prompt_len, panel.session.mix.output_len) == (48, 16)
    assert "this program (gpt)" in [label for label, _ in panel.model.options]
    assert panel.choose(model="llama-2-7b", tp=4) and panel.model.value == "llama-2-7b"
    assert panel.choose(model=PROGRAM, prompt_len=32)
    assert panel.session.forward is gpt and panel.model.value == PROGRAM
    # a training step is no forward program: the default Llama, and the reason
    wb = Workbench(ir.models.mlp(8, 16, 32, 4), ir.Topology.preset("a100-hgx", 4))
    panel = wb.serve()
    assert panel.model.value == "llama-3-8b" and PROGRAM not in dict(panel.model.options).values()
    assert "mlp is not served (cannot tell the token ids" in panel.status.value
    assert (
        not panel.choose(model=PROGRAM) and "not given a program of its own" in panel.status.value
    )


def test_the_workbench_switches_to_serving_and_back() -> None:
    wb = Workbench(ir.models.mlp(8, 16, 32, 4), ir.Topology.preset("a100-hgx", 4))
    training = list(wb.children)
    panel = wb.serve(tp=4, batch=4)
    assert wb.mode.value == "serving" and panel in wb.children and wb.gantt_box not in wb.children
    assert panel.model_name == "llama-3-8b" and panel.session.strategy == ServingStrategy(tp=4)
    assert len(panel.session.topology.devices) == 8  # the panel's GPUs, not the step's
    assert panel.apply_button in wb._action_buttons()
    # the decode step's ops, not one bar per device (it is one task a device)
    layout = panel.gantt.figure["layout"]
    assert "bar per task" not in str(layout.get("title")), layout["title"]
    assert len(panel.session.metrics.decode.events) > 600
    wb.mode.value = "training"
    assert list(wb.children) == training
    assert wb.serve() is panel  # made once


def test_the_front_runs_as_a_task_with_progress_and_cancel() -> None:
    f = ir.models.llama(1, 1024, 512, 8, 1000, 2, kv_heads=4, ffn=1024, dtype="bfloat16")
    session = ServingSession(f, ir.Topology.preset("a100-hgx", 2), RequestMix(256, 64, 8))
    panel: ServingPanel | None = None
    activity = Activity(lambda: panel.buttons() if panel else [], lambda: None)
    panel = ServingPanel(session, activity=activity)
    seen: list[tuple[int, int, bool]] = []
    activity.progress.observe(
        lambda c: seen.append((c["new"], activity.progress.max, panel.front_button.disabled)),
        names="value",
    )
    task = panel.show_front()
    assert task is not None
    task.join(120)
    assert not task.running and task.error is None
    labels = {m.strategy.label for m in session.front().points}
    assert labels == {"tp1 x2", "tp1 pp2", "tp2"}  # every strategy of 2 GPUs
    assert seen and seen[-1][:2] == (3, 3) and all(disabled for *_, disabled in seen)
    assert not panel.front_button.disabled  # given back when it ended
    traces = panel.front.figure["data"]
    assert {t.get("name") for t in traces} >= {"tp1 x2", "tp2"}

    # a click on a point serves by its strategy and batch; the front stays (it covers both)
    i = next(k for k, t in enumerate(traces) if t.get("name") == "tp2")
    label, batch = traces[i]["customdata"][-1]
    panel.front.clicked = {"trace": i, "point": len(traces[i]["customdata"]) - 1, "n": 1}
    assert (
        (panel.session.strategy.label, panel.session.mix.batch)
        == (label, batch)
        == (
            "tp2",
            panel.session.mix.batch,
        )
    )
    assert panel.mix_boxes["batch"].value == batch and batch > 8
    assert panel.front is not None and panel.session.computed_front is not None

    # new prompts forget the front; Cancel stops the next one with what it says
    assert panel.choose(prompt_len=128) and panel.front is None
    task = panel.show_front()
    activity.cancel()
    task.join(120)
    assert isinstance(task.error, KeyboardInterrupt)
    assert "cancelled" in panel.status.value and panel.front is None
