"""The ETA of a run, seeded from what earlier runs in reports/ took, else from per-suite priors.

Elapsed time over finished cells alone is far too high at first: cells run side by side, so the
first to finish carries most of the time since the start (imports, pool starts, its neighbours'
work). Earlier runs' results.json say how long each suite takes (without one, PRIOR_SUITE_SECONDS
does); that work spread over the machine's slots, slowed by what else keeps the machine busy
(`contention`), is the seed, and it gives way to the observed rate as the work gets done. What follows the cells is counted as phases (`LaterPhases`): the
later versions' installs and starts, each version's read pass, the report. Suite timeouts are
limits, not estimates, and are never used. The priors' measurements: docs/explanation/performance.md.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from statistics import mean

from torchmatrix.matrix.plan import SuiteRun
from torchmatrix.reports.results_json import FILE_NAME as RESULTS_FILE

RUNS_CONSIDERED = 5
PRIOR_SUITE_SECONDS = {
    "grad_ckpt": 1.1,
    "resume": 1.9,
    "dtensor_optim": 0.4,
    "parallel_equivalence": 0.35,
    "cross_version": 1.25,
    "collectives": 0.25,
}
"""Slot-seconds of one run of each built-in suite on a one-rank cell (a wider cell costs it per
rank), torch 2.13.0 CPU on an idle 2-core machine, eager cells (a compiled cell costs far more:
its history says how much): the seed when reports/ holds no earlier run; a suite of your own
costs their mean."""
STARTUP_S = 12.0
"""A runner's start to its first finished cell beyond that cell's work (the CLI, the component check,
pytest processes importing torch and collecting) on an idle machine, until this runner's is observed."""
MAX_TEST_S = 7 * 24 * 3600.0
"""The longest duration of one test an earlier results.json may claim; longer (or infinite) ones are passed over."""
READ_START_S = 4.0
"""A read pass's start to its first cell, idle: one process importing torch and collecting cross_version."""
READ_CELL_S = 0.1
"""Slot-seconds of one cell's reads of the other versions' cross_version checkpoints, idle."""
REPORT_S = 3.0
"""The report session besides its read passes, idle: the reports written, in the venv nox keeps for it
(a first run makes that venv and installs this torchmatrix and nox, about 6 s more)."""


def contention(load: float, cores: int) -> float:
    """How many times slower than on an idle machine CPU-bound work runs now: the 1-minute load
    average per core, never below 1 (an idle machine's, or one this invocation's install left)."""
    return max(1.0, load / max(cores, 1))


COLD, WARM = "cold", "warm"
"""How the compile store stood for a suite run: it compiled and the store saved it nothing (COLD), or
the store saved it compiling (WARM). A run that compiled nothing costs the same either way."""


@dataclass(frozen=True)
class SuiteHistory:
    """What earlier runs here say a suite run costs: each suite's mean over the cells that ran it,
    and each (cell, suite) run's own mean with the store cold and warm, 0 where that cell read the
    run's results from another."""

    per_suite: dict[str, float]
    per_run: dict[tuple[str, str, str], float]


def suite_history(reports: Path, torch: str, current_run: str, cpu_slots: int | None = None) -> SuiteHistory:
    """Seconds of one run of each suite (its tests' durations summed) in the latest few results.json
    under `reports`, from runs of `torch` when any ran it.

    With ranks simulated on `cpu_slots` cores, a test counts its ranks' CPU seconds spread over the
    cores its cell may use, not its duration, which also counts the time it waited while the other
    pytest processes held the cores (twice the work, side by side on two cores). An unreadable or
    foreign results.json is passed over: an estimate never stops a run.
    """
    runs = [_suite_run_seconds(path, cpu_slots) for path in _latest_results(reports, current_run)]
    same_torch = [{key: spent for key, spent in run.items() if key[0] == torch} for run in runs]
    by_suite: dict[str, list[float]] = defaultdict(list)
    by_run: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for run in same_torch if any(same_torch) else runs:
        for (_, cell, suite), (seconds, state) in run.items():
            for each in (state,) if state else (COLD, WARM):
                by_run[cell, suite, each].append(seconds)
            if seconds > 0:
                by_suite[suite].append(seconds)
    return SuiteHistory(
        {suite: mean(spent) for suite, spent in by_suite.items()}, {key: mean(spent) for key, spent in by_run.items()}
    )


