"""Every Python example in the README runs (in order, sharing one namespace)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_examples_run(capsys, tmp_path, monkeypatch):
    # the examples write files (a search's CSV, a report): into a scratch folder, never
    # into the checkout
    monkeypatch.chdir(tmp_path)
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) >= 4
    namespace: dict = {}
    for i, block in enumerate(blocks):
        try:
            exec(compile(block, f"README.md python block {i + 1}", "exec"), namespace)
        except Exception as e:  # say which block failed
            raise AssertionError(f"README python block {i + 1} failed: {e!r}\n{block}") from e
    capsys.readouterr()
    assert not (README.parent / "search.csv").exists()
