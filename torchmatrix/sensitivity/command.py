"""`python -m torchmatrix sensitivity`: would the suites catch these bugs on *this* stack?

- Wraps the configured `[components]` in the generic mutants (registry.py) and runs each mutant's
  suite over a few cells that show every axis value at least once.
- The unmutated components run first: only failures they did not have count (a new test or a new
  per-rank line), and a cell where they skip every test is skipped, with that reason, for every mutant.
- Per mutant and cell: caught (a new failure), missed (passed where the mutant marked that it acted,
  evidence.record_acted), errored (the mutant's own code crashed: no catch), n/a (it cannot differ
  there, or did not act: the reason says what did not happen), skipped (docs/how-to/sensitivity.md).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from torchmatrix import file_writes
from torchmatrix.components.protocol import DTENSOR_OPTIM, GRAD_CKPT, RESUME
from torchmatrix.exit_codes import ExitCode
from torchmatrix.matrix.cells import Cell
from torchmatrix.matrix.config import Matrix
from torchmatrix.matrix.selection import CellSelection
from torchmatrix.run.run_request import RunRequest
from torchmatrix.run.runner import run_version
from torchmatrix.sensitivity.evidence import EVIDENCE_VARIABLE, cells_acted_in, reasons_it_cannot_act
from torchmatrix.sensitivity.registry import GENERIC_MUTANTS, INNER_COMPONENTS_VARIABLE, GenericMutant, component_path
from torchmatrix.sensitivity.verdicts import CellResult, new_failures, read_cells
from torchmatrix.user_error import UserError

MUTANT_SOURCES = (
    "torchmatrix/sensitivity/mutants.py",
    "torchmatrix/sensitivity/reverted_loads.py",
    "torchmatrix/sensitivity/evidence.py",
    "torchmatrix/sensitivity/mutated_components.py",
)


class SensitivityError(UserError):
    """A request the command cannot serve (unknown mutant, no suite to run), said in one line."""


@dataclass
class Verdict:
    """What one suite did with one mutant over the selected cells. Judged cells are caught,
    missed or errored (the mutant's own code crashed, `error` says how); `not_applicable_in` and
    `skipped_in` map the cells it could not be judged in (the mutant cannot differ there; the
    suite skipped every test there) to the reason."""

    mutant: str
    bug: str
    suite: str
    caught_in: list[str]
    missed_in: list[str]
    message: str
    skipped_in: dict[str, str] = field(default_factory=dict)
    errored_in: list[str] = field(default_factory=list)
    error: str = ""
    not_applicable_in: dict[str, str] = field(default_factory=dict)

    @property
    def missed(self) -> bool:
        """Passed in some cell where it applies: one such cell is enough, whatever the others caught."""
        return bool(self.missed_in)

    @property
    def errored(self) -> bool:
        return bool(self.errored_in)

    def result_text(self) -> str:
        judged = len(self.caught_in) + len(self.missed_in) + len(self.errored_in)
        parts = [f"caught in {len(self.caught_in)} of {judged} cells"] if self.caught_in else []
        parts += [f"**missed in {', '.join(self.missed_in)}**"] if self.missed_in else []
        parts += [f"**errored in {', '.join(self.errored_in)}** (the mutant crashed)"] if self.errored_in else []
        unjudged = [
            (label, reason, cells)
            for label, reasons in (("n/a", self.not_applicable_in), ("skipped", self.skipped_in))
            for reason, cells in grouped_by_reason(reasons).items()
        ]
        if not parts and len(unjudged) == 1:
            return f"{unjudged[0][0]} ({unjudged[0][1]})"
        parts += [f"{label} in {', '.join(cells)} ({reason})" for label, reason, cells in unjudged]
        return "; ".join(parts)


def grouped_by_reason(reasons: dict[str, str]) -> dict[str, list[str]]:
    """Cells that share a reason, under it, in first-seen order."""
    grouped: dict[str, list[str]] = {}
    for cell, reason in reasons.items():
        grouped.setdefault(reason, []).append(cell)
    return grouped


def covering_cells(cells: list[Cell]) -> list[Cell]:
    """Few cells in which every axis value of `cells` appears at least once (greedy set cover), in matrix order."""
    uncovered = {item for cell in cells for item in cell.items()}
    chosen = []
    while uncovered:
        best = max(cells, key=lambda cell: len(uncovered & set(cell.items())))
        chosen.append(best)
        uncovered -= set(best.items())
    return [cell for cell in cells if cell in chosen]


def chosen_mutants(names: str | None) -> tuple[GenericMutant, ...]:
    if not names:
        return GENERIC_MUTANTS
    known = {mutant.name: mutant for mutant in GENERIC_MUTANTS}
    wanted = [name.strip() for name in names.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in known]
    if unknown:
        raise SensitivityError(f"--mutants: unknown {', '.join(unknown)}; choose from {', '.join(known)}")
    return tuple(known[name] for name in wanted)


def mutated(matrix: Matrix, mutant: GenericMutant) -> Matrix:
    """The matrix with only the mutant's suite and its component replaced by the wrapped one."""
    components = {
        key: component_path(mutant, key) if mutant.wraps(key) else path for key, path in matrix.components.items()
    }
    return dataclasses.replace(matrix, suites={mutant.suite: matrix.suites[mutant.suite]}, components=components)


def run_selection(request: RunRequest, cells: list[Cell]) -> None:
    """run_version over exactly `cells` of the request's matrix; an interrupted run ends the command."""
    selection = CellSelection.exactly(cells, among=request.matrix.cells())
    if run_version(dataclasses.replace(request, cell_selection=selection)) == ExitCode.INTERRUPTED:
        raise KeyboardInterrupt


def markdown_table(verdicts: list[Verdict]) -> str:
    rows = ["| mutant | bug | suite | result | failure message |", "|---|---|---|---|---|"]
    for v in verdicts:
        message = (v.message or (f"mutant crashed: {v.error}" if v.error else "")).replace("|", "\\|")
        rows.append(f"| `{v.mutant}` | {v.bug} | {v.suite} | {v.result_text()} | {f'`{message}`' if message else ''} |")
    return "\n".join(rows)


def not_applicable(mutant: GenericMutant, cells: list[Cell], matrix: Matrix) -> dict[str, str]:
    """The cells where `mutant` cannot differ from the component it wraps, each with the reason."""
    return {cell.id: reason for cell in cells if (reason := mutant.not_applicable(cell, matrix))}


def judge(
    mutant: GenericMutant,
    cells: list[Cell],
    baseline: dict[str, CellResult],
    run_dir: Path | None,
    inapplicable: dict[str, str] | None = None,
    acted_in: frozenset[str] | set[str] = frozenset(),
    cannot_act: dict[str, str] | None = None,
) -> Verdict:
    """The verdict on `mutant` per cell: skipped where the unmutated run skipped every test of its
    suite; n/a where `inapplicable` says why; errored where a failure the unmutated run did not
    have is a crash of the mutant itself (what else failed there followed from it); else caught by
    such a failure; else skipped where the mutant run skipped every test; else n/a where it failed
    only as the unmutated run does (that failure hides the mutant's); else missed where the mutant
    marked that it acted (`acted_in`), n/a saying what did not happen where it did not, or why it
    could not act on this stack (`cannot_act`, per cell). `run_dir` is the mutant's version directory
    (None: it did not run)."""
    inapplicable, cannot_act = inapplicable or {}, cannot_act or {}
    results = read_cells(run_dir, mutant.suite, MUTANT_SOURCES) if run_dir else {}
    verdict = Verdict(mutant.name, mutant.bug, mutant.suite, [], [], "")
    for cell in cells:
        before = baseline.get(cell.id, CellResult())
        after = results.get(cell.id, CellResult())
        found = new_failures(after.failures, before.failures)
        known = frozenset(line for failure in before.failures for line in failure.says())
        crashes = [failure for failure in found if failure.crashed]
        if before.skipped:
            verdict.skipped_in[cell.id] = before.skipped
        elif cell.id in inapplicable:
            verdict.not_applicable_in[cell.id] = inapplicable[cell.id]
        elif unseen := mutant.unseen_in(before):
            verdict.not_applicable_in[cell.id] = unseen
        elif crashes:
            verdict.errored_in.append(cell.id)
            verdict.error = verdict.error or crashes[0].telling_line(known)
        elif found:
            verdict.caught_in.append(cell.id)
            verdict.message = verdict.message or found[0].telling_line(known)
        elif after.skipped:
            verdict.skipped_in[cell.id] = after.skipped
        elif after.failures:
            verdict.not_applicable_in[cell.id] = (
                f"it failed only as the unmutated run fails ({after.failures[0].telling_line()}), "
                "which hides whether the suite sees this mutant"
            )
        elif cell.id in acted_in:
            verdict.missed_in.append(cell.id)
        else:
            verdict.not_applicable_in[cell.id] = cannot_act.get(cell.id, mutant.idle)
    return verdict


def run_sensitivity(
    matrix: Matrix, *, version: str, out: Path, selection: CellSelection, mutant_names: str | None, slots: int | None
) -> ExitCode:
    """Unmutated run, then every mutant; print and write the table; 1 when a mutant is missed or
    errored in any cell where it applies.

    A mutant counts as caught in a cell when its suite reports a failure there that the unmutated
    components did not (a test that passed on them, or a new per-rank line in one that did not),
    unless that failure is a crash of the mutant's own code.
    Failures are not re-run alone (confirm limit 0): a mutant breaks every run the same way, and
    the comparison with the unmutated run already discounts what fails without it."""
    mutants = tuple(m for m in chosen_mutants(mutant_names) if m.suite in matrix.suites)
    if not mutants:
        raise SensitivityError(
            f"{matrix.path.name}: no [suites.{GRAD_CKPT}], [suites.{RESUME}] or [suites.{DTENSOR_OPTIM}], which the generic mutants target"
        )
    cells = covering_cells(matrix.select(selection))
    if not cells:
        raise SensitivityError("the filters select no cell")
    os.environ[INNER_COMPONENTS_VARIABLE] = json.dumps(matrix.components)
    request = RunRequest(matrix=matrix, version=version, reports=out / "runs", run_id="", slots=slots, confirm_limit=0)
    print(f"torchmatrix sensitivity: {len(mutants)} mutants over {len(cells)} cells: {', '.join(c.id for c in cells)}")

    suites = sorted({m.suite for m in mutants if len(not_applicable(m, cells, matrix)) < len(cells)})
    unmutated = dataclasses.replace(matrix, suites={name: matrix.suites[name] for name in suites})
    if suites:
        run_selection(dataclasses.replace(request, matrix=unmutated, run_id="unmutated"), cells)
    baseline = {suite: read_cells(out / "runs" / "unmutated" / f"torch-{version}", suite) for suite in suites}
    notes = [
        f"{suite} in {cell}: {failure.telling_line()}"
        for suite, by_cell in baseline.items()
        for cell, result in by_cell.items()
        for failure in result.failures
    ]

    verdicts = []
    for mutant in mutants:
        inapplicable = not_applicable(mutant, cells, matrix)
        judged = [
            cell
            for cell in cells
            if cell.id not in inapplicable
            and not (before := baseline.get(mutant.suite, {}).get(cell.id, CellResult())).skipped
            and not mutant.unseen_in(before)
        ]
        evidence = out / "evidence" / mutant.name
        if judged:
            os.environ[EVIDENCE_VARIABLE] = str(evidence)
            run_selection(dataclasses.replace(request, matrix=mutated(matrix, mutant), run_id=mutant.name), judged)
        run_dir = out / "runs" / mutant.name / f"torch-{version}" if judged else None
        verdicts.append(
            judge(
                mutant,
                cells,
                baseline.get(mutant.suite, {}),
                run_dir,
                inapplicable,
                cells_acted_in(evidence),
                reasons_it_cannot_act(evidence),
            )
        )
    table = markdown_table(verdicts)
    header = f"Cells: {', '.join(c.id for c in cells)} (torch {version})\n\n"
    if notes:
        header += "Already failing on the unmutated components (a mutant counts only with new failure lines):\n\n"
        header += "".join(f"- {note}\n" for note in notes) + "\n"
    file_writes.write_text(out / "sensitivity.md", header + table + "\n")
    file_writes.write_text(
        out / "sensitivity.json",
        json.dumps(
            {"torch": version, "cells": [c.id for c in cells], "verdicts": [dataclasses.asdict(v) for v in verdicts]},
            indent=2,
        ),
    )
    print(f"\n{header}{table}\n")
    print(f"torchmatrix sensitivity: wrote {out / 'sensitivity.md'} and sensitivity.json")
    missed = [f"{v.mutant} (in {', '.join(v.missed_in)})" for v in verdicts if v.missed]
    errored = [f"{v.mutant} (in {', '.join(v.errored_in)})" for v in verdicts if v.errored]
    for what, names in (("missed", missed), ("errored, the mutant itself crashed:", errored)):
        if names:
            print(f"torchmatrix sensitivity: {what} {'; '.join(names)}", file=sys.stderr)
    return ExitCode.FAILED if missed or errored else ExitCode.PASSED
