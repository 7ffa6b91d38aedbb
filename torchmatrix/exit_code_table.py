"""The table CI authors read: every exit code each command can return, with its meaning and the tests
that provoke it (docs/reference/exit-codes.md is rendered from it; tests/test_exit_codes.py ties each
row to its tests). It sits above the layers, since `compare`'s rows come from the upgrade diff's causes."""

from __future__ import annotations

from dataclasses import dataclass

from torchmatrix.exit_codes import ExitCode
from torchmatrix.reports.upgrade_diff import (
    BROKEN_DIRECTION,
    FAIL_CAUSES,
    GROWN_DRIFT,
    MEMORY,
    REGRESSION,
    SLOWDOWN,
    UNCONFIRMED,
)


@dataclass(frozen=True)
class ExitCodeRow:
    """One code one command returns: what it means, and the tests that provoke it (pytest node ids)."""

    command: str
    code: ExitCode
    meaning: str
    provoked_by: tuple[str, ...]


CORPUS = "tests/hostile/test_corpus.py::test_hostile_input_is_refused_with_one_line"
VERDICTS = "tests/hostile/test_verdicts.py::test_the_exit_code_is_the_verdict"
RUNS = "tests/hostile/test_run_exits.py"
FOREIGN = "tests/hostile/test_foreign_run_directories.py"
PRERELEASE = "tests/reports/test_prerelease_reports.py"
# The test that provokes each of FAIL_CAUSES: every exit 1 of compare is its own row.
COMPARE_FAILURES = {
    REGRESSION.name: (f"{VERDICTS}[compare-confirmed-regression]",),
    GROWN_DRIFT.name: (f"{VERDICTS}[compare-drift-grew]",),
    SLOWDOWN.name: (f"{VERDICTS}[compare-suite-slower]",),
    MEMORY.name: (f"{VERDICTS}[compare-memory-grew]",),
    UNCONFIRMED.name: (f"{VERDICTS}[compare-failure-never-rerun]",),
    BROKEN_DIRECTION.name: (f"{VERDICTS}[compare-broken-rollback]",),
}

