"""A PyTorch profiler trace of a real step, read into the measured-against-simulated view.

``torch.profiler`` writes a Chrome trace (Kineto's JSON: ``{"traceEvents": [...]}``, times
in microseconds). A step of a DistIR program run by PyTorch marks each op it runs with a
``record_function`` range named ``distir op <index> <op type>`` (:data:`LABEL`), the index
into the program whose op it is: :func:`profile_step` runs a program's ops with the torch
kernels of ``ir.backends.torch_kernels`` under the profiler that way, and any script that
runs the program can mark its ops the same. :func:`read_trace` reads such traces (one file
per rank) back as a :class:`ir.backends.measurement.Measurement`, one step per pass over
the program, which :func:`widgets.measured.measured_vs_simulated_figure` draws over the
simulator's timeline with the error per device and per op.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import DistIRError
from ..function import Function
from ..registry import OpKind, get_op

__all__ = ["LABEL", "TraceError", "label", "profile_step", "read_trace"]

LABEL = "distir op {index} {op_type}"
_LABEL = re.compile(r"^distir op (\d+) (\S+)$")


class TraceError(DistIRError):
    """A trace that cannot be read as steps of the program; the message says why."""


def label(index: int, op_type: str) -> str:
    """The ``record_function`` name of op ``index`` (``distir op 12 MatMul``)."""
    return LABEL.format(index=index, op_type=op_type)


def profile_step(
    function: Function,
    inputs: Sequence[Any],
    path: str | os.PathLike[str],
    *,
    steps: int = 1,
) -> Path:
    """Run ``function`` (a program on one device, no communication) ``steps`` times with
    torch's CPU kernels under ``torch.profiler``, each op in its :func:`label` range, and
    write the Chrome trace to ``path``. Returns the path."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    from .torch_kernels import TORCH_KERNELS, check_kernels

    if len(function.devices) > 1 or any(
        get_op(op.op_type).kind is OpKind.COMMUNICATION for op in function.ops
    ):
        raise TraceError(
            f"profile_step runs a program on one device; {function.name!r} uses "
            f"{len(function.devices)} devices: profile each rank's program where it runs"
        )
    check_kernels(function.ops, "profile_step")
    args = [torch.from_numpy(np.array(x, copy=True)) for x in inputs]
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            env = dict(zip(function.inputs, args))
            for index, op in enumerate(function.ops):
                xs = [env[v] for v in op.inputs]
                with record_function(label(index, op.op_type)):
                    results = TORCH_KERNELS[op.op_type](xs, op.attributes)
                env.update(zip(op.outputs, results))
            carried = [env[v] for v in function.outputs]
            del carried
    path = Path(path)
    prof.export_chrome_trace(str(path))
    return path


def read_trace(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    function: Function | None = None,
    *,
    programs: Mapping[int, Function] | None = None,
) -> Any:
    """The steps a profiler trace (or one trace per rank, in rank order) recorded, as a
    ``Measurement``: the ops of ``function`` (a program every rank ran) or of
    ``programs[rank]`` (ranked programs), found by their :func:`label` ranges. A rank's
    ranges split into steps where an op index comes again. A trace's own rank
    (``distributedInfo.rank``, written when torch.distributed ran) wins over its place
    in the list."""
    from .measurement import Measurement

    if (function is None) == (programs is None):
        raise TraceError("read_trace: give the program (function=) or each rank's (programs=)")
    files = [paths] if isinstance(paths, str | os.PathLike) else list(paths)
    records: dict[int, list] = {}
    for place, path in enumerate(files):
        trace = _load(path)
        rank = int((trace.get("distributedInfo") or {}).get("rank", place))
        ops = function.ops if function is not None else programs[rank].ops  # type: ignore[index]
        records[rank] = _steps(_ranges(trace, path, ops), path)
        short = [len(ops) - len(step) for _, step in records[rank] if len(step) < len(ops)]
        if short:
            raise TraceError(
                f"{path}: {len(short)} of its {len(records[rank])} steps lack op ranges (up "
                f"to {max(short)} of the program's {len(ops)} ops): the trace is of another "
                "program, or of part of a step"
            )
    if programs is not None:
        return Measurement.from_rank_records(
            programs, {r: [(o, t, ()) for o, t in s] for r, s in records.items()}
        )
    steps = {len(s) for s in records.values()}
    if len(steps) != 1:
        raise TraceError(f"the traces hold different numbers of steps: {sorted(steps)}")
    return Measurement.from_records(function, records)  # type: ignore[arg-type]


def _load(path: str | os.PathLike[str]) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise TraceError(f"cannot read the trace {path}: {e.strerror or e}") from None
    except ValueError as e:
        raise TraceError(f"{path} is not JSON (a Chrome trace): {e}") from None
    if isinstance(data, list):  # the array form of the trace event format
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise TraceError(f"{path} has no traceEvents: is it a torch.profiler Chrome trace?")
    return data


def _ranges(trace: dict[str, Any], path: Any, ops: Sequence[Any]) -> list[tuple[int, float, float]]:
    """(op index, start s, end s) of every op range, in time order; a range whose op
    index or type is not the program's raises TraceError."""
    count = len(ops)
    found = []
    for event in trace["traceEvents"]:
        if not isinstance(event, dict) or event.get("ph") != "X":
            continue
        match = _LABEL.match(str(event.get("name", "")))
        if match is None:
            continue
        index = int(match.group(1))
        if index >= count:
            raise TraceError(
                f"{path}: the range {event['name']!r} names op {index}, but the program has "
                f"{count} ops: the trace is of another program"
            )
        if match.group(2) != ops[index].op_type:
            raise TraceError(
                f"{path}: the range {event['name']!r} is a {match.group(2)}, but op {index} "
                f"of the program is a {ops[index].op_type}: the trace is of another program"
            )
        start = float(event["ts"]) * 1e-6
        found.append((index, start, start + float(event.get("dur", 0.0)) * 1e-6))
    if not found:
        raise TraceError(
            f"{path} has no '{LABEL}' ranges: profile the step with "
            "ir.backends.traces.profile_step, or wrap each op in torch.profiler.record_function"
            "(ir.backends.traces.label(index, op_type))"
        )
    return sorted(found, key=lambda r: r[1])


def _steps(ranges: list[tuple[int, float, float]], path: Any) -> list[tuple[float, list]]:
    """Split one rank's ranges into steps: a new step where an op index comes again."""
    steps: list[tuple[float, list]] = []
    seen: set[int] = set()
    for index, start, end in ranges:
        if not steps or index in seen:
            steps.append((start, []))
            seen = set()
        seen.add(index)
        steps[-1][1].append((index, start, end))
    return steps
