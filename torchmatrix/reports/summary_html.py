"""summary.html: one self-contained page (no network) to read a run and its torch-upgrade diff.

- The grid of cells x torch versions has one coloured mark per suite and filters by axis value.
- Every failure expands to its full text; drift figures get a small inline SVG bar chart across
  torch versions.
- templates/summary.html writes the page with autoescape on (summary_templates), and a
  Content-Security-Policy allows only this page's own script (by hash), so injected markup could
  neither load nor run.
"""

from __future__ import annotations

import base64
import hashlib
import math
from collections import defaultdict
from dataclasses import dataclass
from importlib import resources

from markupsafe import Markup

from torchmatrix.reports.records import RootCause, RunResults, drift_measure, is_drift_figure
from torchmatrix.reports.summary_data import (
    distinct_texts,
    summarize,
)
from torchmatrix.reports.summary_grid import RecordKey, grid, record_key
from torchmatrix.reports.summary_templates import page_names, render_html
from torchmatrix.reports.upgrade_diff import UpgradeDiff, grew
from torchmatrix.status import Confirmation

CHART_BAR = 14
CHART_HEIGHT = 28
CONFIRMED_STYLE = {"fail alone": "bad", "passed alone": "warn", "unconfirmed": "bad"}
TEMPLATES = resources.files("torchmatrix.reports") / "templates"


def render(results: RunResults, diffs: list[UpgradeDiff]) -> str:
    """The whole page as one string."""
    summary = summarize(results)
    anchors = {
        record_key(r): f"{kind}-{c}-{t}"
        for kind, causes in (("failure", summary.root_causes), ("limit", summary.simulation_limits))
        for c, cause in enumerate(causes)
        for t, records in enumerate(distinct_texts(cause))
        for r in records
    }
    script = "\n" + (TEMPLATES / "summary.js").read_text(encoding="utf-8")  # byte for byte what the CSP hashes
    script_hash = base64.b64encode(hashlib.sha256(script.encode()).digest()).decode()
    return render_html(
        "summary.html",
        summary=summary,
        diffs=diffs,
        anchors=anchors,
        grid=grid(results, [d for diff in diffs for d in diff.checkpoints], anchors),
        drift=_drift(results),
        policy=Markup(f"default-src 'none'; style-src 'unsafe-inline'; script-src 'sha256-{script_hash}'"),
        style=Markup((TEMPLATES / "summary.css").read_text(encoding="utf-8")),
        script=Markup(script),
        FAILS_ALONE=Confirmation.FAILS_ALONE,
        CONFIRMED_STYLE=CONFIRMED_STYLE,
        cells_of=_cells_of,
        key=record_key,
        **page_names(),
    )


def _cells_of(causes: list[RootCause]) -> dict[RecordKey, tuple[str, ...]]:
    """Per failing test, the cells its result stands for."""
    return {record_key(r): cells for cause in causes for r, cells in cause.failures}


@dataclass(frozen=True)
class Bar:
    """One torch version's bar: its class (base, same, grown, zero), place, height and value."""

    kind: str
    x: int
    y: float
    height: float
    version: str
    value: float


@dataclass(frozen=True)
class Chart:
    """A bar per torch version, log-scaled between the row's smallest and largest positive value."""

    bars: list[Bar]
    width: int
    height: int = CHART_HEIGHT
    bar: int = CHART_BAR


@dataclass(frozen=True)
class DriftCell:
    """One cell's worst value per torch version, and its chart."""

    name: str
    values: dict[str, float]
    chart: Chart | None


@dataclass(frozen=True)
class DriftBlock:
    """One (suite, test, measure): its worst value per torch version, then per cell."""

    suite: str
    test: str
    measure: str
    overall: dict[str, float]
    chart: Chart | None
    cells: list[DriftCell]


@dataclass(frozen=True)
class Drift:
    """The drift table: its version columns, the ratio that colours a bar red, and its rows."""

    versions: list[str]
    ratio: float
    blocks: list[DriftBlock]


def _drift(results: RunResults) -> Drift:
    """Per (suite, test, measure): the worst value per torch version, then per cell."""
    versions = [v.torch for v in results.versions]
    worst: dict[tuple[str, str, str], dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for record in results.tests:
        if record.ran_in is not None:
            continue
        for name, value in record.figures.items():
            if is_drift_figure(name) and isinstance(value, float):
                per_cell = worst[(record.suite, record.test, drift_measure(name))][record.cell]
                per_cell[record.torch] = _worse(per_cell.get(record.torch), abs(value))
    ratio = results.settings.drift_ratio
    blocks = []
    for (suite, test, measure), cells in worst.items():
        overall: dict[str, float] = {}
        for per_version in cells.values():
            for version, value in per_version.items():
                overall[version] = _worse(overall.get(version), value)
        blocks.append(
            DriftBlock(
                suite,
                test,
                measure,
                overall,
                _chart(overall, versions, results.baseline, ratio),
                [
                    DriftCell(cell, per_version, _chart(per_version, versions, results.baseline, ratio))
                    for cell, per_version in cells.items()
                ],
            )
        )
    return Drift(versions, ratio, blocks)


def _worse(previous: float | None, value: float) -> float:
    if previous is None or math.isnan(value):
        return value
    return previous if math.isnan(previous) else max(previous, value)


def _chart(per_version: dict[str, float], versions: list[str], baseline: str, ratio: float) -> Chart | None:
    """The bars of one row; None for a row whose figures are all 0, which says so instead of drawing empty axes."""
    if all(value == 0 for value in per_version.values()):
        return None
    logs = [math.log10(v) for v in per_version.values() if v > 0 and math.isfinite(v)]
    low, high = (min(logs) - 1, max(logs)) if logs else (0.0, 1.0)
    base = per_version.get(baseline)
    bars = []
    for i, version in enumerate(versions):
        value = per_version.get(version)
        if value is None:
            continue
        if value > 0 and math.isfinite(value):
            height = 3 + (CHART_HEIGHT - 3) * (math.log10(value) - low) / max(high - low, 1e-12)
        else:
            height = CHART_HEIGHT if value != 0 else 1
        kind = "base" if version == baseline else "grown" if base is not None and grew(base, value, ratio) else "same"
        kind = "zero" if value == 0 and kind != "base" else kind
        bars.append(Bar(kind, i * (CHART_BAR + 2), CHART_HEIGHT - height, height, version, value))
    return Chart(bars, len(versions) * (CHART_BAR + 2))
