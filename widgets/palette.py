"""Colours shared by every view, so device 3 has the same colour in the graph,
the Gantt chart and the memory curves."""

from __future__ import annotations

from ir.types import DeviceRef, DeviceVar

# Tableau 20, dark shades first: distinct for the first ten devices, still
# distinguishable up to twenty; ids beyond that wrap around.
DEVICE_PALETTE: tuple[str, ...] = (
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#e15759",
    "#76b7b2",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
    "#a0cbe8",
    "#ffbe7d",
    "#8cd17d",
    "#ff9d9a",
    "#86bcb6",
    "#f1ce63",
    "#d4a6c8",
    "#fabfd2",
    "#d7b5a6",
    "#79706e",
)

UNASSIGNED_COLOR = "#d9d9d9"  # device ``?``: not placed yet
SYMBOLIC_COLOR = "#eeeeee"  # a device variable that could not be resolved
# Communication is near-black in every view: no device colour is that dark, so a
# communication node or bar never reads as "device 3" (it was #e15759, device 3's red).
COMMUNICATION_COLOR = "#262626"
COMMUNICATION_TEXT = "#ffffff"  # text on a communication fill
COMMUNICATION_BORDER = COMMUNICATION_COLOR  # border of communication ops (unrolled view)
COMPUTE_BAR = "#4e79a7"  # only where one bar stands for many devices (the summary bar)
COMMUNICATION_BAR = COMMUNICATION_COLOR
IDLE_BAR = "#e0e0e0"
# Out of memory: a dark red no device has (device 3's is #e15759), always with an X or a
# thick line, and named in the legend or the hover text.
OOM_COLOR = "#8b0000"
# Strategy families (a search's pipeline degrees) are told apart by marker shape, in one
# colour that means "a strategy", never a device's.
STRATEGY_COLOR = "#3f3f5f"
STRATEGY_SYMBOLS: tuple[str, ...] = (
    "circle",
    "square",
    "diamond",
    "triangle-up",
    "star",
    "hexagon",
    "triangle-down",
    "pentagon",
)


def device_color(device: DeviceRef) -> str:
    """The colour of ``device`` in every view (by device id, not by order of use).

    >>> device_color(0), device_color(None)
    ('#4e79a7', '#d9d9d9')
    """
    if device is None:
        return UNASSIGNED_COLOR
    if isinstance(device, DeviceVar):
        return SYMBOLIC_COLOR
    return DEVICE_PALETTE[device % len(DEVICE_PALETTE)]


def device_label(device: DeviceRef) -> str:
    """How the views name a device: ``device 3``, ``device ?``, ``device d.1``."""
    return f"device {'?' if device is None else device}"