def _latest_results(reports: Path, current_run: str) -> list[Path]:
    """The newest RUNS_CONSIDERED results.json one or two levels under `reports` (run ids may
    hold a `/`), each once however many links point at its run, never the current run's."""
    current = (reports / current_run).resolve()
    found = {
        path.resolve()
        for path in [*reports.glob(f"*/{RESULTS_FILE}"), *reports.glob(f"*/*/{RESULTS_FILE}")]
        if path.resolve().parent != current and path.is_file()
    }
    return sorted(found, key=lambda path: path.stat().st_mtime, reverse=True)[:RUNS_CONSIDERED]


def _suite_run_seconds(path: Path, cpu_slots: int | None) -> dict[tuple[str, str, str], tuple[float, str]]:
    """(torch, cell, suite) -> seconds its tests took and how the compile store stood for them (COLD,
    WARM, "" where they compiled nothing), for each suite run a results.json holds (a result a cell
    shares from another counts once, for the cell that ran it); with `cpu_slots`, the CPU seconds of
    the test's ranks over min(world size, cpu_slots) where the record has them."""
    try:
        results = json.loads(path.read_text())
        tests, widths = results.get("tests", []), _cell_widths(results.get("cells", []), cpu_slots)
    except (OSError, ValueError, AttributeError):
        return {}
    seconds: dict[tuple[str, str, str], float] = defaultdict(float)
    compiled: dict[tuple[str, str, str], float] = defaultdict(float)
    saved: dict[tuple[str, str, str], float] = defaultdict(float)
    for record in tests if isinstance(tests, list) else []:
        if not isinstance(record, dict):
            continue
        key = str(record.get("torch")), str(record.get("cell")), str(record.get("suite"))
        seconds[key] += 0.0  # a run whose results the cell read from another still cost it nothing
        if record.get("ran_in") not in (None, record.get("cell")):
            continue
        figures = record.get("figures") if isinstance(record.get("figures"), dict) else {}
        cpu = _plausible_seconds(figures.get("cpu_seconds")) if cpu_slots else None
        spent = _plausible_seconds(record.get("duration")) if cpu is None else cpu / widths.get(record.get("cell"), 1)
        if spent is not None:
            seconds[key] += spent
        compiled[key] += _plausible_seconds(figures.get("compile_seconds")) or 0.0
        saved[key] += _plausible_seconds(figures.get("compile_seconds_saved")) or 0.0
    return {key: (spent, WARM if saved[key] else COLD if compiled[key] else "") for key, spent in seconds.items()}


def _cell_widths(cells: object, cpu_slots: int | None) -> dict[str, int]:
    """Cell id -> how many cores its ranks may use at once, min(world size, cpu_slots), from a
    results.json's `cells`; a cell it does not describe counts one."""
    widths = {}
    for cell in cells if cpu_slots and isinstance(cells, list) else []:
        try:
            widths[cell["id"]] = max(1, min(int(cell["axes"]["world_size"]), cpu_slots))
        except (KeyError, TypeError, ValueError):
            continue
    return widths


