"""How a node of a graph view shows where it runs: compact device ranges (``0–3, 8``)
and a small grid of device-coloured squares, from the shared palette."""

from __future__ import annotations

from ir.types import DeviceRef

from .palette import device_color

MAX_STRIPES = 8  # colour stripes on one node: more are unreadable slivers


def device_ranges(devices: tuple[DeviceRef, ...]) -> str:
    """Devices as compact ranges: ``0–3, 8``; ``?`` for unplaced ones.

    >>> device_ranges((0, 1, 2, 3, 8))
    '0–3, 8'
    """
    ints = sorted({d for d in devices if isinstance(d, int)})
    parts: list[str] = []
    start = prev = None
    for d in [*ints, None]:
        if d is not None and prev is not None and d == prev + 1:
            prev = d
            continue
        if start is not None:
            parts.append(str(start) if start == prev else f"{start}–{prev}")
        start = prev = d
    parts += [
        "?" if d is None else str(d) for d in dict.fromkeys(devices) if not isinstance(d, int)
    ]
    return ", ".join(parts)


def device_glyph(devices: tuple[DeviceRef, ...], per_row: int = 8, most: int = 16) -> str:
    """A small grid of device-coloured squares (graphviz HTML text), one per device, so
    a node shows where it runs without colouring its label; past ``most``, a count.

    >>> device_glyph((0, 1)).count("■")
    2
    """
    shown = list(dict.fromkeys(devices))[:most]
    cells = [f'<FONT COLOR="{device_color(d)}">■</FONT>' for d in shown]
    rows = ["".join(cells[i : i + per_row]) for i in range(0, len(cells), per_row)]
    extra = len(set(devices)) - len(shown)
    if extra > 0:
        rows[-1] += f'<FONT POINT-SIZE="8"> +{extra}</FONT>'
    return "<BR/>".join(rows)
