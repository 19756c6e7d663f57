"""The workbench in a real browser: JupyterLab + Chromium driven by Playwright.

Starts JupyterLab on a temporary notebook that shows a Workbench, runs it,
clicks the ``wA`` node of the graph, applies ``S(1)`` on a 4-device mesh in the
editor, and checks that the kernel saw it (the dashboard's labels, written by
Python, name the value and the new strategy) and that the Gantt chart was
redrawn. A screenshot goes to ``artifacts/workbench.png``.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = ROOT / "artifacts"

pytestmark = [
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium (apt)"
    ),
    pytest.mark.timeout(300),
]

NOTEBOOK = [
    "import ir\nfrom ir import models\nfrom workbench import Workbench",
    "wb = Workbench(models.mlp(8, 16, 32, 4), ir.Topology.preset('a100-hgx', 4))\nwb",
]
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _api(base: str, token: str, path: str, method: str = "GET") -> object:
    request = urllib.request.Request(
        f"{base}{path}", method=method, headers={"Authorization": f"token {token}"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        body = response.read()
    return json.loads(body) if body else None


@pytest.fixture
def lab(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A JupyterLab server on a temporary copy of a small workbench notebook."""
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    nb.cells = [nbformat.v4.new_code_cell(src) for src in NOTEBOOK]
    nbformat.write(nb, notebooks / "workbench.ipynb")
    settings = tmp_path / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    # no news or update pop-ups over the page (they would also try to reach the network)
    (settings / "notification.jupyterlab-settings").write_text(
        '{"fetchNews": "false", "checkForUpdates": false}'
    )
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env["JUPYTERLAB_SETTINGS_DIR"] = str(tmp_path / "settings")
    env["JUPYTER_RUNTIME_DIR"] = str(tmp_path / "runtime")
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab",  # this environment's JupyterLab, whatever PATH says
        "--no-browser",
        "--allow-root",
        f"--port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        "--LabApp.expose_app_in_browser=True",
        f"--notebook-dir={notebooks}",
    ]
    log = (tmp_path / "lab.log").open("w")
    server = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if server.poll() is not None:
                pytest.fail(f"JupyterLab exited: {(tmp_path / 'lab.log').read_text()[-2000:]}")
            try:
                _api(base, token, "/api/status")
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail("JupyterLab did not answer within 120 s")
                time.sleep(0.25)
        yield base, token
    finally:
        try:
            for kernel in _api(base, token, "/api/kernels") or []:  # type: ignore[union-attr]
                _api(base, token, f"/api/kernels/{kernel['id']}", method="DELETE")
        except OSError:
            pass
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()


def test_click_a_value_apply_a_sharding_and_see_every_view_update(lab: tuple[str, str]) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright for Python")
    base, token = lab
    ARTIFACTS.mkdir(exist_ok=True)
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1300})
            outside: list[str] = []
            local = (base, "blob:", "data:")
            page.on("request", lambda r: r.url.startswith(local) or outside.append(r.url))
            page.goto(f"{base}/lab/tree/workbench.ipynb?token={token}")
            page.wait_for_function(
                "() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
                " const k = w && w.sessionContext && w.sessionContext.session"
                " && w.sessionContext.session.kernel; return k && k.status === 'idle'; }",
                timeout=120_000,
            )
            page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")

            # The dashboard is drawn: graph with the wA input node, Gantt with its title.
            node = page.locator(".distir-graph g#in-0")
            node.wait_for(timeout=120_000)
            gantt_title = page.locator(".distir-gantt .gtitle")
            gantt_title.wait_for(timeout=60_000)
            title_before = gantt_title.text_content()
            summary = page.locator(".distir-summary")
            assert "sequential" in (summary.text_content() or "")

            node.click()  # Python maps the SVG id to value wA and selects it in the editor
            page.locator(".distir-selection .distir-selected-name", has_text="wA").wait_for(
                timeout=30_000
            )
            page.locator(".distir-editor-target", has_text="wA").wait_for(timeout=30_000)

            page.locator(".distir-mesh-shape input").fill("4")
            page.locator(".distir-mesh-shape input").press("Enter")
            page.locator(".distir-placement-0 select").select_option(label="S(1)")
            page.locator("button.distir-apply").click()

            # The kernel propagated and simulated: Python rewrote the summary and the Gantt.
            page.locator(".distir-summary", has_text="annotated: wA").wait_for(timeout=60_000)
            page.wait_for_function(
                "before => { const t = document.querySelector('.distir-gantt .gtitle');"
                " return t && t.textContent !== before; }",
                arg=title_before,
                timeout=60_000,
            )
            title_after = gantt_title.text_content() or ""
            assert "4 devices" in title_after, title_after
            assert page.locator(".distir-gantt .gtitle").count() == 1
            # Redrawn in place: a row per device and stream, bars, and hover texts built
            # from the numbers the kernel sent as typed arrays.
            ticks = page.locator(".distir-gantt .ytick text").all_text_contents()
            assert "dev 3 · comp" in ticks and "dev 0 · comm" in ticks, ticks
            bars = page.locator(".distir-gantt .trace.bars .point path")
            assert bars.count() > 4
            bars.first.hover(force=True)
            hover = page.locator(".distir-gantt .hoverlayer .hovertext")
            hover.first.wait_for(timeout=10_000)
            text = hover.first.text_content() or ""
            assert "start" in text and "FLOP" in text and "dev " in text, text
            assert "S(1)" in (page.locator(".distir-selection").text_content() or "")
            page.locator(".distir-workbench").screenshot(path=str(ARTIFACTS / "workbench.png"))
            page.screenshot(path=str(ARTIFACTS / "workbench-page.png"))
            assert not outside, f"the page fetched from outside the server: {outside[:5]}"
        finally:
            browser.close()


