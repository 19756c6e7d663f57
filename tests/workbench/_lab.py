"""What the browser tests share: ``python -m workbench lab`` on a workspace of its own,
and a Chromium page on it that keeps its console messages."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def running_lab(tmp: Path, *args: str) -> Iterator[str]:
    """The README's command (with ``args``) serving from the repository, its settings,
    runtime and workspaces under ``tmp``; yields its base URL once it answers, and stops
    it (its whole session) after."""
    port = free_port()
    env = dict(os.environ)
    env["JUPYTERLAB_SETTINGS_DIR"] = str(tmp / "user-settings")
    env["JUPYTER_RUNTIME_DIR"] = str(tmp / "runtime")
    env["JUPYTERLAB_WORKSPACES_DIR"] = str(tmp / "workspaces")
    log = (tmp / "lab.log").open("w")
    command = [sys.executable, "-m", "workbench", "lab", "--port", str(port), "--no-token"]
    server = subprocess.Popen(
        [*command, *args],
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
            assert server.poll() is None, (tmp / "lab.log").read_text()[-2000:]
            try:
                urllib.request.urlopen(f"{base}/api/status", timeout=5).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "JupyterLab did not answer within 120 s"
                time.sleep(0.25)
        yield base
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
        log.close()


@contextmanager
def open_page(sync_api: Any, url: str, args: Sequence[str], width: int = 1280) -> Iterator:
    """Chromium on ``url`` once its kernel is idle; ``page.console_messages`` collects
    (type, text) of every console message."""
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=list(args))
        try:
            page = browser.new_page(viewport={"width": width, "height": 1000})
            page.console_messages = []
            page.on("console", lambda m: page.console_messages.append((m.type, m.text)))
            page.goto(url)
            page.locator(".jp-StatusBar-Widget", has_text="Idle").first.wait_for(timeout=120_000)
            yield page
        finally:
            browser.close()
