"""Build the static HTML course: execute the tutorials and write them, with their outputs, as
pages a student reads offline.

    python scripts/build_course.py                      # every notebook -> build/course/
    python scripts/build_course.py --out DIR NB.ipynb   # some notebooks, somewhere else

Each notebook runs in a fresh kernel from ``notebooks/`` (the project importable from this
checkout) and becomes ``<name>.html``; ``index.html`` lists them with their run times and
``glossary.html`` is ``docs/glossary.md``. Nothing is loaded from the network when a page
is opened: the template drops nbconvert's require.js, MathJax, mermaid and jupyter-widgets
CDN scripts (the notebooks write their formulas in plain text), every plotly figure is
written as HTML with plotly.js inline (once per page, before the first figure), and every
widget (the workbench's dashboard, a progress bar) is drawn statically from the widget state
the run saved, as it was when the notebook finished (``widgets.saved_widget``), its charts
included. The exercises are run with their hidden solutions (a wrong one fails the build)
and shown as the reader gets them: the answer cells blank, the checks not yet run.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import sys
import time
from pathlib import Path

import nbformat
import plotly.io as pio
from nbconvert import HTMLExporter
from nbconvert.filters.markdown_mistune import markdown2html_mistune
from nbconvert.preprocessors import ExecutePreprocessor

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # render with this checkout's widgets, as the kernels run it
    sys.path.insert(0, str(ROOT))

from widgets.saved_widget import WIDGET_STATE_MIME, WIDGET_VIEW_MIME, SavedWidgets  # noqa: E402
from workbench.exercises import SOLUTION_KEY  # noqa: E402

CHECK_NOTE = (
    "(Run this cell after answering in the cell above, in the notebook: it says right, or "
    "wrong and why. The course was built with the hidden solutions, and every check passed.)"
)

NOTEBOOKS = ROOT / "notebooks"
GLOSSARY = ROOT / "docs" / "glossary.md"
TEMPLATE_DIR = Path(__file__).resolve().parent / "course_template"
PLOTLY_MIME = "application/vnd.plotly.v1+json"
GLOSSARY_LINK = ("../docs/glossary.md", "glossary.html")


def _static_outputs(nb: nbformat.NotebookNode) -> tuple[int, int]:
    """Give every plotly figure and every widget output an HTML form; (figures, widgets).

    plotly.js goes inline once, before the first figure. The JSON form of a figure stays for
    Jupyter; the HTML exporter cannot draw it. A widget output keeps only its model id, so its
    HTML is drawn from the saved widget state and replaces the widget view (which needs a
    kernel); a chart inside a widget is drawn from its saved state, its latest figure (see
    ``widgets.saved_widget``).
    """
    state = nb.metadata.get("widgets", {}).get(WIDGET_STATE_MIME, {}).get("state", {})
    saved = SavedWidgets(state)
    figures = widgets = 0
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data", {})
            if PLOTLY_MIME in data:
                data["text/html"] = pio.to_html(
                    data[PLOTLY_MIME], include_plotlyjs=not saved.plotly_on_page, full_html=False
                )
                saved.plotly_on_page = True
                figures += 1
            elif WIDGET_VIEW_MIME in data:
                view = data.pop(WIDGET_VIEW_MIME)
                data["text/html"] = saved.html(view.get("model_id", ""))
                widgets += 1
    nb.metadata.pop("widgets", None)  # drawn: the state (MBs for a dashboard) stays out
    return figures, widgets


def _with_solutions(nb: nbformat.NotebookNode) -> dict[int, str]:
    """Put each exercise's hidden solution in its answer cell, so that the run checks it
    (a wrong solution fails the build); the blanks, by cell index."""
    blanks = {}
    for i, cell in enumerate(nb.cells):
        if _is_answer(cell) and SOLUTION_KEY in cell.metadata:
            blanks[i] = cell.source
            cell.source = cell.metadata[SOLUTION_KEY]
    return blanks


def _as_the_reader_sees_it(nb: nbformat.NotebookNode, blanks: dict[int, str]) -> None:
    """The page shows the blanks, not the solutions: each answer cell its blank (with no
    output), each check cell a note instead of the verdict it gave the solution."""
    for i, blank in blanks.items():
        answer = nb.cells[i]
        answer.source, answer.outputs, answer.execution_count = blank, [], None
        answer.metadata.pop(SOLUTION_KEY, None)
        check = nb.cells[i + 1] if i + 1 < len(nb.cells) else None
        if check is not None and "exercise-check" in check.metadata.get("tags", []):
            check.outputs = [nbformat.v4.new_output("stream", name="stdout", text=CHECK_NOTE)]
            check.execution_count = None


def _is_answer(cell: nbformat.NotebookNode) -> bool:
    return "exercise-answer" in cell.get("metadata", {}).get("tags", [])


def _link_glossary(nb: nbformat.NotebookNode) -> None:
    old, new = GLOSSARY_LINK
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = cell.source.replace(old, new)


def _title(nb: nbformat.NotebookNode, fallback: str) -> str:
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return fallback


def _page(title: str, body: str) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n"
        "<style>body{font-family:system-ui,sans-serif;max-width:50em;margin:2em auto;"
        "padding:0 1em;line-height:1.5}code{background:#f3f3f3;padding:0 .2em}"
        "td,th{padding:.2em .8em;text-align:left}</style>\n"
        f"</head>\n<body>\n{body}\n</body>\n</html>\n"
    )


def build_notebook(path: Path, out_dir: Path, timeout_s: int = 600) -> tuple[str, float, int, int]:
    """Execute ``path`` and write ``out_dir/<stem>.html``; (title, seconds, figures, widgets)."""
    nb = nbformat.read(path, as_version=4)
    blanks = _with_solutions(nb)
    start = time.perf_counter()
    ExecutePreprocessor(timeout=timeout_s, kernel_name="python3").preprocess(
        nb, {"metadata": {"path": str(NOTEBOOKS)}}
    )
    seconds = time.perf_counter() - start
    _as_the_reader_sees_it(nb, blanks)
    figures, widgets = _static_outputs(nb)
    _link_glossary(nb)
    exporter = HTMLExporter(template_name="offline", extra_template_basedirs=[str(TEMPLATE_DIR)])
    title = _title(nb, path.stem)
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": title}})
    (out_dir / f"{path.stem}.html").write_text(body, encoding="utf-8")
    return title, seconds, figures, widgets


def build(notebooks: list[Path], out_dir: Path) -> dict[str, dict[str, object]]:
    """Build the pages of ``notebooks``, the glossary and the index under ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    # The kernels import the project from this checkout (as notebooks/conftest.py does
    # for nbval).
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(ROOT) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *paths])
    built: dict[str, dict[str, object]] = {}
    for path in notebooks:
        title, seconds, figures, widgets = build_notebook(path, out_dir)
        built[path.stem] = {
            "title": title,
            "seconds": round(seconds, 1),
            "figures": figures,
            "widgets": widgets,
        }
        print(f"{path.name:45s} {seconds:6.1f} s  {figures} figures, {widgets} widgets", flush=True)
    glossary = markdown2html_mistune(GLOSSARY.read_text(encoding="utf-8"))
    (out_dir / "glossary.html").write_text(_page("Glossary", glossary), encoding="utf-8")
    rows = "\n".join(
        f'<tr><td><a href="{stem}.html">{html.escape(str(info["title"]))}</a></td>'
        f"<td>{info['seconds']} s</td></tr>"
        for stem, info in built.items()
    )
    index = (
        "<h1>DistIR Workbench: a course on parallelism</h1>\n"
        "<p>The tutorial notebooks, executed, with their outputs. Each page works offline. "
        'Terms are defined in the <a href="glossary.html">glossary</a>.</p>\n'
        f"<table>\n<tr><th>notebook</th><th>run time</th></tr>\n{rows}\n</table>"
    )
    (out_dir / "index.html").write_text(_page("DistIR Workbench course", index), encoding="utf-8")
    (out_dir / "course.json").write_text(json.dumps(built, indent=1) + "\n", encoding="utf-8")
    return built


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: notebooks/*.ipynb")
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "course")
    args = parser.parse_args(argv)
    notebooks = args.notebooks or sorted(NOTEBOOKS.glob("*.ipynb"))
    build([p.resolve() for p in notebooks], args.out)
    print(f"wrote {args.out / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
