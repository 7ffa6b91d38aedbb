"""Every exit code each command can return, with its meaning: the one table CI authors read
(docs/reference/exit-codes.md is rendered from it, and a test ties each row to a test that
provokes it)."""

from __future__ import annotations

from dataclasses import dataclass

from torchmatrix.reports.upgrade_diff import (
    BROKEN_DIRECTION,
    FAIL_CAUSES,
    GROWN_DRIFT,
    REGRESSION,
    SLOWDOWN,
    UNCONFIRMED,
)
from torchmatrix.run.runner import INTERRUPTED_EXIT

PASSED = 0
FAILED = 1
USAGE = 2
INTERRUPTED = INTERRUPTED_EXIT


@dataclass(frozen=True)
class ExitCode:
    """One code one command returns: what it means, and the tests that provoke it (pytest node ids)."""

    command: str
    code: int
    meaning: str
    provoked_by: tuple[str, ...]


CORPUS = "tests/hostile/test_corpus.py::test_hostile_input_is_refused_with_one_line"
VERDICTS = "tests/hostile/test_verdicts.py::test_the_exit_code_is_the_verdict"
RUNS = "tests/hostile/test_run_exits.py"
# The test that provokes each of FAIL_CAUSES: every exit 1 of compare is its own row.
COMPARE_FAILURES = {
    REGRESSION.name: (f"{VERDICTS}[compare-confirmed-regression]",),
    GROWN_DRIFT.name: (f"{VERDICTS}[compare-drift-grew]",),
    SLOWDOWN.name: (f"{VERDICTS}[compare-suite-slower]",),
    UNCONFIRMED.name: (f"{VERDICTS}[compare-failure-never-rerun]",),
    BROKEN_DIRECTION.name: (f"{VERDICTS}[compare-broken-rollback]",),
}

