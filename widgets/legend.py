"""The legend of the graph view: device colours and drawing styles, as HTML
shared by the widget and the static exports."""

from __future__ import annotations

import html
from dataclasses import dataclass

from ir.types import DeviceRef

from .palette import COMMUNICATION_BORDER


@dataclass(frozen=True)
class LegendEntry:
    """One legend line: a device colour, or a drawing style (``kind='style'``)."""

    label: str
    color: str
    kind: str = "device"
    device: DeviceRef = None


def legend_html(legend: tuple[LegendEntry, ...]) -> str:
    """The legend as a small HTML block (the widget and static exports share it)."""
    items = []
    for e in legend:
        border = f"3px double {COMMUNICATION_BORDER}" if e.kind == "comm" else "1px solid #666"
        if e.kind == "cluster":
            border = "1px dashed #888"
        swatch = (
            f'<span style="display:inline-block;width:12px;height:12px;margin-right:4px;'
            f'vertical-align:middle;background:{e.color};border:{border}"></span>'
        )
        items.append(
            f'<span class="distir-legend-item" data-color="{e.color}" '
            'style="margin-right:12px;white-space:nowrap;display:inline-block">'  # not broken
            f"{swatch}{html.escape(e.label)}</span>"
        )
    return (
        '<div class="distir-legend" style="font:12px sans-serif;margin:4px 0">'
        + "".join(items)
        + "</div>"
    )
