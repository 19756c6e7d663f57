"""The dashboard's serving mode in a real JupyterLab and Chromium: a user opens the
dashboard, switches to serving, sees the decode step's Gantt chart, the KV-cache memory
curve and the figures (TTFT, TPOT), clicks a placement of the decode step and sees TPOT
change, is told why a tensor-parallel degree that does not divide the key/value heads is
refused, draws the latency/throughput front and serves by a point clicked on it; the
console stays silent. A screenshot of the panel goes to ``artifacts/serving.png``."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from _lab import CHROMIUM, ROOT, open_page, running_lab

ARTIFACTS = ROOT / "artifacts"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
SOURCE = (
    "import ir\n"
    "from workbench import Workbench\n"
    "wb = Workbench(ir.models.mlp(8, 16, 32, 4), ir.Topology.preset('a100-hgx', 4))\n"
    "wb"
)

pytestmark = [
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium"
    ),
    pytest.mark.timeout(600),
]


def _notebook(folder: Path) -> Path:
    cell = {"cell_type": "code", "metadata": {}, "source": SOURCE, "outputs": []}
    cell["execution_count"] = None
    nb = {
        "cells": [cell],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path = folder / "serving.ipynb"
    path.write_text(json.dumps(nb))
    return path


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright for Python")
    tmp = tmp_path_factory.mktemp("lab")
    folder = tmp / "notebooks"
    folder.mkdir()
    _notebook(folder)
    with (
        running_lab(tmp, "--notebook-dir", str(folder)) as base,
        open_page(sync_api, f"{base}/lab/tree/serving.ipynb", ARGS) as page,
    ):
        yield page


DRAWN = """() => {
  const q = (s) => document.querySelector(s);
  const count = (s) => document.querySelectorAll(s).length;
  const title = (s) => { const t = q(s + ' .gtitle'); return t ? t.textContent : ''; };
  const tpot = q('.distir-serving-time-per-output-token');
  return {
    gantt_bars: count('.distir-serving-gantt .trace.bars .point path'),
    memory_lines: [...document.querySelectorAll('.distir-serving-memory .scatterlayer .js-line')]
      .filter((p) => (p.getAttribute('d') || '').length > 10).length,
    gantt_title: title('.distir-serving-gantt'),
    memory_title: title('.distir-serving-memory'),
    tpot: tpot ? tpot.textContent : '',
    values: count('.distir-serving-values option'),
  };
}"""


def _noisy(page) -> list[tuple[str, str]]:
    return [
        (k, t) for k, t in page.console_messages if k in ("error", "warning", "trace", "assert")
    ]


def _times_ms(text: str) -> list[float]:
    scale = {"us": 1e-3, "µs": 1e-3, "ms": 1.0, "s": 1e3}
    return [float(v) * scale[u] for v, u in re.findall(r"([\d.]+) (µs|us|ms|s)\b", text)]


def test_serving_mode_draws_its_views_and_a_placement_changes_tpot(page) -> None:
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
    page.locator(".distir-mode button", has_text="serving").wait_for(timeout=180_000)
    page.locator(".distir-mode button", has_text="serving").click()
    try:
        page.wait_for_function(
            "(drawn) => { const d = eval(drawn)(); return d.gantt_bars > 0 && "
            "d.memory_lines > 0 && d.tpot && d.values > 0; }",
            arg=DRAWN,
            timeout=180_000,
        )
    except Exception as e:
        raise AssertionError(f"not drawn: {page.evaluate(DRAWN)}") from e
    drawn = page.evaluate(DRAWN)
    assert "decode step" in drawn["gantt_title"] and "8 devices" in drawn["gantt_title"], drawn
    assert "KV" in drawn["memory_title"], drawn
    assert "CUDA graphs" in drawn["tpot"], drawn

    # a placement clicked on the decode step: the MLP's gate weight whole on every GPU
    page.locator(".distir-serving-values select").select_option(label="h0_mlp_w_gate: S(1)")
    # the choices show the value's placement once the kernel has answered the click
    active = page.locator(".distir-serving-placement button.mod-active", has_text="S(1)")
    active.wait_for(timeout=60_000)
    page.locator(".distir-serving-placement button", has_text="R").first.click()
    note = page.locator(".distir-serving-tpot", has_text="TPOT")
    try:
        note.locator(".distir-serving-tpot-after").wait_for(timeout=120_000)
    except Exception as e:
        said = page.locator(".distir-serving-tpot").text_content()
        raise AssertionError(f"no new TPOT: {said!r}") from e
    before, after = _times_ms(note.text_content() or "")
    assert after > before, note.text_content()  # every GPU reads the whole weight

    # a degree the model cannot take is refused, saying by how much; nothing changes
    field = page.locator(".distir-serving-tp input")
    field.fill("3")
    field.press("Enter")
    page.locator("button.distir-serving-apply").click()
    status = page.locator(".distir-serving-status", has_text="does not divide")
    status.wait_for(timeout=60_000)
    assert "8 key/value heads" in status.text_content() and "2 left over" in status.text_content()
    assert page.locator(".distir-serving-tp input").input_value() == "8"

    # another strategy: the figures and the Gantt follow
    field.fill("4")
    field.press("Enter")
    page.locator(".distir-serving-replicas input").fill("2")
    page.locator(".distir-serving-replicas input").press("Enter")
    page.locator("button.distir-serving-apply").click()
    page.locator(".distir-serving-strategy", has_text="tp4 x2").wait_for(timeout=120_000)
    page.wait_for_function(
        "() => (document.querySelector('.distir-serving-gantt .gtitle') || {}).textContent"
        "?.includes('4 devices')",
        timeout=60_000,
    )

    # the latency/throughput front over every strategy, with its SLA
    page.locator("button.distir-serving-front-button").click()
    front = page.locator(".distir-serving-front .main-svg").first
    front.wait_for(timeout=300_000)
    title = page.locator(".distir-serving-front .gtitle").first.text_content() or ""
    assert "TPOT" in title or "front" in title.lower(), title
    assert page.locator(".distir-serving-front .scatterlayer .point").count() > 3

    # a click on a point of the front serves by its strategy and batch (the hover says which)
    point = page.locator(".distir-serving-front .scatterlayer .trace").first.locator(".point").last
    page.locator(".distir-serving-front .main-svg").first.scroll_into_view_if_needed()
    page.wait_for_timeout(300)
    box = point.bounding_box()
    assert box is not None
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(x, y)
    hover = page.locator(".distir-serving-front .hovertext").first
    hover.wait_for(timeout=10_000)
    label, batch = re.match(r"(.+?), batch (\d+)", hover.text_content() or "").groups()
    page.mouse.click(x, y)
    page.locator(".distir-serving-strategy", has_text=f"{label} on").wait_for(timeout=120_000)
    page.locator(".distir-serving-requests", has_text=f"batch {batch}").wait_for(timeout=10_000)
    assert page.locator(".distir-serving-front .main-svg").count() > 0  # the front stays
    ARTIFACTS.mkdir(exist_ok=True)
    page.set_viewport_size({"width": 1280, "height": 2000})
    page.wait_for_timeout(1000)  # the charts refit to the window
    page.evaluate("document.querySelector('.distir-mode').scrollIntoView()")
    page.wait_for_timeout(300)
    board = page.locator(".distir-workbench").bounding_box()
    assert board is not None and board["width"] > 800
    page.screenshot(path=str(ARTIFACTS / "serving.png"), clip=board)
    page.set_viewport_size({"width": 1280, "height": 1000})

    # back to the training step: its views are still there
    page.locator(".distir-mode button", has_text="training").click()
    page.locator(".distir-gantt .main-svg").first.wait_for(timeout=60_000)
    assert _noisy(page) == [], _noisy(page)[:5]