EXIT_CODES = (
    ExitCode("every command", USAGE, "a usage error argparse reports (an unknown option, `--slots 0`): its usage, then one line", (f"{CORPUS}[slots-zero]",)),
    ExitCode("list", PASSED, "the selected cells are printed", ("tests/hostile/test_corpus.py::test_a_suite_symlink_into_the_named_project_root_is_accepted",)),
    ExitCode("list", USAGE, "matrix.toml or a filter cannot apply (one line naming the file, the key and the fix); also a --config that is not a regular file or over 4 MiB", (f"{CORPUS}[keyword-matches-nothing]", f"{CORPUS}[config-dev-zero]")),
    ExitCode("run", PASSED, "every test passed, was skipped or hit a CPU-simulation limit", ("tests/hostile/test_runs.py::test_a_reused_run_id_is_refused_and_restart_starts_clean",)),
    ExitCode("run", FAILED, "a test failed or errored, including a suite that collected no test and a cell the runner could not finish", (f"{RUNS}::test_a_suite_that_collects_nothing_errors_naming_the_prefix", f"{RUNS}::test_a_test_that_removes_the_reports_directory_leaves_a_full_report")),
    ExitCode("run", USAGE, "stopped before any cell: matrix.toml, a filter, a component, the run id, or another run writing the same torch version; or the reports could not be written (the disk is full: the finished cells' reports are kept)", ("tests/hostile/test_runs.py::test_a_reused_run_id_is_refused_and_restart_starts_clean", f"{RUNS}::test_a_second_runner_and_a_report_during_the_run_are_refused", f"{RUNS}::test_a_full_disk_keeps_the_finished_cells_and_names_the_full_disk")),
    ExitCode("run", INTERRUPTED, "Ctrl-C or SIGTERM, from the component check on: every planned cell is in the reports, unfinished ones as errors saying so; a second signal does not cut the reports short", (f"{RUNS}::test_two_quick_interrupts_keep_every_test_of_the_cell", f"{RUNS}::test_a_signal_during_the_component_check_exits_130_with_every_cell_reported")),
    ExitCode("sensitivity", PASSED, "every chosen mutant was caught wherever it applies", ("tests/sensitivity/test_sensitivity.py::test_every_chosen_mutant_caught_exits_zero_with_the_table",)),
    ExitCode("sensitivity", FAILED, "a mutant was missed or errored in a cell where it ran", ("tests/sensitivity/test_sensitivity.py::test_a_mutant_that_acted_unseen_is_missed_and_one_that_could_not_be_seen_is_n_a",)),
    ExitCode("sensitivity", USAGE, "matrix.toml, a filter or --mutants cannot apply", (f"{CORPUS}[sensitivity-shard]",)),
    ExitCode("sensitivity", INTERRUPTED, "Ctrl-C or SIGTERM; the finished runs are kept (each is a `run`, as above)", (f"{RUNS}::test_two_quick_interrupts_keep_every_test_of_the_cell",)),
    ExitCode("report", PASSED, "the reports are written, whatever the tests did", ("tests/hostile/test_runs.py::test_a_sigkilled_runner_leaves_no_process_and_report_rebuilds_every_cell",)),
    ExitCode("report", USAGE, "not a run directory, an unreadable or hostile file in it (truncated XML, an entity bomb, a directory or pipe for a cell report), or a run still running", (f"{CORPUS}[report-billion-laughs]", f"{RUNS}::test_a_second_runner_and_a_report_during_the_run_are_refused")),
    ExitCode("report", FAILED, "with `--check-upgrade` (as `nox -s report` passes it): an upgrade diff of the run holds any cause `compare` exits 1 on (below), a broken checkpoint direction between its versions included; stderr names the causes", ("tests/suites/test_cross_version.py::test_unreadable_rollback_is_reported_with_its_root_cause_and_fails_compare",)),
    ExitCode("cross-read", PASSED, "every version read the other versions' cross_version checkpoints exactly, or had none to read (those reads stay not checked)", ("tests/suites/test_cross_version.py::test_reference_checkpoints_load_exactly_both_ways",)),
    ExitCode("cross-read", FAILED, "a version could not load, or loaded different values from, a checkpoint another version wrote", ("tests/suites/test_cross_version.py::test_unreadable_rollback_is_reported_with_its_root_cause_and_fails_compare",)),
    ExitCode("cross-read", USAGE, "not a run directory, or a version's read pass was refused (its run's plan.json is missing or malformed)", (f"{CORPUS}[cross-read-not-a-run-directory]",)),
    ExitCode("compare", PASSED, "no regression, no grown drift, no slower suite, no change left unconfirmed (newly skipped tests, and a change whose failure passed alone, are listed but do not count)", (f"{VERDICTS}[compare-failure-passed-alone]",)),
    *(ExitCode("compare", FAILED, cause.meaning, COMPARE_FAILURES[cause.name]) for cause in FAIL_CAUSES),
    ExitCode("compare", USAGE, "an unreadable or malformed run, runs without a torch version in common, or runs that share no test", (f"{VERDICTS}[compare-no-shared-test]", f"{CORPUS}[compare-results-truncated]")),
    ExitCode("bisect", PASSED, "every regression it searched got an answer: a `first bad:` line (a release, or a range where releases around it did not install)", ("tests/bisect/test_bisect_e2e.py::test_first_bad_found_with_the_fewest_installs", "tests/bisect/test_bisect_e2e.py::test_an_uninstallable_release_is_skipped_with_pips_reason")),
    ExitCode("bisect", FAILED, "a search stopped without an answer: a flaky or order-dependent verdict, or no release between the pins could be judged", ("tests/bisect/test_bisect_e2e.py::test_a_flaky_middle_release_stops_the_search",)),
    ExitCode("bisect", USAGE, "pins missing, out of order or not versions; --from without a confirmed regression; --shard; a selection that keeps no cell; the envdir held by a matrix run", ("tests/bisect/test_bisect_cli.py::test_a_usage_error_is_one_line_and_exit_2", "tests/bisect/test_bisect_cli.py::test_a_matrix_run_holding_the_envdir_keeps_bisect_out")),
    ExitCode("bisect", INTERRUPTED, "Ctrl-C or SIGTERM; the steps already run keep their run directories", ("tests/bisect/test_bisect_cli.py::test_an_interrupted_bisect_exits_130_with_one_line",)),
    ExitCode("repro", PASSED, "the reproducer directory is written (repro.py, command.txt, cell.json, collect_env.txt, README.md)", ("tests/bisect/test_bisect_e2e.py::test_the_reproducer_fails_without_torchmatrix_as_the_run_did_and_passes_on_the_good_release",)),
    ExitCode("repro", USAGE, "not a run directory, or the test id is not a confirmed failure of the run (the line lists those that are)", ("tests/bisect/test_bisect_cli.py::test_repro_names_the_confirmed_failures_when_the_id_is_not_one",)),
    ExitCode("merge", PASSED, "merged, and every test passed or was skipped", ("tests/hostile/test_verdicts.py::test_a_refused_merge_leaves_out_as_it_was_and_the_corrected_one_passes",)),
    ExitCode("merge", FAILED, "merged, and a test failed or errored, or a planned cell had no report (it errors saying which shard)", ("tests/scale/test_scale_out.py::test_a_missing_shard_becomes_errored_cells_that_say_so",)),
    ExitCode("merge", USAGE, "refused before writing anything: a cell reported twice, a report of another matrix.toml, an unsafe name, an unreadable file", (f"{CORPUS}[merge-truncated-cell-xml]", "tests/scale/test_scale_out.py::test_duplicate_reports_are_refused")),
    ExitCode("github-matrix", PASSED, "the job matrix is printed (never empty)", ("tests/scale/test_scale_out.py::test_github_matrix_has_one_job_per_version_and_shard",)),
    ExitCode("github-matrix", USAGE, "matrix.toml or a filter cannot apply, only `system` is listed, or over 256 jobs", (f"{CORPUS}[github-matrix-only-system]",)),
    ExitCode("slurm", PASSED, "the sbatch scripts are written", ("tests/hostile/test_corpus.py::test_slurm_values_that_pass_are_plain",)),
    ExitCode("slurm", USAGE, "matrix.toml, a filter, --partition or --time cannot apply", (f"{CORPUS}[slurm-partition-newline]",)),
)  # fmt: skip


def render_markdown() -> str:
    """docs/reference/exit-codes.md."""
    lines = [
        "# Exit codes",
        "",
        "What each `python -m torchmatrix` command can exit with (nox passes the code through). Exit 2 ends with",
        "one line, `torchmatrix: error: ...` (or argparse's), that says what to change, never a traceback. Generated",
        "from `torchmatrix/exit_codes.py`; `tests/test_exit_codes.py` checks that this page matches it and that a",
        "test provokes every row.",
        "",
        "| command | exit | meaning |",
        "|---|---|---|",
    ]
    lines += [f"| {_command(row.command)} | {row.code} | {row.meaning} |" for row in EXIT_CODES]
    return "\n".join(lines) + "\n"


def _command(name: str) -> str:
    return name if " " in name else f"`{name}`"
