"""The import layering of DESIGN.md: ir <- widgets <- workbench, and inside ir
core <- execute, sharding, transforms, models <- sim <- search."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Level of each top-level package, and of each sub-module of ir; a module may import
# only modules of its own level or lower.
PACKAGE_LEVEL = {"ir": 0, "widgets": 1, "workbench": 2}
IR_LEVEL = {
    "execute": 1,
    "sharding": 1,
    "transforms": 1,
    "models": 1,
    "models_llama": 1,
    "inference": 3,  # serving steps: transforms and sharding, timed by the simulator
    "backends": 2,  # a measurement is shaped like a simulation (ir.sim.result.Event)
    "importers": 1,
    "sim": 2,
    "search": 3,
}  # everything else in ir/ is core, level 0


def _ir_level(parts: list[str]) -> int:
    if len(parts) == 1 or parts[1] == "__init__":
        return 99  # ir/__init__.py is the public facade: it re-exports every layer
    return IR_LEVEL.get(parts[1], 0)


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, absolute dotted module) for every import in the file, lazy ones included."""
    module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    package = module.rsplit(".", 1)[0] if path.name != "__init__.py" else module
    if path.name == "__init__.py":
        package = module.removesuffix(".__init__")
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
                if node.module is None:
                    found += [(node.lineno, f"{target}.{a.name}") for a in node.names]
                    continue
            else:
                target = node.module or ""
            found.append((node.lineno, target))
    return found


def _sources() -> list[Path]:
    return [p for pkg in PACKAGE_LEVEL for p in sorted((ROOT / pkg).rglob("*.py"))]


def test_sources_exist():
    assert any(p.parts[-2] == "ir" for p in _sources())


@pytest.mark.parametrize("path", _sources(), ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_respect_layers(path: Path):
    own = path.relative_to(ROOT).with_suffix("").parts
    for line, target in _imports(path):
        parts = target.split(".")
        if parts[0] not in PACKAGE_LEVEL:
            continue
        where = f"{path.relative_to(ROOT)}:{line} imports {target}"
        assert PACKAGE_LEVEL[parts[0]] <= PACKAGE_LEVEL[own[0]], where
        if parts[0] == own[0] == "ir":
            assert _ir_level(parts) <= _ir_level(list(own)), where
