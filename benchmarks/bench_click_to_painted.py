"""Click -> painted views, timed in the browser on the built-in example (Playwright).

Starts ``python -m workbench lab`` on a notebook of the built-in example (the GPT
training step with Adam on 8 simulated A100s, built with ``ir.models`` and
``ir.transforms`` so that any checkout runs it), runs it in Debian's Chromium, then
times, in the page, each click until every view it changes is drawn and painted (two
animation frames after the last change): the Gantt, the memory curves and the summary.
The clicks are what a user does: a strategy in the ready transforms, Sequential, a
value's placement applied in the sharding editor over a different mesh each time,
Undo and Redo. Prints each click and the median and 95th percentile per action and in
all (target: median under 300 ms, 95th percentile under 500 ms), and the console's
warnings and errors.

The views are recognised by what they draw, not by this version's attributes, so the
same script times an older checkout: ``--checkout DIR`` (e.g. a ``git worktree`` of an
earlier commit) serves that one's code.

    python benchmarks/bench_click_to_painted.py [--rounds 3] [--width 1280] [--checkout DIR]
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
# the built-in example (workbench.example), in APIs every checkout has; "forward": the
# example before it (a forward GPT of batch 8 and vocabulary 1024), which the first
# complaints were measured on
SUBJECTS = {
    "training": "transforms.training(models.gpt(16, 128, 512, 8, 4096, 4), 'adam')",
    "forward": "models.gpt(8, 128, 512, 8, 1024, 4)",
}


def notebook(subject: str) -> tuple[str, str]:
    return (
        "import ir\nfrom ir import models, transforms\nfrom workbench import Workbench\n"
        f"gpt = {SUBJECTS[subject]}\n"
        "wb = Workbench(gpt, ir.Topology.preset('a100-hgx', 8))\nwb",
        "wb.set_strategy(dp=2, hp=2, pp=2, microbatches=4, schedule='1f1b')\nprint('ready')",
    )


STRATEGIES = ((8, 1, 1, 1), (1, 8, 1, 1), (2, 4, 1, 1), (2, 2, 2, 4), (4, 1, 2, 2))
MESHES = ("8", "2x4", "4x2", "1x8", "8x1")

# What each view draws, cheaply: enough to tell one step's drawing from another's.
SIGNATURE = """() => {
  const q = (s) => document.querySelector(s);
  const chart = (s) => { const e = q(s); if (!e) return '';
    const t = e.querySelector('.gtitle');
    const ticks = e.querySelectorAll('.ytick, .xtick').length;
    const marks = e.querySelectorAll('.point, .js-line').length;
    return (t ? t.textContent : '') + '|' + marks + '|' + ticks; };
  const summary = q('.distir-summary');
  return [chart('.distir-gantt'), chart('.distir-memory'), summary ? summary.textContent : ''];
}"""

COUNT_CONSOLE = """
window.__console = { warn: 0, error: 0, trace: 0, assert: 0 };
window.__consoleFirst = [];
for (const kind of Object.keys(window.__console)) {
  const original = console[kind].bind(console);
  console[kind] = (...args) => {
    window.__console[kind] += 1;
    if (window.__consoleFirst.length < 5) window.__consoleFirst.push(`${kind}: ${args.join(' ')}`);
    if (kind !== 'trace') original(...args);
  };
}
"""

# Click ``selector`` and wait until the Gantt, the memory view and the summary all differ
# from before and the kernel has nothing more to say (the dashboard's working line clear),
# then two animation frames: painted. Milliseconds, in the page's own clock.
TIMED_CLICK = """async ([selector, signature, limitMs]) => {
  const sig = eval(signature);
  const before = sig();
  const frame = () => new Promise((r) => requestAnimationFrame(r));
  const busy = () => { const a = document.querySelector('.distir-activity-message');
    return a ? a.textContent.includes('…') : false; };
  const graph = () => { const g = document.querySelector('.distir-graph svg');
    return g ? g.getAttribute('viewBox') + g.querySelectorAll('g').length : ''; };
  const g0 = graph();
  const target = selector.startsWith('text=')
    ? [...document.querySelectorAll('.distir-workbench button')]
        .find((b) => b.textContent.trim() === selector.slice(5))
    : document.querySelector(selector);
  const t0 = performance.now();
  const seen = [-1, -1, -1, -1];
  target.click();
  while (true) {
    await frame();
    const now = [...sig(), graph()];
    const t = performance.now() - t0;
    for (let i = 0; i < 4; i++) if (seen[i] < 0 && now[i] !== (i < 3 ? before[i] : g0)) seen[i] = t;
    if (now[0] !== before[0] && now[1] !== before[1] && now[2] !== before[2] && !busy()) break;
    if (t > limitMs) return [-1, seen];
  }
  await frame();
  await frame();
  const at = (s, k) => { const e = document.querySelector(s + ' [data-revision]');
    return e && e.dataset[k] ? Number(e.dataset[k]) - t0 : -1; };
  seen.push(at('.distir-gantt', 'receivedAt'), at('.distir-gantt', 'drawnAt'),
            at('.distir-memory', 'receivedAt'), at('.distir-memory', 'drawnAt'));
  return [performance.now() - t0, seen];
}"""


# A click on the graph node of a value (where it is drawn: the view may have panned it away).
CLICK_NODE = """(name) => {
  const node = [...document.querySelectorAll('.distir-graph g.node')]
    .find((g) => (g.querySelector('title') || {}).textContent === name
      || [...g.querySelectorAll('text')].some((t) => t.textContent === name));
  for (const type of ['pointerdown', 'pointerup'])
    node.dispatchEvent(new PointerEvent(type, { bubbles: true }));
}"""


@contextmanager
def lab(folder: Path, checkout: Path) -> Iterator[str]:
    """``python -m workbench lab`` of ``checkout`` (its code in the server and the kernels)
    on ``folder/notebooks``; yields its address, stops it afterwards."""
    port = _free_port()
    env = dict(os.environ)
    env["PYTHONPATH"] = str(checkout)
    for name in ("JUPYTERLAB_SETTINGS_DIR", "JUPYTER_RUNTIME_DIR", "JUPYTERLAB_WORKSPACES_DIR"):
        env[name] = str(folder / name.lower())
    command = [sys.executable, "-m", "workbench", "lab", "--port", str(port), "--no-token"]
    with (folder / "lab.log").open("w") as log:
        server = subprocess.Popen(
            [*command, "--notebook-dir", str(folder / "notebooks")],
            cwd=checkout,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120
            while True:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit((folder / "lab.log").read_text()[-2000:])
                try:
                    urllib.request.urlopen(f"{base}/api/status", timeout=5).close()
                    break
                except OSError:
                    time.sleep(0.25)
            yield base
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(rounds: int, width: int, checkout: Path, subject: str) -> dict[str, list[float]]:
    from playwright.sync_api import sync_playwright

    times: dict[str, list[float]] = {}
    console: tuple[dict, list] = ({}, [])
    with tempfile.TemporaryDirectory(prefix="distir-bench-") as tmp:
        folder = Path(tmp)
        (folder / "notebooks").mkdir()
        nb = nbformat.v4.new_notebook()
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
        nb.cells = [nbformat.v4.new_code_cell(source) for source in notebook(subject)]
        nbformat.write(nb, folder / "notebooks" / "00_workbench.ipynb")
        with lab(folder, checkout) as base, sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": width, "height": 1400})
            # counted in the page: an old version's thousands of plotly WARN traces (each
            # with its stack) would overflow Playwright's pipe if each were sent over
            page.add_init_script(COUNT_CONSOLE)
            page.goto(f"{base}/lab/tree/00_workbench.ipynb")
            page.locator(".jp-StatusBar-Widget", has_text="Idle").first.wait_for(timeout=120_000)
            page.get_by_role("menuitem", name="Run", exact=True).click()
            page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
            page.locator(".distir-gantt .gtitle").first.wait_for(timeout=300_000)
            # every cell has run: as many outputs as code cells with one (the last prints)
            page.wait_for_function(
                "() => document.querySelectorAll('.jp-CodeCell .jp-OutputArea-output').length >= 2"
                " && document.querySelector('.jp-CodeCell:last-child .jp-OutputArea-output')",
                timeout=300_000,
            )
            page.locator(".jp-StatusBar-Widget", has_text="Idle").first.wait_for(timeout=120_000)
            page.wait_for_timeout(2000)

            def timed(action: str, selector: str) -> None:
                ms, seen = page.evaluate(TIMED_CLICK, [selector, SIGNATURE, 20_000])
                times.setdefault(action, []).append(ms)
                names = ("gantt", "memory", "summary", "graph")
                names += ("gantt in", "gantt drawn", "memory in", "memory drawn")
                views = ", ".join(f"{name} {t:.0f}" for name, t in zip(names, seen))
                print(f"  {action:18s} {ms:7.0f} ms (first drawn at: {views})", flush=True)
                page.wait_for_timeout(300)

            def knobs(dp: int, hp: int, pp: int, microbatches: int) -> None:
                for label, value in (
                    ("dp", dp),
                    ("hp", hp),
                    ("pp", pp),
                    ("microbatches", microbatches),
                ):
                    box = page.locator(".distir-workbench .widget-inline-hbox", has_text=label)
                    field = box.locator("input").first
                    field.fill(str(value))
                    field.press("Enter")
                page.wait_for_timeout(300)

            for r in range(rounds):
                print(f"round {r + 1}", flush=True)
                for k, (dp, hp, pp, m) in enumerate(STRATEGIES):
                    knobs(dp, hp, pp, m)
                    timed("apply strategy", "button.distir-apply-strategy")
                    timed("sequential", "text=Sequential")
                    # a value clicked in the graph, its placement over another mesh
                    page.evaluate(CLICK_NODE, "tokens")  # as graph.js hears a click on it
                    page.locator(".distir-editor-target", has_text="tokens").wait_for()
                    mesh = MESHES[(k + r) % len(MESHES)]
                    page.locator(".distir-mesh-shape input").fill(mesh)
                    page.locator(".distir-mesh-shape input").press("Enter")
                    page.wait_for_timeout(300)
                    axes = page.locator("[class*='distir-placement-'] select")
                    for i in range(axes.count()):
                        axes.nth(i).select_option(label="S(0)" if i == 0 else "R")
                    page.wait_for_timeout(300)
                    timed("apply placement", "button.distir-apply")
                    timed("undo", "button.distir-undo")
                    timed("redo", "button.distir-redo")
            browser.close()
    counts, first = console
    print("console warnings, traces and errors:", counts)
    for text in first:
        print(f"  {text[:160]}")
    return times


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="rounds of 25 clicks (default 2)")
    parser.add_argument("--width", type=int, default=1280, help="window width (default 1280)")
    parser.add_argument("--checkout", type=Path, default=ROOT, help="the code to serve")
    parser.add_argument(
        "--subject", choices=sorted(SUBJECTS), default="training", help="the model clicked on"
    )
    args = parser.parse_args()
    if not CHROMIUM.exists():
        print(f"needs Debian's chromium at {CHROMIUM}")
        return 2
    start = time.perf_counter()
    times = run(args.rounds, args.width, args.checkout.resolve(), args.subject)
    every = [t for ts in times.values() for t in ts if t >= 0]
    print(f"\nclick -> painted, {args.checkout.resolve()}, {args.subject} GPT, {args.width} px:")
    for action, ts in times.items():
        ok = [t for t in ts if t >= 0]
        lost = "" if len(ok) == len(ts) else f", {len(ts) - len(ok)} never drawn (timed out)"
        print(
            f"  {action:18s} median {statistics.median(ok):6.0f} ms, "
            f"p95 {percentile(ok, 0.95):6.0f} ms ({len(ok)} clicks{lost})"
        )
    print(
        f"  {'all':18s} median {statistics.median(every):6.0f} ms, p95 "
        f"{percentile(every, 0.95):6.0f} ms ({len(every)} clicks; target 300 / 500 ms)"
    )
    print(f"load average {os.getloadavg()[0]:.2f}; {time.perf_counter() - start:.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
