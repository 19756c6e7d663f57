"""Chrome-trace (Trace Event Format) export, read by chrome://tracing and ui.perfetto.dev.

One process per device (``pid`` = device id), one thread per stream: ``tid`` 0
compute, then one per communication channel the device uses (``tid`` 1, 2, ...
in order of first use; with ``comm="serial"`` the one stream, ``tid`` 1), so
that transfers which overlap in time sit on separate tracks; complete events
(``ph: "X"``) with microsecond timestamps, and a counter track (``ph: "C"``) of
live memory per device.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..verify import describe_op

if TYPE_CHECKING:
    from ..op import Op
    from .result import SimResult

_US = 1e6


def chrome_trace(result: SimResult) -> dict[str, Any]:
    """``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}``."""
    events: list[dict[str, Any]] = []
    for device in result.devices:
        kind = result.topology.device(device).device_type
        events.append(_meta("process_name", device, 0, {"name": f"device {device} ({kind})"}))
        events.append(_meta("process_sort_index", device, 0, {"sort_index": device}))
        events.append(_meta("thread_name", device, 0, {"name": "compute"}))
    tids: dict[tuple[int, str], int] = {}
    labels: dict[Op, str] = {}  # an op's events share its printed line
    for ev in result.events:
        label = labels.get(ev.op)
        if label is None:
            label = labels[ev.op] = describe_op(ev.op)
        tid = 0
        if ev.stream != "compute":
            tid = tids.get((ev.device, ev.channel), 0)
            if not tid:
                tid = tids[(ev.device, ev.channel)] = 1 + sum(d == ev.device for d, _ in tids)
                name = ev.channel if ev.channel == "communication" else f"comm {ev.channel}"
                events.append(_meta("thread_name", ev.device, tid, {"name": name}))
        events.append(
            {
                "name": ev.op.op_type,
                "cat": ev.kind,
                "ph": "X",
                "pid": ev.device,
                "tid": tid,
                "ts": ev.start_s * _US,
                "dur": ev.dur_s * _US,
                "args": {"op": label, "flops": ev.flops, "bytes": ev.bytes},
            }
        )
    for device in result.devices:
        times, live = result.memory_timeline(device)
        for t, b in zip(times.tolist(), live.tolist()):
            events.append(
                {
                    "name": "memory",
                    "ph": "C",
                    "pid": device,
                    "tid": 0,
                    "ts": t * _US,
                    "args": {"live_bytes": b},
                }
            )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "topology": result.topology.name,
            "step_time_s": result.step_time_s,
            "peak_memory_bytes": {str(d): b for d, b in result.peak_memory_bytes.items()},
        },
    }


def _meta(name: str, pid: int, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": args}
