"""Give the tutorials' exercises to the reader blank, their solutions hidden.

    python scripts/blank_exercises.py            # every notebook in notebooks/
    python scripts/blank_exercises.py NB.ipynb   # some

Each answer cell (tagged ``exercise-answer``) keeps its reference solution in its metadata
(``workbench.exercises.SOLUTION_KEY``) and shows the reader a blank made from it
(:func:`workbench.exercises.blank_answer`). A cell that has its solution already is left as
it is, so the script can run again after a notebook gains an exercise. CI runs the
solutions (``notebooks/conftest.py`` for nbval, ``scripts/build_course.py`` for the course).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workbench.exercises import SOLUTION_KEY, blank_answer  # noqa: E402


def blank_notebook(path: Path) -> int:
    """Blank the answers of one notebook in place; the number of cells changed."""
    nb = nbformat.read(path, as_version=4)
    changed = 0
    for i, cell in enumerate(nb.cells):
        tags = cell.get("metadata", {}).get("tags", [])
        if "exercise-answer" not in tags or SOLUTION_KEY in cell.metadata:
            continue
        check = nb.cells[i + 1].source if i + 1 < len(nb.cells) else ""
        cell.metadata[SOLUTION_KEY] = cell.source
        cell.source = blank_answer(cell.source, check)
        changed += 1
    if changed:
        nbformat.write(nb, path)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path)
    args = parser.parse_args(argv)
    for path in args.notebooks or sorted((ROOT / "notebooks").glob("*.ipynb")):
        print(f"{path.name}: {blank_notebook(path)} answer cells blanked")
    return 0


if __name__ == "__main__":
    sys.exit(main())
