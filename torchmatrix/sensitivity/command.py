"""`python -m torchmatrix sensitivity`: would the suites catch these bugs on *this* stack?

It wraps the configured `[components]` in the generic mutants of torchmatrix.sensitivity.mutants,
runs the suites each mutant targets over a small selection of cells (every axis value in at
least one cell), and reports per mutant and suite whether the suite failed (caught, with the
failure message) or passed (missed). The unmutated components run first: only failures they
did not have count, so a test that already fails there catches a mutant only by a new line,
and a cell where they skip every test (a component's package not installed) is skipped, with
that reason, for every mutant.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

from torchmatrix.components.protocol import GRAD_CKPT, RESUME
from torchmatrix.matrix.cells import Cell
from torchmatrix.matrix.config import Matrix
from torchmatrix.matrix.selection import select_cells
from torchmatrix.run.runner import RunRequest, run_version
from torchmatrix.sensitivity.verdicts import CellResult, new_failures, read_cells

GENERATED_MODULE = "torchmatrix_sensitivity_components"


@dataclass(frozen=True)
class GenericMutant:
    """One bug class, as a wrapper around one kind of component, and the suite that must catch it."""

    name: str
    bug: str
    suite: str
    component: str
    wrapper: str

    def wraps(self, key: str) -> bool:
        """Whether this mutant replaces the `[components]` entry `key` (`optimizer` stands for every optimizer_<value>)."""
        return key == self.component or (self.component == "optimizer" and key.startswith("optimizer_"))


GENERIC_MUTANTS = (
    GenericMutant("skip_model_on_load", "checkpointer leaves the model weights unloaded", RESUME, "checkpointer", "skips_on_load({inner!r}, 'model')"),
    GenericMutant("skip_optimizer_on_load", "checkpointer drops the optimizer state (the seed's lost moments)", RESUME, "checkpointer", "skips_on_load({inner!r}, 'optimizer')"),
    GenericMutant("skip_scheduler_on_load", "checkpointer leaves the LR scheduler at its start", RESUME, "checkpointer", "skips_on_load({inner!r}, 'scheduler')"),
    GenericMutant("skip_loader_on_load", "checkpointer leaves the loader at its first batch", RESUME, "checkpointer", "skips_on_load({inner!r}, 'loader')"),
    GenericMutant("skip_rng_on_load", "checkpointer leaves the RNG streams unrestored", RESUME, "checkpointer", "skips_on_load({inner!r}, 'rng')"),
    GenericMutant("restore_on_rank_zero_only", "checkpointer restores every piece on rank 0 only", RESUME, "checkpointer", "restores_on_rank_zero_only({inner!r})"),
    GenericMutant("moments_cast_to_param_dtype", "optimizer load casts its state (moments, master) to the param dtype", RESUME, "optimizer", "moments_cast_on_load({inner!r})"),
    GenericMutant("recompute_bumps_buffer", "a layer bumps a buffer on every body run, recompute included", GRAD_CKPT, "model", "counts_body_runs_in_buffer({inner!r})"),
    GenericMutant("recompute_bumps_cache_counter", "an int counter on the cache is bumped on every body run, recompute included", GRAD_CKPT, "model", "counts_body_runs_on_cache({inner!r})"),
)  # fmt: skip


class SensitivityError(Exception):
    """A request the command cannot serve (unknown mutant, no suite to run), said in one line."""


@dataclass
class Verdict:
    """What one suite did with one mutant over the selected cells; `skipped_in` maps the cells it
    could not judge (the suite skipped every test there) to the reason."""

    mutant: str
    bug: str
    suite: str
    caught_in: list[str]
    missed_in: list[str]
    message: str
    skipped_in: dict[str, str] = field(default_factory=dict)

    @property
    def missed(self) -> bool:
        """Ran in some cell and caught in none (a mutant skipped everywhere is not judged, so not missed)."""
        return bool(self.missed_in) and not self.caught_in

    def result_text(self) -> str:
        judged = len(self.caught_in) + len(self.missed_in)
        if self.caught_in:
            parts = [f"caught in {len(self.caught_in)} of {judged} cells"]
            parts[0] += f" (missed in {', '.join(self.missed_in)})" if self.missed_in else ""
        else:
            parts = ["**missed**"] if self.missed_in else []
        by_reason: dict[str, list[str]] = {}
        for cell, reason in self.skipped_in.items():
            by_reason.setdefault(reason, []).append(cell)
        if not parts:
            return "; ".join(f"skipped ({reason})" for reason in by_reason)
        parts += [f"skipped in {', '.join(cells)} ({reason})" for reason, cells in by_reason.items()]
        return "; ".join(parts)


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


def generated_module(matrix: Matrix, mutants: tuple[GenericMutant, ...]) -> str:
    """Python source binding each mutant's wrapper around the configured component, one attribute per pair."""
    lines = [
        '"""Written by `python -m torchmatrix sensitivity`: the configured components in generic mutants."""',
        "",
        "from torchmatrix.sensitivity.mutants import (",
        "    counts_body_runs_in_buffer,",
        "    counts_body_runs_on_cache,",
        "    moments_cast_on_load,",
        "    restores_on_rank_zero_only,",
        "    skips_on_load,",
        ")",
        "",
    ]
    for mutant in mutants:
        for key, inner in matrix.components.items():
            if mutant.wraps(key):
                lines.append(f"{attribute(mutant, key)} = {mutant.wrapper.format(inner=inner)}")
    return "\n".join(lines) + "\n"


