"""pytest processes forked from one interpreter that imported torch once per run and version.

Every pytest process a run starts imports torch's distributed stack before its first test (its
zygote and ranks are forks of it): about 3.3 CPU seconds each on the 2-core machine, paid again by
each world size's process and each confirmation re-run. A run now starts one preloaded interpreter
beside it (`serve`) and asks it for each pytest process; it forks twice, so the pytest process is
re-parented to the runner (a child subreaper, `leftover_processes.adopt_orphans`), which waits for
it, kills it and reads its exit code as it would a process it started itself.

A process is forked only where that is the same as starting it: on Linux with the runner a child
subreaper, in the interpreter's own environment and directory, while the interpreter runs no other thread and has not initialized
CUDA (it never calls into it). Anything else, and a launcher's processes (torchrun, srun), starts
as before.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import json
import os
import runpy
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path

from torchmatrix import file_writes
from torchmatrix.ranks import zygote
from torchmatrix.ranks.fresh_fork import close_files_except, run_then_leave
from torchmatrix.run.leftover_processes import adopts_orphans

SERVE = "from torchmatrix.run.pytest_forks import serve; serve()"
ANSWER_TIMEOUT_S = 300.0  # the first answer waits for the torch import; a hung import falls back


class ForkedProcess:
    """A pytest process the preloaded interpreter forked and this runner adopted, with the part of
    `subprocess.Popen` the scheduler uses: pid, poll, wait, returncode."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


class PytestForks:
    """The runner's side: one preloaded interpreter, started at the first request, asked for each
    pytest process; None from `start` where it cannot fork one (the caller starts it itself)."""

    def __init__(self, log: Path):
        self.log = log
        self.server: subprocess.Popen | None = None
        self.started_in: tuple[Path, dict] | None = None
        self.usable = adopts_orphans()  # else a fork would be re-parented to init, not to this runner

    def start(self, command: list[str], *, cwd: Path, env: dict, log: Path) -> ForkedProcess | None:
        """`command` (`python -m pytest ARGS`) as a fork writing to `log`, or None."""
        if not self.usable or command[:3] != [sys.executable, "-m", "pytest"]:
            return None
        if self.server is None:
            self._start_server(cwd, env)
        if self.started_in != (cwd, env):
            return None
        request = {"args": command[3:], "log": str(log)}
        try:
            self.server.stdin.write(json.dumps(request) + "\n")
            self.server.stdin.flush()
            answer = self._answer()
        except (OSError, ValueError):
            answer = None
        if answer is None:
            self.close()
            self.usable = False
            return None
        return ForkedProcess(answer) if answer > 0 else None

    def _start_server(self, cwd: Path, env: dict) -> None:
        self.started_in = (cwd, dict(env))
        with file_writes.open_stream(self.log, "ab") as errors:
            self.server = subprocess.Popen(
                [sys.executable, "-c", SERVE],
                cwd=cwd,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=errors,
                text=True,
                start_new_session=True,
            )

    def _answer(self) -> int | None:
        """The forked pid, 0 where the interpreter declined this request, None where it is gone or hung."""
        ready, _, _ = select.select([self.server.stdout], [], [], ANSWER_TIMEOUT_S)
        line = self.server.stdout.readline() if ready else ""
        return int(line) if line.strip().lstrip("-").isdigit() else None

    def close(self) -> None:
        """Stop the preloaded interpreter (the processes it forked are the runner's and run on)."""
        if self.server is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.server.pid, signal.SIGKILL)
        self.server.wait()
        for stream in (self.server.stdin, self.server.stdout):
            with contextlib.suppress(OSError):
                stream.close()
        self.server = None


def serve() -> None:
    """The preloaded interpreter: import torch's distributed stack and pytest, then fork a pytest
    process for each request line on stdin and answer its pid (0: start it yourself)."""
    from torchmatrix.ranks.parent_death import exit_with_parent

    exit_with_parent()
    with contextlib.suppress(Exception):  # a broken torch fails in each pytest process, as before
        zygote.import_preload()
        importlib.import_module("pytest")  # not the plugin: pytest imports it, to rewrite its asserts
    gc.freeze()  # what it imported is never collected in a fork, nor copied by a collection's writes
    for line in sys.stdin:
        pid = _fork(json.loads(line)) if threading.active_count() == 1 else 0
        print(pid, flush=True)


def _fork(request: dict) -> int:
    """Fork twice and return the grandchild's pid once its parent has exited, so that it is
    re-parented to the runner before it runs anything."""
    read, write = os.pipe()
    first = os.fork()
    if first == 0:
        try:
            os.close(read)
            second = os.fork()
            if second:
                os.write(write, str(second).encode())
            else:
                while os.getppid() == first:
                    os.sched_yield()
                _run_pytest(request)
        finally:
            os._exit(0)
    os.close(write)
    answer = os.read(read, 32)
    os.close(read)
    os.waitpid(first, 0)
    return int(answer or 0)


def _run_pytest(request: dict) -> None:
    """In the grandchild: become what `python -m pytest ARGS` started by the runner would be (its own
    session, output into the log, nothing of the interpreter's open), run pytest, exit as it would."""
    run_then_leave(lambda: _pytest_into_log(request), _exit_as_an_interpreter)


def _pytest_into_log(request: dict) -> None:
    os.setsid()
    log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    close_files_except({0, 1, 2})
    sys.path[0] = os.getcwd()  # as `python -m` sets it; `-c` left ""
    sys.argv = ["pytest", *request["args"]]
    runpy.run_module("pytest", run_name="__main__", alter_sys=True)


def _exit_as_an_interpreter(code: int) -> None:
    """What an interpreter does on its way out that os._exit skips: wait for non-daemon threads,
    run the exit handlers (multiprocessing's stop the zygote), flush the streams."""
    with contextlib.suppress(BaseException):
        for thread in threading.enumerate():
            if thread is not threading.main_thread() and not thread.daemon:
                thread.join()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)
