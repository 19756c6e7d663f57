"""The static report: summary first, the search's Pareto front, one legend per chart,
logical graphs of the strategies, and a page no wider than the browser's window."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

import ir
from ir import models, transforms
from widgets import compare_figure
from workbench.__main__ import main
from workbench.report import ReportConfig, build_model, write_report

CHROMIUM = Path("/usr/bin/chromium")


def _headings(page: str) -> list[str]:
    return re.findall(r"<h2>(.*?)</h2>", page)


@pytest.fixture(scope="module")
def mlp_report(tmp_path_factory) -> str:
    config = ReportConfig(model="mlp", devices=4, strategies=("dp=2", "dp=4", "hp=2"))
    path = tmp_path_factory.mktemp("report") / "r.html"
    return write_report(path, build_model(config), config).read_text()


def test_the_summary_table_comes_first_then_the_search(mlp_report: str) -> None:
    headings = _headings(mlp_report)
    assert headings[0] == "Summary"
    assert headings[1].startswith("Strategy search")
    first_table = mlp_report.index("<table")
    assert first_table < mlp_report.index("Plotly.newPlot") and first_table < mlp_report.index(
        "<svg"
    )
    summary = mlp_report[first_table : mlp_report.index("</table>")]
    assert [s in summary for s in ("dp=2", "dp=4", "hp=2")] == [True] * 3
    assert summary.count("(fastest)") == 1


def test_the_search_section_lists_the_pareto_front_of_a_search(mlp_report: str) -> None:
    config = ReportConfig(model="mlp", devices=4)
    found = ir.search.search(
        build_model(config), ir.Topology.preset("a100-hgx", 4), optimizer=None, progress=False
    )
    table = re.search(r"<table border='1' class='distir-pareto'>(.*?)</table>", mlp_report)
    assert table is not None
    listed = re.findall(r"<tr><td>([^<]+)</td>", table.group(1))
    assert listed == [str(r.strategy) for r in found.pareto()] and listed


def test_strategy_programs_are_drawn_one_node_per_logical_op(mlp_report: str) -> None:
    # dp=2 and dp=4 are the same logical program: the same drawing, whatever the devices
    sections = re.split(r"<h2>", mlp_report)
    programs = {s.split("<")[0]: s for s in sections if ": program (one node" in s}
    nodes = {k.split(":")[0]: v.count('class="node"') for k, v in programs.items()}
    assert set(nodes) == {"dp=2", "dp=4", "hp=2"}
    assert nodes["dp=2"] == nodes["dp=4"] > 3


def test_no_search_leaves_the_section_out(tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    argv = ["report", "--model", "mlp", "--devices", "2", "--strategy", "dp=2", "--quiet"]
    assert main([*argv, "--no-search", "--out", str(out)]) == 0
    headings = _headings(out.read_text())
    assert headings[0] == "Summary"
    assert not any(h.startswith("Strategy search") for h in headings)


def test_the_comparison_chart_has_one_legend_the_gantt_kinds() -> None:
    f = transforms.training(models.mlp(8, 4, 8, 4, layers=2))
    topology = ir.Topology.preset("a100-hgx", 4)
    a = ir.simulate(transforms.data_parallel(f, 4), topology)
    b = ir.simulate(transforms.pipeline_parallel(f, 2, 2), topology)
    fig = compare_figure(a, b, labels=("A", "B"))
    listed = [t.name for t in fig.data if t.showlegend is not False and t.name]
    # each device's colour, communication and idle; memory curves (one per device and
    # strategy) are named on hover, not in the legend
    devices = [f"device {d}" for d in sorted(set(a.devices) | set(b.devices))]
    assert listed == [*devices, "communication", "idle (bubble, waiting)"], listed
    curves = [t for t in fig.data if t.type == "scatter" and t.meta["kind"] == "live"]
    assert len(curves) == len(a.devices) + len(b.devices)


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium")
@pytest.mark.timeout(300)
def test_the_default_report_is_no_wider_than_the_window(tmp_path: Path) -> None:
    """The default GPT report, whose graphs are thousands of points wide, in Chromium."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="needs playwright for Python")
    out = tmp_path / "report.html"
    assert main(["report", "--quiet", "--out", str(out)]) == 0
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=str(CHROMIUM), args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            outside: list[str] = []
            page.on(
                "request",
                lambda r: r.url.startswith(("file:", "data:", "blob:")) or outside.append(r.url),
            )
            page.goto(out.as_uri())
            page.locator(".js-plotly-plot .main-svg").first.wait_for(timeout=60_000)
            widths = page.evaluate(
                "() => [document.documentElement.scrollWidth, "
                "...[...document.querySelectorAll('.distir-graph-box')]"
                ".map(s => s.getBoundingClientRect().width)]"
            )
            assert widths[0] <= 1280, f"the page is {widths[0]} px wide"
            assert len(widths) >= 4 and max(widths[1:]) <= 1280
            natural = page.evaluate(
                "() => Math.max(...[...document.querySelectorAll('.distir-graph-box svg')]"
                ".map(s => s.width.baseVal.value))"
            )
            assert natural > 1280  # the graphs are wider than the page: they scroll in a box
            # drawn at natural size, the text is readable (it was 5-6 px fitted to the page)
            heights = page.evaluate(
                "() => [...document.querySelectorAll('.distir-graph-box svg text')]"
                ".slice(0, 50).map(t => t.getBoundingClientRect().height)"
            )
            assert heights and min(h for h in heights if h > 0) >= 8, heights
            box = page.locator(".distir-graph-box").first
            box.click()  # fitted to the page's width: an overview
            assert "distir-fit" in (box.get_attribute("class") or "")
            assert page.evaluate("document.documentElement.scrollWidth") <= 1280
            assert not outside, f"the report fetched {outside[:3]}"
        finally:
            browser.close()


def test_measure_adds_the_measured_section_for_the_strategies_that_fit(tmp_path: Path) -> None:
    """--measure (off by default) runs each strategy over at most 4 devices on gloo
    processes (2 here) and shows it over the simulated timeline; the others say why not."""
    from workbench.__main__ import parser

    assert parser().parse_args(["report"]).measure is False
    assert parser().parse_args(["report", "--measure"]).measure is True
    pytest.importorskip("torch.distributed", reason="torch is not installed (pip install torch)")
    config = ReportConfig(
        model="mlp",
        batch=8,
        features=16,
        hidden=16,
        classes=4,
        layers=2,
        strategies=("dp=2", "dp=8"),
        search=False,
        measure=True,
    )
    cpu = ir.Topology.preset("cpu", 4)
    page = write_report(
        tmp_path / "r.html", build_model(config), config, measure_topology=cpu
    ).read_text()
    headings = _headings(page)
    section = headings.index("Measured on this machine against simulated")
    assert headings[section + 1] == "dp=2: measured 3 steps against simulated"
    assert "dp=8: " in page and "it uses 8 devices" in page
    assert page.count("class='distir-measured-errors'") == 1
    assert page.count("live bytes per device, measured (solid) and simulated (dashed)") == 1
    assert "Load average when measured" in page
    plain = replace(config, measure=False)
    page = write_report(tmp_path / "p.html", build_model(plain), plain).read_text()
    assert "Measured on this machine" not in page