def attribute(mutant: GenericMutant, key: str) -> str:
    return f"{mutant.name}__{key}"


def mutated(matrix: Matrix, mutant: GenericMutant) -> Matrix:
    """The matrix with only the mutant's suite and its component replaced by the wrapped one."""
    components = {
        key: f"{GENERATED_MODULE}:{attribute(mutant, key)}" if mutant.wraps(key) else path
        for key, path in matrix.components.items()
    }
    return dataclasses.replace(matrix, suites={mutant.suite: matrix.suites[mutant.suite]}, components=components)


INTERRUPTED = 130


def run_selection(request: RunRequest, cells: list[Cell]) -> None:
    """run_version over exactly `cells` (a keyword of their ids); an interrupted run ends the command."""
    if run_version(dataclasses.replace(request, keyword=" or ".join(cell.id for cell in cells))) == INTERRUPTED:
        raise KeyboardInterrupt


def markdown_table(verdicts: list[Verdict]) -> str:
    rows = ["| mutant | bug | suite | result | failure message |", "|---|---|---|---|---|"]
    for v in verdicts:
        message = v.message.replace("|", "\\|")
        rows.append(f"| `{v.mutant}` | {v.bug} | {v.suite} | {v.result_text()} | {f'`{message}`' if message else ''} |")
    return "\n".join(rows)


def judge(mutant: GenericMutant, cells: list[Cell], baseline: dict[str, CellResult], run_dir: Path | None) -> Verdict:
    """The verdict on `mutant` per cell: skipped where the unmutated run skipped every test of its
    suite, else caught by a failure that run did not have, else skipped where the mutant run skipped
    every test, else missed. `run_dir` is the mutant's version directory (None: it did not run)."""
    results = read_cells(run_dir, mutant.suite) if run_dir else {}
    caught, missed, skipped, first = [], [], {}, None
    for cell in cells:
        before = baseline.get(cell.id, CellResult())
        after = results.get(cell.id, CellResult())
        found = new_failures(after.failures, before.failures)
        if before.skipped:
            skipped[cell.id] = before.skipped
        elif found:
            caught.append(cell.id)
            known = frozenset(line for failure in before.failures for line in failure.says())
            first = first or found[0].telling_line(known)
        elif after.skipped:
            skipped[cell.id] = after.skipped
        else:
            missed.append(cell.id)
    return Verdict(mutant.name, mutant.bug, mutant.suite, caught, missed, first or "", skipped)


def run_sensitivity(
    matrix: Matrix, *, version: str, out: Path, filters: dict, mutant_names: str | None, slots: int | None
) -> int:
    """Unmutated run, then every mutant; print and write the table; 1 when a mutant is missed.

    A mutant counts as caught in a cell when its suite reports a failure there that the unmutated
    components did not: a test that passed on them, or a new per-rank line in one that did not.
    Failures are not re-run alone (confirm limit 0): a mutant breaks every run the same way, and
    the comparison with the unmutated run already discounts what fails without it."""
    mutants = tuple(m for m in chosen_mutants(mutant_names) if m.suite in matrix.suites)
    if not mutants:
        raise SensitivityError(
            f"{matrix.path.name}: no [suites.{GRAD_CKPT}] or [suites.{RESUME}], which the generic mutants target"
        )
    cells = covering_cells(select_cells(matrix.cells(), **filters))
    if not cells:
        raise SensitivityError("the filters select no cell")
    generated = out / "components"
    generated.mkdir(parents=True, exist_ok=True)
    (generated / f"{GENERATED_MODULE}.py").write_text(generated_module(matrix, mutants))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(generated), os.environ.get("PYTHONPATH")) if p)
    request = RunRequest(matrix=matrix, version=version, reports=out / "runs", run_id="", slots=slots, confirm_limit=0)
    print(f"torchmatrix sensitivity: {len(mutants)} mutants over {len(cells)} cells: {', '.join(c.id for c in cells)}")

    suites = sorted({m.suite for m in mutants})
    unmutated = dataclasses.replace(matrix, suites={name: matrix.suites[name] for name in suites})
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
        judged = [cell for cell in cells if not baseline[mutant.suite].get(cell.id, CellResult()).skipped]
        if judged:
            run_selection(dataclasses.replace(request, matrix=mutated(matrix, mutant), run_id=mutant.name), judged)
        run_dir = out / "runs" / mutant.name / f"torch-{version}" if judged else None
        verdicts.append(judge(mutant, cells, baseline[mutant.suite], run_dir))
    table = markdown_table(verdicts)
    header = f"Cells: {', '.join(c.id for c in cells)} (torch {version})\n\n"
    if notes:
        header += "Already failing on the unmutated components (a mutant counts only with new failure lines):\n\n"
        header += "".join(f"- {note}\n" for note in notes) + "\n"
    (out / "sensitivity.md").write_text(header + table + "\n")
    (out / "sensitivity.json").write_text(
        json.dumps(
            {"torch": version, "cells": [c.id for c in cells], "verdicts": [dataclasses.asdict(v) for v in verdicts]},
            indent=2,
        )
    )
    missed = [v.mutant for v in verdicts if v.missed]
    print(f"\n{header}{table}\n")
    print(f"torchmatrix sensitivity: wrote {out / 'sensitivity.md'} and sensitivity.json")
    if missed:
        print(f"torchmatrix sensitivity: missed {', '.join(missed)}", file=sys.stderr)
        return 1
    return 0
