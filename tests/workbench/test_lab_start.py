"""``python -m workbench lab``: the dashboard notebook open, no news pop-up over it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from _lab import CHROMIUM, running_lab

from workbench.__main__ import (
    DASHBOARD,
    LAB_OVERRIDES,
    NOTEBOOKS,
    lab_command,
    lab_settings,
    workspace,
)

NEWS = "Would you like to get notified about official Jupyter news?"


def test_the_settings_overrides_keep_the_installations_own(tmp_path: Path) -> None:
    defaults = tmp_path / "app" / "settings"
    defaults.mkdir(parents=True)
    theirs = {
        "@jupyterlab/apputils-extension:themes": {"theme": "JupyterLab Dark"},
        "@jupyterlab/apputils-extension:notification": {"doNotDisturbMode": True},
    }
    (defaults / "overrides.json").write_text(json.dumps(theirs))
    (defaults / "page_config.json").write_text('{"disabledExtensions": {"x": true}}')
    (tmp_path / "app" / "static").mkdir()
    settings = lab_settings(tmp_path / "run", defaults)
    written = json.loads((settings / "overrides.json").read_text())
    notification = written["@jupyterlab/apputils-extension:notification"]
    assert notification == {
        "doNotDisturbMode": True,
        "fetchNews": "false",
        "checkForUpdates": False,
    }
    assert written["@jupyterlab/apputils-extension:themes"] == {"theme": "JupyterLab Dark"}
    assert json.loads((settings / "page_config.json").read_text()) == {
        "disabledExtensions": {"x": True}
    }
    assert (tmp_path / "run" / "static").resolve() == (tmp_path / "app" / "static").resolve()
    assert json.loads((defaults / "overrides.json").read_text()) == theirs  # untouched


def test_the_lab_starts_on_the_dashboard_with_its_settings(tmp_path: Path) -> None:
    served = workspace(tmp_path / "ws")
    cmd = lab_command(port=1, token="t", notebook_dir=served, app_settings_dir=tmp_path)
    assert f"--LabApp.default_url=/lab/tree/notebooks/{DASHBOARD}" in cmd
    assert f"--LabApp.app_settings_dir={tmp_path}" in cmd
    assert (NOTEBOOKS / DASHBOARD).is_file()
    elsewhere = lab_command(port=1, token="t", notebook_dir=tmp_path / "other", as_root=False)
    assert not any(a.startswith("--LabApp.default_url") for a in elsewhere)  # no dashboard there
    assert set(LAB_OVERRIDES) == {"@jupyterlab/apputils-extension:notification"}


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium")
@pytest.mark.timeout(300)
def test_the_lab_opens_the_dashboard_without_the_news_pop_up(tmp_path: Path) -> None:
    """The command the README gives, in Chromium, with a fresh user (no settings yet):
    the first thing JupyterLab would otherwise show is the news question. The lab serves
    copies of the notebooks: saving the dashboard notebook changes the copy only."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright for Python")
    with (
        running_lab(tmp_path, "--workspace", str(tmp_path / "ws")) as base,  # a first start
        sync_api.sync_playwright() as pw,
    ):
        browser = pw.chromium.launch(
            executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(f"{base}/")  # the start page, as `--browser` opens it
            page.locator(".jp-NotebookPanel").first.wait_for(timeout=120_000)
            tab = page.locator(".lm-TabBar-tab.lm-mod-current .lm-TabBar-tabLabel")
            assert DASHBOARD in tab.all_text_contents()
            assert f"/lab/tree/notebooks/{DASHBOARD}" in page.url
            # the question comes once the application is restored: give it time
            page.wait_for_timeout(5000)
            assert page.get_by_text(NEWS).count() == 0
            committed = (NOTEBOOKS / DASHBOARD).read_bytes()
            page.get_by_role("menuitem", name="Run", exact=True).click()  # as a user does
            page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
            page.locator(".distir-gantt [data-revision]").first.wait_for(timeout=180_000)
            page.locator(".jp-NotebookPanel").first.click()
            page.keyboard.press("Control+s")
            copy = tmp_path / "ws" / "notebooks" / DASHBOARD
            deadline = time.monotonic() + 30
            while '"outputs": []' in copy.read_text() and time.monotonic() < deadline:
                time.sleep(0.5)
            assert '"output_type"' in copy.read_text()  # the copy was saved with outputs
            assert (NOTEBOOKS / DASHBOARD).read_bytes() == committed  # the repo's was not
        finally:
            browser.close()
