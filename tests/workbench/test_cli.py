"""The command line a user meets first: its name, version, help and errors."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from workbench import __version__
from workbench.__main__ import main, parser, program_name

ROOT = Path(__file__).resolve().parents[2]


def test_the_help_names_the_program_as_it_was_run_in_plain_words(capsys) -> None:
    assert program_name("/usr/local/bin/distir-workbench") == "distir-workbench"
    assert program_name(str(ROOT / "workbench" / "__main__.py")) == "python -m workbench"
    with pytest.raises(SystemExit):
        main(["--help"], prog="distir-workbench")
    out = capsys.readouterr().out
    assert out.startswith("usage: distir-workbench ")
    assert "``" not in out and "`" not in out  # plain text, no reStructuredText quotes
    assert "built-in example" in out and "report" in out


def test_version() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "workbench", "--version"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert run.stdout.strip() == f"python -m workbench {__version__}"
    assert re.fullmatch(r"\d+\.\d+\.\d+", __version__)
    assert 'version = { attr = "workbench.__version__" }' in (ROOT / "pyproject.toml").read_text()


def test_report_defaults_are_the_built_in_example() -> None:
    from workbench.example import EXAMPLE

    args = parser().parse_args(["report"])
    assert (args.layers, args.hidden, args.heads, args.vocab) == (
        EXAMPLE.layers,
        EXAMPLE.hidden,
        EXAMPLE.heads,
        EXAMPLE.vocab,
    )
    assert args.optimizer == "adam" and args.devices == EXAMPLE.devices


def test_a_strategy_needing_more_devices_says_how_many(tmp_path, capsys) -> None:
    out = tmp_path / "report.html"
    code = main(["report", "--quiet", "--no-search", "--strategy", "dp=16", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 1 and not out.exists()
    assert "needs dp x cp x hp x pp = 16 devices" in err and "has 8" in err
    assert "--devices 16" in err  # what to do instead
    assert "lives on device" not in err  # not the transform's first failure deep inside
