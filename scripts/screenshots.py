"""Screenshots of the dashboard as a user first sees it, for the README and docs.

    python scripts/screenshots.py                 # docs/dashboard-1280.png, docs/dashboard-1920.png
    python scripts/screenshots.py --out build/    # elsewhere
    python scripts/screenshots.py --widths 1600   # other window widths

Starts ``python -m workbench lab`` (the command ``scripts/dev.sh workbench`` runs) on a
copy of ``notebooks/00_workbench.ipynb`` in a temporary folder (autosave must not write
outputs into the committed notebook), opens it in Debian's Chromium through
Playwright, runs every cell as a user's *Run All* does, waits for the dashboard's
graph, Gantt and memory views, closes the file browser, and photographs the dashboard
at each window width.
Needs ``/usr/bin/chromium`` (apt) and playwright for Python; never downloads a browser.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
NOTEBOOK = "00_workbench.ipynb"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
LAST_OUTPUT = "dp=2 x hp=2 x pp=2, 1F1B:"  # what the notebook's last cell prints


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def lab(folder: Path) -> Iterator[str]:
    """``python -m workbench lab`` on ``folder`` (a fresh user: no saved settings);
    yields its address and stops it (and its kernels) afterwards."""
    port = _free_port()
    env = dict(os.environ)
    env["JUPYTERLAB_SETTINGS_DIR"] = str(folder / "user-settings")
    env["JUPYTER_RUNTIME_DIR"] = str(folder / "runtime")
    env["JUPYTERLAB_WORKSPACES_DIR"] = str(folder / "workspaces")  # the user's layout stays
    notebooks = folder / "notebooks"
    command = [sys.executable, "-m", "workbench", "lab", "--port", str(port), "--no-token"]
    log_path = folder / "lab.log"
    with log_path.open("w") as log:
        server = subprocess.Popen(
            [*command, "--notebook-dir", str(notebooks)],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120
            while True:
                if server.poll() is not None:
                    raise SystemExit(f"JupyterLab exited:\n{log_path.read_text()[-2000:]}")
                try:
                    urllib.request.urlopen(f"{base}/api/status", timeout=5).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise SystemExit("JupyterLab did not answer within 120 s") from None
                    time.sleep(0.25)
            yield base
        finally:
            server.send_signal(signal.SIGTERM)  # the workbench stops JupyterLab and kernels
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()


def photograph(base: str, out: Path, widths: Sequence[int], height: int) -> list[Path]:
    """Open the dashboard notebook at ``base``, run it, and photograph the dashboard at
    each width (one kernel: the layout follows the window)."""
    from playwright.sync_api import sync_playwright

    written = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": widths[0], "height": height})
            page.goto(f"{base}/lab/tree/{NOTEBOOK}")
            idle = page.locator(".jp-StatusBar-Widget", has_text="Idle").first
            idle.wait_for(timeout=120_000)  # the kernel has started
            page.get_by_role("menuitem", name="Run", exact=True).click()  # as a user does
            page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
            for selector in (".distir-graph svg", ".distir-gantt .gtitle", ".distir-memory"):
                page.locator(selector).first.wait_for(timeout=180_000)
            output = page.locator(".jp-OutputArea-output", has_text=LAST_OUTPUT).first
            output.wait_for(timeout=180_000)  # every cell has run
            idle.wait_for(timeout=120_000)
            # the file browser closed (a click on its tab, as a user does): the dashboard
            # gets the window's width
            page.locator(".jp-SideBar.jp-mod-left .lm-TabBar-tab.lm-mod-current").click()
            dashboard = page.locator(".distir-workbench").first
            for width in widths:
                page.set_viewport_size({"width": width, "height": height})
                page.wait_for_timeout(1500)  # plotly and the graph refit on resize
                dashboard.scroll_into_view_if_needed()
                path = out / f"dashboard-{width}.png"
                dashboard.screenshot(path=str(path))
                written.append(path)
        finally:
            browser.close()
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: write one screenshot per width and print where."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(ROOT / "docs"), help="folder (default docs/)")
    parser.add_argument(
        "--widths", type=int, nargs="+", default=[1280, 1920], help="window widths in px"
    )
    parser.add_argument(
        "--height", type=int, default=2600, help="window height in px: the whole dashboard"
    )
    args = parser.parse_args(argv)
    if not CHROMIUM.exists():
        print(f"error: no Chromium at {CHROMIUM}; install it: apt-get install chromium")
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="distir-shots-") as tmp:
        folder = Path(tmp)
        (folder / "notebooks").mkdir()
        shutil.copy(ROOT / "notebooks" / NOTEBOOK, folder / "notebooks" / NOTEBOOK)
        with lab(folder) as base:
            for path in photograph(base, out, args.widths, args.height):
                print(f"wrote {path} ({path.stat().st_size / 1e3:.0f} kB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