EXIT_CODES = (
    ExitCodeRow("every command", ExitCode.USAGE, "a usage error argparse reports (an unknown option, `--slots 0`): its usage, then one line", (f"{CORPUS}[slots-zero]",)),
    ExitCodeRow("list", ExitCode.PASSED, "the selected cells are printed (also of a matrix past 200,000 cells that --only and -k narrow; also when the reader stops early, as `head -3` reading `list --json` does)", ("tests/hostile/test_corpus.py::test_a_suite_symlink_into_the_named_project_root_is_accepted", "tests/hostile/test_corpus.py::test_list_json_into_a_reader_that_stops_early_is_quiet", "tests/matrix/test_large_matrices.py::test_list_of_one_cell_of_a_huge_matrix_fits_in_a_memory_limit")),
    ExitCodeRow("list", ExitCode.USAGE, "matrix.toml or a filter cannot apply (one line naming the file, the key and the fix); also a --config that is not a regular file or over 4 MiB, a torch version that is not PEP 440 (the line shows the nearest valid spelling), axes past 200,000 cells without --only or -k, or more than 2,000,000 cells left for -k to read", (f"{CORPUS}[keyword-matches-nothing]", f"{CORPUS}[config-dev-zero]", f"{CORPUS}[torch-version-typo]", f"{CORPUS}[matrix-too-large]", f"{CORPUS}[matrix-too-large-unfiltered]")),
    ExitCodeRow("run", ExitCode.PASSED, "every test passed, was skipped or hit a CPU-simulation limit (an earlier results.json under reports/ with an infinite or absurd duration only leaves it out of the ETA); or the version is a nightly or rc value (`--torch nightly`), whose failures do not block unless `[report] prerelease_blocks` or `--prerelease-blocks` says so (a line on stderr says which)", ("tests/hostile/test_runs.py::test_a_reused_run_id_is_refused_and_restart_starts_clean", f"{FOREIGN}::test_an_absurd_duration_in_an_earlier_results_json_never_stops_a_run", f"{PRERELEASE}::test_a_failed_run_of_a_prerelease_exits_0_unless_it_blocks")),
    ExitCodeRow("run", ExitCode.FAILED, "a test failed or errored, including a suite that collected no test, a cell the runner could not finish, a test that never reached its end (it called pytest.exit() or raised KeyboardInterrupt), and a pytest process killed because it did not collect its tests within its suites' deadline plus 60 s (a suite that blocks at import) or did not exit 30 s after its last test (a thread left running): its cells error with the stacks of what held it", (f"{RUNS}::test_a_pytest_process_that_does_not_collect_or_exit_is_killed_with_its_stacks", f"{RUNS}::test_a_suite_that_collects_nothing_errors_naming_the_prefix", f"{RUNS}::test_a_test_that_removes_the_reports_directory_leaves_a_full_report", f"{RUNS}::test_a_test_that_exits_or_interrupts_pytest_as_the_last_of_its_cell_is_an_error")),
    ExitCodeRow("run", ExitCode.USAGE, "stopped before any cell: a --torch or --peer that is not a torch version (a path such as `/../../DIR`: nothing is written), matrix.toml, a filter, a component (whatever its module prints, at import or at exit; a module that exits at import), the run id, or another run writing the same torch version; a named pipe at the version's .run.lock; or the reports could not be written (the disk is full: the finished cells' reports are kept)", ("tests/hostile/test_runs.py::test_a_reused_run_id_is_refused_and_restart_starts_clean", f"{RUNS}::test_a_second_runner_and_a_report_during_the_run_are_refused", f"{RUNS}::test_a_full_disk_keeps_the_finished_cells_and_names_the_full_disk", f"{CORPUS}[component-prints-forged-answer-at-exit]", f"{CORPUS}[component-exits-at-import]", f"{CORPUS}[run-torch-escapes-with-peer]", f"{CORPUS}[run-peer-escapes]", f"{CORPUS}[run-lock-is-a-pipe]")),
    ExitCodeRow("run", ExitCode.INTERRUPTED, "Ctrl-C or SIGTERM, from the component check on: every planned cell is in the reports, unfinished ones as errors saying so; a second signal does not cut the reports short", (f"{RUNS}::test_two_quick_interrupts_keep_every_test_of_the_cell", f"{RUNS}::test_a_signal_during_the_component_check_exits_130_with_every_cell_reported")),
    ExitCodeRow("sensitivity", ExitCode.PASSED, "every chosen mutant was caught wherever it applies", ("tests/sensitivity/test_sensitivity.py::test_every_chosen_mutant_caught_exits_zero_with_the_table",)),
    ExitCodeRow("sensitivity", ExitCode.FAILED, "a mutant was missed or errored in a cell where it ran", ("tests/sensitivity/test_sensitivity.py::test_a_mutant_that_acted_unseen_is_missed_and_one_that_could_not_be_seen_is_n_a",)),
    ExitCodeRow("sensitivity", ExitCode.USAGE, "matrix.toml, a filter or --mutants cannot apply", (f"{CORPUS}[sensitivity-shard]",)),
    ExitCodeRow("sensitivity", ExitCode.INTERRUPTED, "Ctrl-C or SIGTERM; the finished runs are kept (each is a `run`, as above)", (f"{RUNS}::test_two_quick_interrupts_keep_every_test_of_the_cell",)),
    ExitCodeRow("report", ExitCode.PASSED, "the reports are written, whatever the tests did (a symlink planted at a report's name is replaced, never written through)", ("tests/hostile/test_runs.py::test_a_sigkilled_runner_leaves_no_process_and_report_rebuilds_every_cell", "tests/hostile/test_corpus.py::test_report_replaces_symlinks_planted_at_its_reports")),
    ExitCodeRow("report", ExitCode.USAGE, "not a run directory, an unreadable or hostile file in it (truncated XML, an entity bomb, a directory or pipe for a cell report), a directory where a report goes (a cell report it would rebuild, summary.md, results.json, junit.xml), a named pipe or device at a plan.json or .run.lock (refused, never waited on), or a run still running", (f"{CORPUS}[report-plan-is-a-pipe]", f"{CORPUS}[report-lock-is-a-pipe]", f"{CORPUS}[report-billion-laughs]", f"{RUNS}::test_a_second_runner_and_a_report_during_the_run_are_refused", f"{CORPUS}[report-cell-report-is-a-directory]", f"{CORPUS}[report-planned-cell-report-is-a-directory]", f"{CORPUS}[report-summary-is-a-directory]")),
    ExitCodeRow("report", ExitCode.FAILED, "with `--check-upgrade` (as `nox -s report` passes it): an upgrade diff of the run holds any cause `compare` exits 1 on (below), a broken checkpoint direction between its versions included; stderr names the causes. A nightly or rc candidate's diff counts only with `[report] prerelease_blocks` or `--prerelease-blocks`", ("tests/suites/test_cross_version.py::test_unreadable_rollback_is_reported_with_its_root_cause_and_fails_compare", f"{PRERELEASE}::test_report_check_upgrade_blocks_on_a_nightly_only_with_the_flag")),
    ExitCodeRow("cross-read", ExitCode.PASSED, "every version read the other versions' cross_version checkpoints exactly, or had none to read, or has no interpreter on this machine (its gpu_matrix venv, or --python) or is not in this matrix.toml: one line each, and that version's reads keep what an earlier pass recorded (not checked where none ran); nothing the run directory names is run", ("tests/suites/test_cross_version.py::test_reference_checkpoints_load_exactly_both_ways", "tests/suites/test_cross_version.py::test_missing_writes_are_not_checked_never_passed", "tests/hostile/test_corpus.py::test_cross_read_runs_no_interpreter_the_run_directory_names")),
    ExitCodeRow("cross-read", ExitCode.FAILED, "a version could not load, or loaded different values from, a checkpoint another version wrote", ("tests/suites/test_cross_version.py::test_unreadable_rollback_is_reported_with_its_root_cause_and_fails_compare",)),
    ExitCodeRow("cross-read", ExitCode.USAGE, "not a run directory (no torch-*/plan.json), a plan.json that cannot be read, or is a named pipe (the other versions still read), a --python that is not an executable, or a version's read pass was refused (its run's plan.json is missing or malformed; a folder it clears, writes or reads, such as `torch-V/reads`, `reads/logs` or `checkpoints`, is a symlink: nothing the link points to is touched)", (f"{CORPUS}[cross-read-not-a-run-directory]", f"{CORPUS}[cross-read-not-a-run]", f"{CORPUS}[cross-read-truncated-plan]", f"{CORPUS}[cross-read-plan-is-a-pipe]", f"{FOREIGN}::test_cross_read_refuses_a_linked_reads_folder_and_deletes_nothing_it_points_to")),
    ExitCodeRow("compare", ExitCode.PASSED, "no regression, no grown drift, no slower suite, no change left unconfirmed (newly skipped tests, and a change whose failure passed alone, are listed but do not count)", (f"{VERDICTS}[compare-failure-passed-alone]",)),
    *(ExitCodeRow("compare", ExitCode.FAILED, cause.meaning, COMPARE_FAILURES[cause.name]) for cause in FAIL_CAUSES),
    ExitCodeRow("compare", ExitCode.USAGE, "an unreadable or malformed run (a named pipe at a plan.json is refused, never waited on), runs without a torch version in common, runs that share no test, or an --out that is a directory or in one that does not exist", (f"{VERDICTS}[compare-no-shared-test]", f"{CORPUS}[compare-results-truncated]", f"{CORPUS}[compare-plan-is-a-pipe]", f"{CORPUS}[compare-out-is-a-directory]", f"{CORPUS}[compare-out-in-a-missing-directory]")),
    ExitCodeRow("bisect", ExitCode.PASSED, "every regression and broken checkpoint direction it searched got an answer: a `first bad:` line (a release, or a range where releases around it did not install or did not import torch)", ("tests/bisect/test_bisect_e2e.py::test_first_bad_found_with_the_fewest_installs", "tests/bisect/test_bisect_e2e.py::test_releases_that_do_not_install_or_import_are_skipped_with_their_reasons", "tests/bisect/test_bisect_e2e.py::test_a_rollback_break_is_bisected_to_the_first_release_whose_checkpoint_the_baseline_cannot_read", "tests/bisect/test_bisect_directions.py::test_good_and_bad_pins_check_both_directions_first_then_search_the_broken_one")),
    ExitCodeRow("bisect", ExitCode.FAILED, "a search stopped without an answer: a flaky or order-dependent verdict, a release whose checkpoint write failed (a direction's search), or no release between the pins could be judged", ("tests/bisect/test_bisect_e2e.py::test_a_flaky_middle_release_stops_the_search", "tests/bisect/test_bisect_directions.py::test_a_release_that_cannot_write_stops_the_search_with_the_writes_failure")),
    ExitCodeRow("bisect", ExitCode.USAGE, "pins missing, out of order or not versions; --from without a confirmed regression or broken checkpoint direction; --good/--bad where no test regressed and every checkpoint loaded exactly both ways; the baseline of a direction's steps did not install or import; --shard; a selection that keeps no cell; the envdir held by a matrix run; --reports or --envdir naming a file; an index pip cannot list (pip's reason); no bisect-<id>/ is left behind", ("tests/bisect/test_bisect_cli.py::test_a_usage_error_is_one_line_and_exit_2", "tests/bisect/test_bisect_cli.py::test_a_matrix_run_holding_the_envdir_keeps_bisect_out", "tests/bisect/test_bisect_cli.py::test_bisect_from_a_run_without_regressions_leaves_no_directory", "tests/bisect/test_bisect_cli.py::test_an_index_pip_cannot_list_is_an_error_with_pips_reason", "tests/bisect/test_bisect_directions.py::test_pins_whose_checkpoints_load_both_ways_are_refused_saying_so", "tests/bisect/test_bisect_directions.py::test_a_release_that_does_not_install_is_stepped_around_and_the_baseline_must_install")),
    ExitCodeRow("bisect", ExitCode.INTERRUPTED, "Ctrl-C or SIGTERM: the step's processes are ended (process group), bisect.md and bisect.json hold what was decided; the steps already run keep their run directories", ("tests/bisect/test_bisect_cli.py::test_an_interrupted_bisect_exits_130_with_one_line", "tests/bisect/test_bisect_e2e.py::test_sigterm_ends_the_steps_processes_and_exits_130_with_what_was_decided")),
    ExitCodeRow("repro", ExitCode.PASSED, "the reproducer directory is written whole (repro.py, command.txt, cell.json, collect_env.txt, README.md); for a cross_version read, a torch-only repro.py run with the writer's and the reader's Python; without --config it reads matrix.toml here and runs this machine's venvs, never the matrix path or an interpreter the run directory holds", ("tests/bisect/test_bisect_e2e.py::test_the_reproducer_fails_without_torchmatrix_as_the_run_did_and_passes_on_the_good_release", "tests/bisect/test_bisect_cli.py::test_repro_replaces_its_own_directory_and_reads_past_a_truncated_bisect_json", "tests/bisect/test_cross_version_repro.py::test_the_reproducer_is_torch_only_and_holds_the_failure_as_data", f"{FOREIGN}::test_repro_without_config_runs_no_python_beside_the_matrix_the_run_recorded")),
    ExitCodeRow("repro", ExitCode.USAGE, "not a run directory, or a named pipe at its plan.json; the test id is not a confirmed failure of the run (the line lists those that are); --out naming a file or a directory holding files repro did not write (nothing is written)", ("tests/bisect/test_bisect_cli.py::test_repro_names_the_confirmed_failures_when_the_id_is_not_one", f"{CORPUS}[repro-plan-is-a-pipe]", "tests/bisect/test_bisect_cli.py::test_repro_out_refuses_a_file_or_a_directory_it_did_not_write")),
    ExitCodeRow("merge", ExitCode.PASSED, "merged, and every test passed or was skipped; copied checkpoint files keep their permission bits", ("tests/hostile/test_verdicts.py::test_a_refused_merge_leaves_out_as_it_was_and_the_corrected_one_passes", f"{FOREIGN}::test_merge_keeps_each_checkpoint_files_mode")),
    ExitCodeRow("merge", ExitCode.FAILED, "merged, and a test failed or errored, or a planned cell had no report (it errors saying which shard); a nightly or rc version's failures only with [report] prerelease_blocks or --prerelease-blocks", ("tests/scale/test_scale_out.py::test_a_missing_shard_becomes_errored_cells_that_say_so", "tests/reports/test_prerelease_reports.py::test_a_merged_run_whose_only_failures_are_a_nightlys_exits_0_unless_it_blocks")),
    ExitCodeRow("merge", ExitCode.USAGE, "refused before writing anything: a cell reported twice, a report of another matrix.toml, an unsafe name, an unreadable file, a named pipe at a plan.json, shards of one version run on different torch builds or devices (the line names both), a symlink or pipe among a shard's checkpoints or reads (nothing it points to is copied); or --out could not be written (a full or read-only disk: one line naming why, and what it had written is removed, so the same merge works once there is room)", (f"{FOREIGN}::test_merge_onto_a_full_or_read_only_disk_is_one_line_and_the_retry_works", f"{FOREIGN}::test_merge_refuses_shards_of_one_version_on_different_builds_naming_both", f"{CORPUS}[merge-truncated-cell-xml]", f"{CORPUS}[merge-plan-is-a-pipe]", "tests/scale/test_scale_out.py::test_duplicate_reports_are_refused", f"{FOREIGN}::test_merge_refuses_a_symlink_in_a_shard_and_copies_nothing_it_points_to")),
    ExitCodeRow("github-matrix", ExitCode.PASSED, "the job matrix is printed (never empty)", ("tests/scale/test_scale_out.py::test_github_matrix_has_one_job_per_version_and_shard",)),
    ExitCodeRow("github-matrix", ExitCode.USAGE, "matrix.toml or a filter cannot apply, only `system` is listed, or over 256 jobs", (f"{CORPUS}[github-matrix-only-system]",)),
    ExitCodeRow("archive", ExitCode.PASSED, "the release wrote at least one form of the checkpoint archive; the forms it could not write are printed with why", ("tests/commands/test_archive_command.py::test_prints_what_the_release_wrote_and_why_not",)),
    ExitCodeRow("archive", ExitCode.FAILED, "the release wrote no form (each printed with why), or the writer died before its manifest", ("tests/commands/test_archive_command.py::test_a_release_that_wrote_nothing_exits_1",)),
    ExitCodeRow("archive", ExitCode.USAGE, "--to is a file or lies under one, matrix.toml cannot apply, or the release did not install into its venv", ("tests/commands/test_archive_command.py::test_a_to_that_is_a_file_exits_2",)),
    ExitCodeRow("slurm", ExitCode.PASSED, "the sbatch scripts are written", ("tests/hostile/test_corpus.py::test_slurm_values_that_pass_are_plain",)),
    ExitCodeRow("slurm", ExitCode.USAGE, "matrix.toml, a filter, --partition or --time cannot apply", (f"{CORPUS}[slurm-partition-newline]",)),
)  # fmt: skip


def render_markdown() -> str:
    """docs/reference/exit-codes.md."""
    lines = [
        "# Exit codes",
        "",
        "What each `python -m torchmatrix` command can exit with (nox passes the code through). Exit 2 ends with",
        "one line, `torchmatrix: error: ...` (or argparse's), that says what to change, never a traceback. Generated",
        "from `torchmatrix/exit_code_table.py`; `tests/test_exit_codes.py` checks that this page matches it and that the",
        "tests each row names (under `tests/`) exist; each of them provokes that exit.",
        "",
        "| command | exit | meaning | provoked by |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {_command(row.command)} | {int(row.code)} | {row.meaning} | {_tests(row.provoked_by)} |"
        for row in EXIT_CODES
    ]
    return "\n".join(lines) + "\n"


def _tests(node_ids: tuple[str, ...]) -> str:
    return "<br>".join(f"`{node.removeprefix('tests/')}`" for node in node_ids)


def _command(name: str) -> str:
    return name if " " in name else f"`{name}`"
