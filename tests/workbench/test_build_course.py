"""The static HTML course (scripts/build_course.py) is built offline: its pages load nothing
from the network, and their plotly figures carry plotly.js with them."""

from __future__ import annotations

import html
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "12_interleaved_pipelines.ipynb"  # a figure, a checked exercise
WIDGETS = ROOT / "notebooks" / "07_gpt_on_8_gpus.ipynb"  # figures and a progress-bar widget
DASHBOARD = ROOT / "notebooks" / "00_workbench.ipynb"  # the dashboard: charts inside widgets
# nbconvert's and jupyter-widgets' CDNs. (Inline plotly.js names cdn.plot.ly and jsdelivr for
# the topojson and icons of geo and map traces, which the course does not draw.)
CDNS = ("unpkg.com", "cdnjs.cloudflare.com")
REMOTE = re.compile(r"^\s*(https?:)?//", re.IGNORECASE)
# (tag, attribute) pairs whose URL a browser fetches when it opens the page
FETCHED = {("script", "src"), ("link", "href"), ("img", "src"), ("iframe", "src")}


class _Fetches(HTMLParser):
    """Collects every URL the page would fetch, and the ES module imports of inline scripts."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self.scripts: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if (tag, name) in FETCHED and value:
                self.urls.append(value)
        self._in_script = tag == "script"

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.scripts.append(data)


def test_the_course_page_of_a_notebook_loads_nothing_remote(tmp_path: Path) -> None:
    out = tmp_path / "course"
    subprocess.run(
        [
            *(sys.executable, ROOT / "scripts/build_course.py", "--out", out),
            *(NOTEBOOK, WIDGETS, DASHBOARD),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    assert {p.name for p in out.iterdir()} >= {
        "index.html",
        "glossary.html",
        "course.json",
        f"{NOTEBOOK.stem}.html",
        f"{WIDGETS.stem}.html",
    }
    for page in out.glob("*.html"):
        text = page.read_text(encoding="utf-8")
        parser = _Fetches()
        parser.feed(text)
        remote = [u for u in parser.urls if REMOTE.match(u)]
        assert remote == [], f"{page.name} loads {remote}"
        imports = [
            m.group(0)
            for s in parser.scripts
            for m in re.finditer(r"""(from|import\s*\()\s*["'](https?:)?//[^"']+""", s)
        ]
        assert imports == [], f"{page.name} imports {imports}"
        # a loader script may build its URL at run time: no CDN host may appear at all
        assert [c for c in CDNS if c in text] == [], page.name

    page = (out / f"{NOTEBOOK.stem}.html").read_text(encoding="utf-8")
    assert "Plotly.newPlot" in page  # the figure is drawn ...
    assert "plotly.js v" in page and len(page) > 3_000_000  # ... by plotly.js inline (MBs)
    assert 'href="glossary.html"' in page and "../docs/glossary.md" not in page
    # the exercises as the reader gets them: blank, the solution's verdict not shown (the
    # build ran the hidden solutions: a wrong one would have failed it)
    code = html.unescape(re.sub(r"<[^>]+>", "", page))  # the page's text, highlighting gone
    assert re.search(r"\banswer_v\w*\s*=\s*None\b", code)
    assert "exercise-verdict" not in page and "Right: 4" not in page
    assert "Run this cell after answering" in page
    assert f"<title>{NOTEBOOK.stem[:2]}. Interleaved" in page
    index = (out / "index.html").read_text(encoding="utf-8")
    assert f'href="{NOTEBOOK.stem}.html"' in index and f'href="{WIDGETS.stem}.html"' in index
    widgets_page = (out / f"{WIDGETS.stem}.html").read_text(encoding="utf-8")
    assert "Plotly.newPlot" in widgets_page
    # the start page: the dashboard's charts drawn from their saved state, not notes
    start = (out / f"{DASHBOARD.stem}.html").read_text(encoding="utf-8")
    assert "run the notebook" not in start and "live plotly chart" not in start
    assert start.count("Plotly.newPlot") >= 2  # the Gantt and the memory curves
    assert "on 8 devices" in start and len(re.findall(r"plotly\.js v\d", start)) == 1
    # the progress-bar widget is drawn from its saved state, as it was when the run finished
    progress = re.search(r"<progress [^>]*>", widgets_page)
    assert progress and 'value="6.0"' in progress[0] and 'max="6.0"' in progress[0]
    assert "widget-view+json" not in widgets_page and "widget-state+json" not in widgets_page
