"""Matrix runs sharing a nox envdir: installing runs exclude every other, reusing runs (`-R`, the
Slurm array tasks) share; nox's -s, -k and -t select the runs that lock as nox selects sessions."""

from __future__ import annotations

import errno
import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchmatrix import sessions
from torchmatrix.env.envdir_lock import (
    EnvdirBusy,
    MatrixSession,
    envdir_of,
    lock_envdir,
    reuses_venvs_only,
    runs_matrix_sessions,
)

from helpers.checkout import REPO, checkout_env

HOLD = """
import sys
from torchmatrix import sessions
fd = sessions.lock_envdir_or_exit(sys.argv[1:], {"gpu_matrix": ("2.13.0", "system")})
print("locked" if fd is not None else "unlocked", flush=True)
sys.stdin.readline()
"""
INSTALL = ["-s", "gpu_matrix"]
REUSE = ["-R", "-s", "gpu_matrix(torch='2.13.0')"]  # what the Slurm array tasks run


def _holder(envdir: Path, argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", HOLD, *argv, "--envdir", str(envdir)],
        env=checkout_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.parametrize(
    ("first", "second", "refused"),
    [(INSTALL, INSTALL, True), (REUSE, REUSE, False), (REUSE, INSTALL, True), (INSTALL, REUSE, True)],
    ids=["install-install", "reuse-reuse", "reuse-then-install", "install-then-reuse"],
)
def test_two_processes_on_one_envdir(tmp_path, first, second, refused):
    holder = _holder(tmp_path / ".nox", first)
    try:
        assert holder.stdout.readline() == "locked\n", holder.stderr.read()
        other = _holder(tmp_path / ".nox", second)
        out, err = other.communicate(timeout=60)
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    if refused:
        assert other.returncode == 2, err
        assert err.count("\n") == 1 and err.startswith("torchmatrix: error: another matrix run (pid "), err
        assert f"pid {holder.pid} on " in err and "wait for it to finish, or give this one its own --envdir" in err
    else:
        assert (other.returncode, out) == (0, "locked\n"), err


def test_the_lock_is_released_with_its_holder(tmp_path):
    fd = lock_envdir(tmp_path / ".nox")
    with pytest.raises(EnvdirBusy, match=f"another matrix run \\(pid {os.getpid()} on "):
        lock_envdir(tmp_path / ".nox", shared=True)
    lock_envdir(tmp_path / "other-envdir")  # separate venvs: no conflict
    os.close(fd)
    os.close(lock_envdir(tmp_path / ".nox"))


def test_readers_that_left_are_not_named(tmp_path):
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / ".nox").mkdir()
    (tmp_path / ".nox" / "torchmatrix-matrix.lock").write_text(
        f"pid {gone.stdout.strip()} on {os.uname().nodename}, reusing, started earlier\n"
    )
    reader = lock_envdir(tmp_path / ".nox", shared=True)
    try:
        with pytest.raises(EnvdirBusy) as refused:
            lock_envdir(tmp_path / ".nox")
        assert f"pid {gone.stdout.strip()} " not in str(refused.value)
        assert f"pid {os.getpid()} on " in str(refused.value)
    finally:
        os.close(reader)


def test_a_file_system_without_flock_warns_and_runs_unlocked(tmp_path, monkeypatch, capsys):
    def no_flock(fd, operation):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_flock)
    argv = [*INSTALL, "--envdir", str(tmp_path / ".nox")]
    assert sessions.lock_envdir_or_exit(argv, {"gpu_matrix": ("2.13.0",)}) is None
    warning = capsys.readouterr().err
    assert warning.count("\n") == 1 and warning.startswith("torchmatrix: warning: the file system of "), warning
    assert "No locks available; NFS without flock?" in warning


def test_nox_dash_k_takes_the_lock_through_the_noxfile(tmp_path):
    """The noxfile itself: `nox -k gpu_matrix` is refused while an install holds the envdir."""
    fd = lock_envdir(tmp_path / "nox")
    try:
        done = subprocess.run(
            [sys.executable, "-m", "nox", "-f", str(REPO / "noxfile.py"), "--envdir", str(tmp_path / "nox")]
            + ["-R", "-k", "gpu_matrix and not hf"],
            env=checkout_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        os.close(fd)
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"another matrix run (pid {os.getpid()} on " in done.stderr


MATRIX = [
    MatrixSession.parametrized("gpu_matrix", ["2.13.0", "2.14.1"]),
    MatrixSession.parametrized("hf_matrix", ["2.13.0"], tags=["hf"]),
]


@pytest.mark.parametrize(
    ("argv", "locks"),
    [
        ([], True),
        (["-s", "gpu_matrix"], True),
        (["-R", "-s", "gpu_matrix(torch='2.13.0')", "--", "-k", "x"], True),
        (["-s", "tests", "hf_matrix"], True),
        (["-s", "report"], False),
        (["-s", "tests"], False),
        (["-s", "tests", "--", "-s", "gpu_matrix"], False),
        (["-l"], False),
        (["--list", "-s", "gpu_matrix"], False),
        (["-k", "gpu"], True),
        (["-k", "2.14"], True),
        (["--keywords=matrix and not hf"], True),
        (["-k", "tests or lint"], False),
        (["-k", "not matrix"], False),
        (["-t", "hf"], True),
        (["--tags", "slow", "hf"], True),
        (["-t", "lint"], False),
        (["-t", "hf", "-k", "gpu"], False),
        (["-k", "tests", "-s", "gpu_matrix"], False),  # nox ignores -s when -k or -t is given
    ],
)
def test_which_nox_command_lines_take_the_lock(argv, locks):
    assert runs_matrix_sessions(argv, MATRIX) is locks


@pytest.mark.parametrize(
    ("argv", "shared"),
    [
        (["-R", "-s", "gpu_matrix"], True),
        (["-r", "--no-install"], True),
        (["--reuse-venv=yes", "--no-install"], True),
        (["--reuse-venv", "always", "--no-install"], True),
        (["-s", "gpu_matrix"], False),
        (["-r", "-s", "gpu_matrix"], False),  # reuses, but installs into the venv
        (["--no-install"], False),  # recreates the venv
        (["-R", "-N"], False),
        (["--reuse-venv=no", "--no-install"], False),
        (["--install-only", "-s", "gpu_matrix"], False),  # the Slurm setup job
        (["-s", "gpu_matrix", "--", "-R"], False),
    ],
)
def test_which_runs_only_reuse_venvs(argv, shared):
    assert reuses_venvs_only(argv) is shared


def test_the_lock_lives_in_the_envdir_nox_uses(tmp_path):
    assert envdir_of(["-s", "gpu_matrix"], tmp_path) == tmp_path / ".nox"
    assert envdir_of(["--envdir", "/x/venvs", "-s", "gpu_matrix"], tmp_path) == Path("/x/venvs")
    assert envdir_of(["--envdir=venvs"], tmp_path) == tmp_path / "venvs"
