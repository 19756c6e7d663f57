"""A search's table: one row per strategy, the Pareto front, CSV out and back in."""

from __future__ import annotations

import csv
import math
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path

from .space import SearchError, Strategy

STATUSES = ("ok", "over capacity", "pruned", "estimated", "error", "cancelled")


@dataclass(frozen=True)
class Row:
    """One strategy's outcome. Times in seconds, memory in bytes; NaN where not simulated.

    ``status``: ``"ok"`` (simulated, fits), ``"over capacity"`` (simulated, a device's
    peak exceeds its memory), ``"pruned"`` (not built; ``error`` says why),
    ``"estimated"`` (not simulated: its estimate cannot reach the front, ``error`` says
    why; see :mod:`ir.search.tiers`), ``"error"`` (the transform refused it; ``error`` is
    its message) or ``"cancelled"`` (the search was interrupted before it ran).
    ``estimated_step_time_s`` and ``estimated_peak_memory_bytes``: the closed-form
    estimate (:mod:`ir.search.estimate`) beside the simulated figures, NaN where none.
    ``exposed_comm_s``: mean over devices of the time communication runs while the
    device computes nothing; ``bubble``: mean fraction of the step a device neither
    computes nor communicates; ``mfu``: the sequential step's FLOPs over the step time
    and the devices' matrix peak for the model's dtype.
    """

    strategy: Strategy
    status: str
    step_time_s: float = math.nan
    samples_per_s: float = math.nan
    tokens_per_s: float = math.nan
    mfu: float = math.nan
    peak_memory_bytes: float = math.nan
    exposed_comm_s: float = math.nan
    bubble: float = math.nan
    error: str | None = None
    estimated_step_time_s: float = math.nan
    estimated_peak_memory_bytes: float = math.nan

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def as_record(self) -> dict:
        record = self.strategy.as_record()
        record["strategy"] = str(self.strategy)
        for f in fields(self):
            if f.name != "strategy":
                record[f.name] = getattr(self, f.name)
        return record


_STRATEGY_FIELDS = [f for f in fields(Strategy)]
_ROW_FIELDS = [f for f in fields(Row) if f.name != "strategy"]
_LATER_FIELDS = {"ep": "1", "cp": "1"}  # strategy fields a result may lack: their defaults


class SearchResult:
    """The rows of a search, in the order the space listed them."""

    def __init__(self, rows: Sequence[Row]) -> None:
        self.rows: list[Row] = list(rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __repr__(self) -> str:
        counts = {s: sum(r.status == s for r in self.rows) for s in STATUSES}
        shown = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
        return f"<SearchResult {len(self.rows)} strategies: {shown}>"

    def simulated(self) -> list[Row]:
        """The rows that fit, fastest first."""
        return sorted((r for r in self.rows if r.ok), key=lambda r: r.step_time_s)

    def best(self) -> Row:
        """The fastest strategy that fits."""
        found = self.simulated()
        if not found:
            raise SearchError("no strategy of the search fits the devices")
        return found[0]

    def pareto(self) -> list[Row]:
        """The rows that fit and that no other such row beats in both step time and peak
        memory (ties kept once), fastest first."""
        front: list[Row] = []
        for r in self.simulated():
            if not front or r.peak_memory_bytes < front[-1].peak_memory_bytes:
                front.append(r)
        return front

    def table(self, rows: Sequence[Row] | None = None) -> str:
        """Markdown: strategy, step ms, samples/s, MFU, peak GiB, exposed comm ms, bubble."""
        lines = [
            "| strategy | status | step ms | samples/s | MFU | peak GiB | exposed comm ms | "
            "bubble |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
        for r in self.rows if rows is None else rows:
            if math.isnan(r.step_time_s):
                lines.append(f"| {r.strategy} | {r.status} |  |  |  |  |  |  |")
                continue
            lines.append(
                f"| {r.strategy} | {r.status} | {r.step_time_s * 1e3:.2f} | "
                f"{r.samples_per_s:.1f} | {r.mfu:.1%} | {r.peak_memory_bytes / 2**30:.2f} | "
                f"{r.exposed_comm_s * 1e3:.2f} | {r.bubble:.1%} |"
            )
        return "\n".join(lines)

    # -- CSV ----------------------------------------------------------------------------

    def to_csv(self, path: str | os.PathLike) -> Path:
        """Write the rows as CSV (one column per strategy field and figure), atomically."""
        path = Path(path)
        columns = ["strategy", *[f.name for f in _STRATEGY_FIELDS], *[f.name for f in _ROW_FIELDS]]
        fd, tmp = tempfile.mkstemp(dir=path.parent or ".", prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", newline="") as out:
                writer = csv.DictWriter(out, columns)
                writer.writeheader()
                for r in self.rows:
                    record = r.as_record()
                    record["error"] = record["error"] or ""
                    writer.writerow(record)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    @staticmethod
    def from_csv(path: str | os.PathLike) -> SearchResult:
        """The result :meth:`to_csv` wrote; a file that is not one raises SearchError
        naming the line and column."""
        path = Path(path)
        try:
            with open(path, newline="") as f:
                reader = csv.DictReader(f)
                need = {f.name for f in _STRATEGY_FIELDS} | {
                    f.name for f in _ROW_FIELDS if not f.name.startswith("estimated_")
                }  # files written before the estimates were kept lack those columns
                need -= set(_LATER_FIELDS)  # nor those written before ep and cp existed
                missing = need - set(reader.fieldnames or ())
                if missing:
                    raise SearchError(
                        f"{path}: not a search result (no column(s) {sorted(missing)})"
                    )
                rows = [_row(record, path, i) for i, record in enumerate(reader, start=2)]
        except (OSError, UnicodeDecodeError, csv.Error) as e:
            raise SearchError(f"cannot read search result {path}: {e}") from None
        return SearchResult(rows)


def _row(record: dict, path: Path, line: int) -> Row:
    def value(field, text: str):
        try:
            if field.type in ("int", int):
                return int(text)
            if field.type in ("bool", bool):
                if text not in ("True", "False"):
                    raise ValueError(text)
                return text == "True"
            if field.type in ("float", float):
                return float(text)
            return text
        except ValueError:
            raise SearchError(
                f"{path}, line {line}, column {field.name!r}: {text!r} is not a {field.type}"
            ) from None

    strategy = Strategy(
        **{
            f.name: value(f, record.get(f.name) or _LATER_FIELDS.get(f.name, ""))
            for f in _STRATEGY_FIELDS
        }
    )
    figures = {
        f.name: (record[f.name] or None) if f.name == "error" else value(f, record[f.name])
        for f in _ROW_FIELDS
        if f.name in record
    }
    if figures["status"] not in STATUSES:
        raise SearchError(
            f"{path}, line {line}, column 'status': {figures['status']!r} is not one of {STATUSES}"
        )
    return Row(strategy, **figures)


__all__ = ["STATUSES", "Row", "SearchResult"]
