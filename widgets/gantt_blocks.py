"""The Gantt's middle level of detail: a device's consecutive ops of one task drawn as
one block.

A training step's Gantt has thousands of bars (4,600 for the example's 3D strategy); a
browser takes half a second and more to draw them, and at the width of a window they are
slivers. Above :data:`BLOCKS_ABOVE_EVENTS` compute events (in the time window shown),
each run of consecutive ops with the same phase and microbatch (``F3``, ``B3``, the
optimizer's update) that follow each other without a visible gap (under a pixel) becomes
one bar: the blocks of the 1F1B picture. Its hover says what it holds (ops, time, flops,
the op types that take the most time); zooming in to a window of fewer events draws each
op again (:class:`widgets.gantt_zoom.GanttZoom`).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from .units import format_time

# compute events (all devices) above which ops merge into blocks: what a browser draws in
# well under a tenth of a second (benchmarks/bench_click_to_painted.py)
BLOCKS_ABOVE_EVENTS = 600
_PHASE_NAME = {"F": "forward", "B": "backward", "U": "optimizer update", "": "work"}


def merge_blocks(
    numbers: np.ndarray,
    ids: np.ndarray,
    labels: np.ndarray,
    phases: np.ndarray,
    op_types: np.ndarray,
    gap_s: float,
    what: str = "",
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """One device's compute bars (rows of ``numbers``: start, duration, flops, bytes,
    device) merged into blocks: consecutive bars with the same phase and label, each
    starting within ``gap_s`` of the last one's end (``what`` names the blocks in their
    hover text; default: by phase and microbatch).

    Returns the blocks' numbers (start, span, summed flops and bytes, device), their op
    ids (the first op's: a click selects it), hover texts, labels and phases.

    >>> n = np.array([[0, 1, 2, 0, 0], [1, 1, 2, 0, 0], [5, 1, 2, 0, 0]], dtype=float)
    >>> s = np.array(["F", "F", "F"], dtype=object)
    >>> blocks = merge_blocks(n, np.array(["op-0", "op-1", "op-2"], dtype=object),
    ...     np.array(["F0", "F0", "F0"], dtype=object), s, np.array(["MatMul"] * 3, object), 1e-9)
    >>> blocks[0][:, :3].tolist(), blocks[1].tolist()
    ([[0.0, 2.0, 4.0], [5.0, 1.0, 2.0]], ['op-0', 'op-2'])
    """
    if len(numbers) == 0:  # a device with no transfers (data parallel forward): no blocks
        empty = np.zeros(0, dtype=object)
        return np.zeros((0, 5)), ids[:0], empty, labels[:0], phases[:0]
    order = np.argsort(numbers[:, 0], kind="stable")
    numbers, ids, labels = numbers[order], ids[order], labels[order]
    phases, op_types = phases[order], op_types[order]
    end = numbers[:, 0] + numbers[:, 1]
    new = np.ones(len(numbers), dtype=bool)
    if len(numbers) > 1:
        apart = numbers[1:, 0] > end[:-1] + gap_s
        other = (labels[1:] != labels[:-1]) | (phases[1:] != phases[:-1])
        new[1:] = apart | other
    first = np.flatnonzero(new)
    last = np.r_[first[1:] - 1, len(numbers) - 1]
    blocks = np.column_stack(
        [
            numbers[first, 0],
            end[last] - numbers[first, 0],
            np.add.reduceat(numbers[:, 2], first) if len(first) else np.zeros(0),
            np.add.reduceat(numbers[:, 3], first) if len(first) else np.zeros(0),
            numbers[first, 4],
        ]
    ).reshape(-1, 5)
    texts = np.array(
        [
            _block_text(
                labels[a], phases[a], op_types[a : b + 1], numbers[a : b + 1, 1], span, what
            )
            for a, b, span in zip(first.tolist(), last.tolist(), blocks[:, 1].tolist())
        ],
        dtype=object,
    )
    return blocks, ids[first], texts, labels[first], phases[first]


def _block_text(
    label: str, phase: str, op_types: np.ndarray, dur_s: np.ndarray, span_s: float, what: str
) -> str:
    what = what or _PHASE_NAME.get(phase, "work")
    if label:
        what += f" of microbatch {label[1:]}"
    by_time: Counter[str] = Counter()
    for op_type, d in zip(op_types.tolist(), dur_s.tolist()):
        by_time[op_type] += d
    busy = float(dur_s.sum())
    top = ", ".join(f"{t} {s / busy:.0%}" for t, s in by_time.most_common(3) if busy > 0)
    return (
        f"<b>{what}: {len(op_types)} ops</b> in {format_time(span_s)}<br>{top}"
        "<br>(zoom in to see each op)"
    )


__all__ = ["BLOCKS_ABOVE_EVENTS", "merge_blocks"]