def _plausible_seconds(value: object) -> float | None:
    """`value` as a test's duration in seconds, or None for what no test took (not a number,
    negative, infinite, NaN, a 400-digit integer, over MAX_TEST_S), which would stop the estimate."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        seconds = float(value)
    except OverflowError:
        return None
    return seconds if 0 <= seconds <= MAX_TEST_S else None


@dataclass(frozen=True)
class WorkEstimate:
    """Expected slot-seconds of each cell's suite runs (a run counts for the cell that runs it),
    the slots they share, whether earlier runs or the priors said so, and how many times slower than
    idle the machine runs now: the seed of the ETA."""

    per_cell: Mapping[str, float]
    slots: int
    from_history: bool = True
    contention: float = 1.0

    @classmethod
    def of_runs(
        cls,
        runs: Iterable[SuiteRun],
        seconds: Mapping[str, float],
        slots: int,
        contention: float = 1.0,
        per_run: Mapping[tuple[str, str, str], float] | None = None,
        warm_cells: Collection[str] = (),
    ) -> WorkEstimate:
        """The work of `runs` as earlier runs say: a run `per_run` names costs what it took there with
        the store as it stands now for its cell (WARM for `warm_cells`, whose graphs the store holds; else
        COLD), or the other way where it never ran so; another run its suite's mean in `seconds`, a suite
        they do not name its prior, a suite without one the mean of what they name (of the priors,
        without history, which run `contention` times slower than idle)."""
        known = seconds or PRIOR_SUITE_SECONDS
        unknown = mean(known.values())
        own = per_run or {}
        per_cell: dict[str, float] = defaultdict(float)
        for run in runs:
            name, cell = run.suite.name, run.cell.id
            now, other = (WARM, COLD) if cell in warm_cells else (COLD, WARM)
            mean_of_suite = known.get(name, PRIOR_SUITE_SECONDS.get(name, unknown))
            each = own.get((cell, name, now), own.get((cell, name, other), mean_of_suite))
            per_cell[run.cell.id] += each * min(run.cell.world_size, slots)
        # Earlier runs' figures are this machine's own, at its load then: only the idle priors are slowed.
        return cls(dict(per_cell), slots, from_history=bool(seconds), contention=1.0 if seconds else contention)

    @property
    def total(self) -> float:
        return sum(self.per_cell.values())

    def remaining_seconds(self, elapsed: float, done: float, left: float) -> float:
        """Wall seconds for `left` slot-seconds when `done` took `elapsed`: the seed rate (one
        slot-second per slot, slowed by the contention) blended with the observed rate, weighted by
        the share done."""
        if left <= 0:
            return 0.0
        seed_rate = self.contention / self.slots
        observed_rate = elapsed / done if done > 0 else seed_rate
        weight = done / (done + left)
        return ((1 - weight) * seed_rate + weight * observed_rate) * left


@dataclass(frozen=True)
class LaterPhases:
    """What an invocation runs after this version's cells besides the later versions' cell work
    (which WorkEstimate counts): each later version's install and start, each version's read pass
    of the others' checkpoints, the report. `installs` None: not estimated (the ETA says so)."""

    versions: int = 0
    installs: float | None = 0.0
    read_passes: int = 0
    read_cells: int = 0
    report: bool = False
    reads_side_by_side: bool = True  # on GPUs; a CPU read pass reads in one process (runner.py)

    def seconds(self, startup: float, slots: int, contention: float = 1.0) -> float:
        """Wall seconds of these phases, when a runner takes `startup` seconds before its cells' work
        and CPU-bound work runs `contention` times slower than idle (the installs' estimate has its own pace)."""
        read_slots = max(slots, 1) if self.reads_side_by_side else 1
        reads = self.read_passes * (READ_START_S + self.read_cells * READ_CELL_S / read_slots) * contention
        report = REPORT_S * contention if self.report else 0.0
        return (self.installs or 0.0) + self.versions * startup + reads + report


def rerun_seconds(processes: int, test_seconds: float, startup: float, slots: int) -> float:
    """Wall seconds of re-running failed tests alone: each fresh process starts (`startup`), `slots`
    at a time, and runs its tests again, as long as they took the first time (`test_seconds` in all)."""
    if processes <= 0:
        return 0.0
    width = max(min(slots, processes), 1)
    return math.ceil(processes / width) * startup + test_seconds / width
