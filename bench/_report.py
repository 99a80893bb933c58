"""Results: medians with their spread, ratios to the baselines, targets, the table."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Row", "Stat", "Target", "format_table", "markdown_table", "percentile"]

# Typographic signs, spelled as escapes (ruff flags them as look-alikes of x and -).
TIMES = "\u00d7"
DASH = "\u2013"

SYSTEM_TITLES = {
    "flightlog": "flightlogd",
    "jsonl": "in-process JSONL",
    "sqlite": "SQLite log",
    "otel": "OpenTelemetry",
    "unrecorded": "unrecorded",
}


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by linear interpolation; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


@dataclass
class Stat:
    """One metric over several runs: the median and the range."""

    runs: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.runs)

    @property
    def low(self) -> float:
        return min(self.runs)

    @property
    def high(self) -> float:
        return max(self.runs)

    def to_json(self) -> dict[str, Any]:
        return {"median": self.median, "min": self.low, "max": self.high, "runs": self.runs}


@dataclass(frozen=True)
class Target:
    """``flightlog / baseline  op  bound`` (a ratio), or ``flightlog  op  bound`` when
    ``baseline`` is None (an absolute value in the row's unit)."""

    op: str
    bound: float
    baseline: str | None = None

    def check(self, row: Row) -> bool | None:
        value = row.ratio(self.baseline) if self.baseline else row.median("flightlog")
        if value is None:
            return None
        return {"<": value < self.bound, "<=": value <= self.bound, ">=": value >= self.bound}[
            self.op
        ]

    def text(self, unit: str) -> str:
        if self.baseline:
            return f"{self.op} {self.bound:g}{TIMES} {SYSTEM_TITLES[self.baseline]}"
        return f"{self.op} {self.bound:g} {unit}"


@dataclass
class Row:
    """One line of the table: a metric of one scenario, for every system measured."""

    key: str
    scenario: str
    metric: str
    unit: str
    fmt: str = "{:,.1f}"
    values: dict[str, Stat] = field(default_factory=dict)
    targets: list[Target] = field(default_factory=list)
    note: str = ""

    def add(self, system: str, value: float) -> None:
        self.values.setdefault(system, Stat([])).runs.append(value)

    def median(self, system: str) -> float | None:
        stat = self.values.get(system)
        return stat.median if stat and stat.runs else None

    def ratio(self, baseline: str | None) -> float | None:
        mine, theirs = self.median("flightlog"), self.median(baseline or "")
        if mine is None or not theirs:
            return None
        return mine / theirs

    def met(self) -> bool | None:
        checks = [target.check(self) for target in self.targets]
        if not checks or any(check is None for check in checks):
            return None
        return all(checks)

    def cell(self, system: str) -> str:
        stat = self.values.get(system)
        if not stat or not stat.runs:
            return "—"
        f = self.fmt.format
        if len(stat.runs) == 1:
            return f(stat.median)
        return f"{f(stat.median)} ({f(stat.low)}{DASH}{f(stat.high)})"

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "scenario": self.scenario,
            "metric": self.metric,
            "unit": self.unit,
            "values": {system: stat.to_json() for system, stat in self.values.items()},
            "ratio_jsonl": self.ratio("jsonl"),
            "ratio_sqlite": self.ratio("sqlite"),
            "targets": [target.text(self.unit) for target in self.targets],
            "met": self.met(),
            "note": self.note,
        }


def _ratio_cell(value: float | None) -> str:
    if value is None:
        return "—"
    if value >= 100:
        return f"{value:,.0f}{TIMES}"
    if value >= 10:
        return f"{value:.1f}{TIMES}"
    if value >= 0.1:
        return f"{value:.2f}{TIMES}"
    return f"{value:.2g}{TIMES}"


def format_table(rows: Sequence[Row]) -> str:
    """The results as one Markdown table: median (min to max) per system, ratios, targets."""
    header = [
        "#",
        "scenario",
        "metric",
        SYSTEM_TITLES["flightlog"],
        SYSTEM_TITLES["jsonl"],
        SYSTEM_TITLES["sqlite"],
        "fl / JSONL",
        "fl / SQLite",
        "target",
        "met",
    ]
    lines = [header]
    for row in rows:
        met = row.met()
        lines.append(
            [
                row.key,
                row.scenario,
                f"{row.metric} ({row.unit})",
                row.cell("flightlog"),
                row.cell("jsonl"),
                row.cell("sqlite"),
                _ratio_cell(row.ratio("jsonl")),
                _ratio_cell(row.ratio("sqlite")),
                "; ".join(target.text(row.unit) for target in row.targets) or "—",
                {True: "yes", False: "**no**", None: "—"}[met],
            ]
        )
    return markdown_table(lines)


def markdown_table(lines: Sequence[Sequence[str]]) -> str:
    """A header line and rows of cells as a Markdown table, columns padded to align."""
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    out = []
    for n, line in enumerate(lines):
        out.append(
            "| " + " | ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)) + " |"
        )
        if n == 0:
            out.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(out)