# Every control of the dashboard, and the text that names one.
_CONTROLS = ".distir-workbench :is(input, select, button, textarea, .widget-label)"
_OUT_OF_VIEW = """sel => {
  const out = [];
  const box = document.querySelector('.distir-workbench').getBoundingClientRect();
  for (const el of document.querySelectorAll(sel)) {
    const r = el.getBoundingClientRect();
    if (r.width === 0 || r.height === 0) continue;  // not shown (a hidden widget)
    const name = (el.textContent || el.value || el.className || el.tagName).trim().slice(0, 40);
    if (r.left < 0 || r.right > window.innerWidth + 0.5)
      out.push(`${name}: x ${r.left.toFixed(0)}..${r.right.toFixed(0)} outside the viewport`);
    else if (r.left < box.left - 0.5 || r.right > box.right + 0.5)
      out.push(`${name}: x ${r.left.toFixed(0)}..${r.right.toFixed(0)} outside the dashboard`);
    else if (el.classList.contains('widget-label') && el.scrollWidth > el.clientWidth + 1)
      out.push(`${name}: label cut (${el.scrollWidth} px of text in ${el.clientWidth} px)`);
  }
  return out;
}"""


_CHART_WIDTHS = """() => [
  document.querySelector('.distir-gantt .main-svg').getBoundingClientRect().width,
  document.querySelector('.distir-workbench').clientWidth,
]"""


@pytest.mark.parametrize("widths", [(1280, 1920)])
def test_every_control_fits_at_1280_and_1920_px(lab: tuple[str, str], widths) -> None:
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright for Python")
    base, token = lab
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": widths[0], "height": 1000})
            page.goto(f"{base}/lab/tree/workbench.ipynb?token={token}")
            page.wait_for_function(
                "() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
                " const k = w && w.sessionContext && w.sessionContext.session"
                " && w.sessionContext.session.kernel; return k && k.status === 'idle'; }",
                timeout=120_000,
            )
            page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
            page.locator("button.distir-apply-strategy").wait_for(timeout=120_000)
            page.locator(".distir-gantt .gtitle").wait_for(timeout=60_000)
            page.locator(".distir-graph svg").first.wait_for(timeout=60_000)
            page.wait_for_timeout(300)  # the first fit runs on the next animation frame
            graph, panel = (
                page.locator(sel).first.bounding_box()
                for sel in (".distir-graph svg", ".distir-graph")
            )
            assert graph and panel and graph["width"] <= panel["width"] + 1  # fitted to width
            for width in widths:  # one kernel for both widths: the layout follows the window
                page.set_viewport_size({"width": width, "height": 1000})
                page.wait_for_timeout(500)
                clipped = page.evaluate(_OUT_OF_VIEW, _CONTROLS)
                assert not clipped, f"at {width} px: {clipped}"
                assert page.locator(_CONTROLS).count() > 10
                # the charts take the dashboard's width (not plotly's default 700 px)
                page.wait_for_timeout(1000)  # the kernel answers the new width
                chart, board = page.evaluate(_CHART_WIDTHS)
                assert board - 2 <= chart <= board + 0.5, f"at {width} px: {chart} of {board}"
        finally:
            browser.close()
