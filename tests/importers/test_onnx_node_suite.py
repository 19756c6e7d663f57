"""The ``onnx`` package's backend node test cases through ``ir.from_onnx``: each case
imports and executes equal to onnx's reference outputs, or is refused with a project
error; never a wrong result, never another exception (``benchmarks/onnx_node_suite.py``
runs and classifies them).

Every run checks the cases of the 48 core ops (``CORE_OPS``: 519 cases, about 10 s);
``-m slow`` checks every case (1,884 with onnx 1.23) and that the support table in
``docs/importers.md`` is what the suite gives now.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

pytest.importorskip("onnx", reason="the importers extra (onnx) is not installed")

_SPEC = importlib.util.spec_from_file_location(
    "onnx_node_suite", Path(__file__).resolve().parents[2] / "benchmarks" / "onnx_node_suite.py"
)
suite = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = suite  # its dataclasses look their module up while it loads
_SPEC.loader.exec_module(suite)

CASES = {c.name: c for c in suite.node_cases()}
CORE = [name for name, c in CASES.items() if c.op in suite.CORE_OPS]


def _check(name: str) -> suite.Result:
    result = suite.run_case(CASES[name])
    assert result.outcome in ("equal", "refused"), f"{name}: {result.outcome}: {result.detail}"
    return result


@pytest.mark.parametrize("name", CORE)
def test_a_core_op_case_is_equal_or_refused(name: str):
    _check(name)


def test_nine_in_ten_core_ops_are_covered():
    results = [suite.run_case(CASES[name]) for name in CORE]
    covered, missing = suite.core_coverage(results)
    assert len(suite.CORE_OPS) == 48
    assert len(covered) >= 0.9 * len(suite.CORE_OPS), missing
    # the rest: dtypes DistIR lacks (8- and 16-bit integers, 8-bit floats), training modes
    equal = sum(r.outcome == "equal" for r in results)
    assert equal >= 0.75 * len(results), f"only {equal} of {len(results)} core cases equal"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(CASES) - set(CORE)))
def test_every_other_case_is_equal_or_refused(name: str):
    _check(name)


@pytest.mark.slow
def test_the_support_table_in_the_docs_is_the_suites():
    results = suite.run(list(CASES.values()), progress=False)
    text = suite.DOCS.read_text()
    table = text[text.index(suite.BEGIN) : text.index(suite.END) + len(suite.END)]
    assert table == suite.support_table(results), (
        "docs/importers.md's support table is out of date: "
        "python benchmarks/onnx_node_suite.py --write-docs"
    )
