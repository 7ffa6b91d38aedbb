"""`torchmatrix bisect` and `torchmatrix repro` refuse what they cannot do in one line, exit 2, before installing anything."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from torchmatrix import cli
from torchmatrix.bisect.versions import index_listing
from torchmatrix.commands import bisect as bisect_command
from torchmatrix.env.channel_install import IndexUnlisted
from torchmatrix.env.envdir_lock import lock_envdir
from torchmatrix.repro.output_directory import MARK, is_reproducer, publish

from helpers.checkout import checkout_env
from helpers.matrix_files import write_demo_project
from helpers.report_runs import BASELINE, write_fixture_run

FAILURE = "2.14.1/ws2-fsdp2/alpha::test_regress"


def torchmatrix(cwd, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "torchmatrix", *args], cwd=cwd, env=checkout_env(), capture_output=True, text=True
    )


@pytest.mark.parametrize(
    "args, says",
    [
        (["--good", "2.13.0"], "pass --good VERSION and --bad VERSION, or --from RUN"),
        (["--from", "reports/x", "--good", "2.13.0"], "--from RUN takes the run's regressions"),
        (["--from", "reports/none"], "is not a run directory"),
        (["--good", "2.15.0", "--bad", "2.13.0"], "not older than"),
        (["--good", "2.13.0", "--bad", "2.14.1", "--shard", "1/2"], "--shard does not apply"),
        (["--good", "2.13.0", "--bad", "2.14.1", "--reports", "afile"], "afile is a file, not a directory"),
        (["--good", "2.13.0", "--bad", "2.14.1", "--reports", "afile/deeper"], "afile is a file, not a directory"),
        (["--good", "2.13.0", "--bad", "2.14.1", "--envdir", "afile"], "afile is a file, not a directory"),
    ],
)
def test_a_usage_error_is_one_line_and_exit_2(tmp_path, args, says):
    write_demo_project(tmp_path, axes={"world_size": [1]})
    (tmp_path / "reports" / "x").mkdir(parents=True)
    (tmp_path / "afile").write_text("a file\n")
    before = sorted(tmp_path.rglob("*"))
    done = torchmatrix(tmp_path, "bisect", "--envdir", str(tmp_path / ".nox"), *args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert says in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert sorted(tmp_path.rglob("*")) == before  # no bisect-<id>/, no envdir


def test_bisect_from_a_run_without_regressions_leaves_no_directory(tmp_path):
    run_dir = write_fixture_run(tmp_path / "project", versions=(BASELINE,))
    before = sorted(run_dir.rglob("*"))
    done = torchmatrix(tmp_path / "project", "bisect", "--envdir", str(tmp_path / ".nox"), "--from", str(run_dir))
    assert done.returncode == 2 and "no confirmed regression" in done.stderr, done.stdout + done.stderr
    assert sorted(run_dir.rglob("*")) == before


def test_a_matrix_run_holding_the_envdir_keeps_bisect_out(tmp_path):
    write_demo_project(tmp_path, axes={"world_size": [1]})
    held = lock_envdir(tmp_path / ".nox")
    try:
        done = torchmatrix(
            tmp_path, "bisect", "--envdir", str(tmp_path / ".nox"), "--good", "2.13.0", "--bad", "2.14.1"
        )
    finally:
        os.close(held)
    assert done.returncode == 2
    assert f"pid {os.getpid()}" in done.stderr and "give this one its own --envdir" in done.stderr


def test_repro_names_the_confirmed_failures_when_the_id_is_not_one(tmp_path):
    run_dir = write_fixture_run(tmp_path / "project")
    done = torchmatrix(tmp_path, "repro", str(run_dir), "2.14.1/ws1-none/alpha::test_ok")
    assert done.returncode == 2
    assert "is not a confirmed failure" in done.stderr and "2.14.1/ws2-fsdp2/alpha::test_regress" in done.stderr


def test_run_test_names_a_suite_of_the_selection(tmp_path):
    write_demo_project(tmp_path, axes={"world_size": [1]})
    done = torchmatrix(tmp_path, "run", "--torch", "system", "--test", "nosuch::test_x")
    assert done.returncode == 2
    assert "--test nosuch::test_x: no suite 'nosuch' in this run; its suites: demo" in done.stderr
    malformed = torchmatrix(tmp_path, "run", "--torch", "system", "--test", "test_x")
    assert malformed.returncode == 2 and "write it as SUITE::TEST" in malformed.stderr


def test_an_interrupted_bisect_exits_130_with_one_line(tmp_path, monkeypatch, capsys):
    write_demo_project(tmp_path, axes={"world_size": [1]})

    def interrupted(request):
        raise KeyboardInterrupt

    monkeypatch.setattr(bisect_command, "run_bisect", interrupted)
    monkeypatch.chdir(tmp_path)
    code = cli.main(["bisect", "--envdir", str(tmp_path / ".nox"), "--good", "2.13.0", "--bad", "2.14.1"])
    assert code == 130
    assert capsys.readouterr().err.strip() == "torchmatrix bisect: interrupted"


def repro(run_dir, *args: str) -> subprocess.CompletedProcess:
    """`torchmatrix repro` of the fixture run's regression; collect_env's interpreter is one that prints nothing."""
    return torchmatrix(run_dir.parent.parent, "repro", str(run_dir), FAILURE, "--python", "/bin/true", *args)


def test_repro_out_refuses_a_file_or_a_directory_it_did_not_write(tmp_path):
    run_dir = write_fixture_run(tmp_path / "project")
    afile = tmp_path / "notes.txt"
    afile.write_text("mine\n")
    project_like = tmp_path / "checkout"
    project_like.mkdir()
    (project_like / "README.md").write_text("# my project\n")
    for out, says in [
        (afile, "is not a directory"),
        (afile / "sub", "is not a directory"),
        (project_like, "did not write"),
    ]:
        before = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
        done = repro(run_dir, "--out", str(out))
        assert done.returncode == 2, done.stdout + done.stderr
        assert says in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()} == before


def test_repro_replaces_its_own_directory_and_reads_past_a_truncated_bisect_json(tmp_path):
    run_dir = write_fixture_run(tmp_path / "project")
    (run_dir / "bisect-old").mkdir()
    (run_dir / "bisect-old" / "bisect.json").write_text('{"regressions": [{"suite": "alpha", "te')
    (run_dir / "bisect-older").mkdir()
    (run_dir / "bisect-older" / "bisect.json").write_text('{"regressions": [["an", "old", "shape"]]}')
    out = tmp_path / "repro"
    for _ in range(2):  # the second replaces what the first wrote
        done = repro(run_dir, "--out", str(out))
        assert done.returncode == 0, done.stdout + done.stderr
        assert sorted(p.name for p in out.iterdir()) == [
            "README.md",
            "cell.json",
            "collect_env.txt",
            "command.txt",
            "repro.py",
        ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["project", "repro"]  # no staging directory left


def test_a_crash_while_writing_leaves_neither_the_directory_nor_its_parents(tmp_path):
    out = tmp_path / "new" / "repro"
    with pytest.raises(OSError):
        publish(out, {"repro.py": "#!/usr/bin/env python3\n", "missing-dir/README.md": "x"})
    assert list(tmp_path.iterdir()) == []


def test_a_directory_is_a_reproducer_only_with_repro_pys_mark_and_nothing_else(tmp_path):
    names = {"repro.py", "README.md"}
    (tmp_path / "README.md").write_text("# theirs\n")
    assert not is_reproducer(tmp_path, names)  # no repro.py
    (tmp_path / "repro.py").write_text("#!/usr/bin/env python3\nprint('theirs')\n")
    assert not is_reproducer(tmp_path, names)  # a repro.py without the mark
    (tmp_path / "repro.py").write_text(f"#!/usr/bin/env python3\n{MARK}\n")
    assert is_reproducer(tmp_path, names)
    (tmp_path / "notes.md").write_text("theirs\n")
    assert not is_reproducer(tmp_path, names)  # the mark, and a file repro does not write


def test_an_index_pip_cannot_list_is_an_error_with_pips_reason(monkeypatch):
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    with pytest.raises(IndexUnlisted, match="No matching distribution found for torch"):
        index_listing("http://127.0.0.1:9/simple", prereleases=False)
