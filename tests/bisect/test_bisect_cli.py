"""`torchmatrix bisect` and `torchmatrix repro` refuse what they cannot do in one line, exit 2, before installing anything."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from torchmatrix import cli
from torchmatrix.env.envdir_lock import lock_envdir

from conftest import checkout_env, write_demo_project
from reports_fixture import write_fixture_run


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
    ],
)
def test_a_usage_error_is_one_line_and_exit_2(tmp_path, args, says):
    write_demo_project(tmp_path, axes={"world_size": [1]})
    (tmp_path / "reports" / "x").mkdir(parents=True)
    done = torchmatrix(tmp_path, "bisect", "--envdir", str(tmp_path / ".nox"), *args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert says in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


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

    monkeypatch.setattr(cli, "run_bisect", interrupted)
    monkeypatch.chdir(tmp_path)
    code = cli.main(["bisect", "--envdir", str(tmp_path / ".nox"), "--good", "2.13.0", "--bad", "2.14.1"])
    assert code == 130
    assert capsys.readouterr().err.strip() == "torchmatrix bisect: interrupted"
