"""Processes forked from one interpreter that imported torch once per run and version, so each
pytest process and the component check skip torch's import (docs/explanation/performance.md, "Per run").

A process is forked only where that is the same as starting it: `python -m MODULE ARGS` or
`python -c CODE ARGS`, on Linux with the runner a child subreaper, in the interpreter's own
environment and directory, while the interpreter runs no other thread and has not initialized CUDA.
Forked twice, the process is re-parented to the runner, which waits for it, kills it and reads its
exit code as it would a process it started itself; anything else, and a launcher's processes
(torchrun, srun), starts as before. Each fork seeds Python's `random` and numpy's global generator
anew, as a started process would.

A runner whose own process imported the preload already (`preload_here`: a long-lived process that
starts many runs as forks of itself, like the test session's) forks the interpreter from itself instead
of starting one, where that too is the same as starting it.
"""

from __future__ import annotations

import atexit
import builtins
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
import tempfile
import threading
import time
from pathlib import Path

from torchmatrix import file_writes
from torchmatrix.forks import zygote
from torchmatrix.forks.fresh_fork import close_files_except, reseed_global_generators, run_then_leave
from torchmatrix.forks.leftover_processes import adopts_orphans
from torchmatrix.forks.parent_death import PARENT_PID_VARIABLE

SERVE = "from torchmatrix.forks.preloaded_forks import serve; serve()"
ANSWER_TIMEOUT_S = 300.0  # the first answer waits for the torch import; a hung import falls back
POLL_S = 0.01  # how often a wait with a timeout looks at a forked process
RUN_VARIABLES = ("PYTHONPATH", PARENT_PID_VARIABLE)  # what a run's environment adds to the runner's

_preloaded: dict | None = None  # what `preload_here` found once it had imported the preload


def preload_here() -> None:
    """Import the preload into this process, whose forks then run torchmatrix: a run forked from it
    forks its preloaded interpreter from itself instead of starting one that imports it again."""
    global _preloaded
    _import_preload()
    _preloaded = {"environ": dict(os.environ), "exit_handlers": atexit._ncallbacks()}


def _import_preload() -> None:
    with contextlib.suppress(Exception):  # a broken torch fails in each pytest process, as before
        zygote.import_preload()
        importlib.import_module("pytest")  # not the plugin: pytest imports it, to rewrite its asserts


class ForkedProcess:
    """A process the preloaded interpreter forked and this runner adopted, with the part of
    `subprocess.Popen` the runner uses: pid, poll, wait, returncode."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if timeout is not None:
            deadline = time.monotonic() + timeout
            while self.poll() is None:
                if time.monotonic() >= deadline:
                    raise subprocess.TimeoutExpired(f"fork {self.pid}", timeout)
                time.sleep(POLL_S)
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


class PreloadedForks:
    """The runner's side: one preloaded interpreter, started at the first request, asked for each
    process; None from `start` where it cannot fork one (the caller starts it itself)."""

    def __init__(self, log: Path):
        self.log = log
        self.server: subprocess.Popen | None = None
        self.server_output = None
        self.started_in: tuple[Path, dict] | None = None
        self.usable = adopts_orphans()  # else a fork would be re-parented to init, not to this runner

    def start(
        self,
        command: list[str],
        *,
        cwd: Path,
        env: dict,
        log: Path,
        errors: Path | None = None,
        answer_timeout: float = ANSWER_TIMEOUT_S,
    ) -> ForkedProcess | None:
        """`command` (`python -m MODULE ARGS` or `python -c CODE ARGS`) as a fork appending its output
        to `log` and its errors to `errors` (default: `log`; both exist), or None; None too where the
        interpreter has not answered within `answer_timeout` seconds (its imports hung)."""
        if not self.usable or len(command) < 3 or command[0] != sys.executable or command[1] not in ("-m", "-c"):
            return None
        if self.server is None:
            self._start_server(cwd, env)
        if self.started_in != (cwd, env):
            return None
        request = {"args": command[1:], "log": str(log), "errors": str(errors or log)}
        try:
            self.server.stdin.write(json.dumps(request) + "\n")
            self.server.stdin.flush()
            answer = self._answer(answer_timeout)
        except (OSError, ValueError):
            answer = None
        if answer is None:
            self.close()
            self.usable = False
            return None
        return ForkedProcess(answer) if answer > 0 else None

    def prepare(self, cwd: Path, env: dict) -> None:
        """Start the interpreter for requests in `cwd` and `env` now: before the runner starts a
        thread, so that a runner which imported the preload itself can fork it."""
        if self.usable and self.server is None:
            self._start_server(cwd, env)

    def _start_server(self, cwd: Path, env: dict) -> None:
        """The interpreter's own output goes to a file of its own until `close` appends it to `log`:
        the first request (the component check) comes before the run claims its directory."""
        self.started_in = (cwd, dict(env))
        self.server_output = tempfile.TemporaryFile()
        if _forks_as_started(env):
            self.server = ServerFork(cwd, env, self.server_output)
            return
        self.server = subprocess.Popen(
            [sys.executable, "-c", SERVE],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.server_output,
            text=True,
            start_new_session=True,
        )

    def _answer(self, timeout: float) -> int | None:
        """The forked pid, 0 where the interpreter declined this request, None where it is gone or hung."""
        ready, _, _ = select.select([self.server.stdout], [], [], timeout)
        line = self.server.stdout.readline() if ready else ""
        return int(line) if line.strip().lstrip("-").isdigit() else None

    def close(self) -> None:
        """Stop the preloaded interpreter (the processes it forked are the runner's and run on)."""
        if self.server is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.server.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(self.server.pid, signal.SIGKILL)  # a ServerFork killed before its setsid
        self.server.wait()
        for stream in (self.server.stdin, self.server.stdout):
            with contextlib.suppress(OSError):
                stream.close()
        self.server = None
        self._keep_server_output()

    def _keep_server_output(self) -> None:
        output, self.server_output = self.server_output, None
        output.seek(0)
        written = output.read()
        output.close()
        if written:
            with contextlib.suppress(OSError), file_writes.open_stream(self.log, "ab") as log:
                log.write(written)


class ServerFork(ForkedProcess):
    """The preloaded interpreter as a fork of this runner, which imported the preload itself, with
    the part of `subprocess.Popen` that PreloadedForks uses: pid, stdin, stdout, wait."""

    def __init__(self, cwd: Path, env: dict, output):
        requests, self_requests = os.pipe()
        self_answers, answers = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            run_then_leave(lambda: _serve_as_started(cwd, env, requests, answers, output.fileno()))
        super().__init__(pid)
        os.close(requests)
        os.close(answers)
        self.stdin = os.fdopen(self_requests, "w")  # closed by PreloadedForks.close
        self.stdout = os.fdopen(self_answers)


def _forks_as_started(env: dict) -> bool:
    """Whether a fork of this process serves as `python -c SERVE` started in `env` would: it imported
    the preload in the environment the run's adds to (nothing but RUN_VARIABLES, the import path only
    extended), has registered no exit handler since, and runs no other thread."""
    if _preloaded is None or not sys.platform.startswith("linux") or threading.active_count() > 1:
        return False
    before = _preloaded["environ"]
    if {k: v for k, v in env.items() if k not in RUN_VARIABLES} != {
        k: v for k, v in before.items() if k not in RUN_VARIABLES
    }:
        return False
    return _added_import_path(env) is not None and atexit._ncallbacks() == _preloaded["exit_handlers"]


def _added_import_path(env: dict) -> list[str] | None:
    """The entries `env`'s PYTHONPATH puts before the one the preload was imported with, or None
    where it does not end with that one."""
    entries = [entry for entry in env.get("PYTHONPATH", "").split(os.pathsep) if entry]
    before = [entry for entry in _preloaded["environ"].get("PYTHONPATH", "").split(os.pathsep) if entry]
    if before and entries[-len(before) :] != before:
        return None
    return entries[: len(entries) - len(before)]


def _serve_as_started(cwd: Path, env: dict, requests: int, answers: int, output: int) -> None:
    """In the fork: become what `python -c SERVE` started in `cwd` and `env` would be (a session of its
    own, the signal handlers and import path of a fresh interpreter, nothing else open), then serve."""
    os.setsid()
    for signum in signal.valid_signals():
        if callable(signal.getsignal(signum)) and signum != signal.SIGINT:
            signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for fd, source in ((0, requests), (1, answers), (2, output)):
        os.dup2(source, fd)
    close_files_except({0, 1, 2})
    sys.stdin, sys.stdout, sys.stderr = open(0), open(1, "w"), open(2, "w")  # noqa: SIM115
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    added = [os.path.abspath(entry) for entry in _added_import_path(env)]
    sys.path[:] = list(dict.fromkeys(["", *added, *sys.path[1:]]))  # as `python -c` with that PYTHONPATH
    serve()


def run_to_end(
    command: list[str],
    *,
    cwd: Path,
    env: dict,
    log: Path,
    errors: Path,
    timeout: float,
    forks: PreloadedForks | None,
) -> int:
    """`command`'s exit code, its output appended to `log` and its errors to `errors`: forked where
    `forks` can, else started. `timeout` seconds after the call (waiting for the fork included) its
    process group is killed and subprocess.TimeoutExpired raised."""
    deadline = time.monotonic() + timeout
    with file_writes.open_stream(log, "ab") as out, file_writes.open_stream(errors, "ab") as err:
        forked = (
            forks.start(command, cwd=cwd, env=env, log=log, errors=errors, answer_timeout=timeout) if forks else None
        )
        process = forked or subprocess.Popen(
            command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True
        )
    try:
        return process.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise


def serve() -> None:
    """The preloaded interpreter: import torch's distributed stack and pytest, then fork a process
    for each request line on stdin and answer its pid (0: start it yourself)."""
    from torchmatrix.forks.parent_death import exit_with_parent

    exit_with_parent()
    _import_preload()
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
            intermediate = os.getpid()  # `first` is 0 here, in the child
            second = os.fork()
            if second:
                os.write(write, str(second).encode())
            else:
                while os.getppid() == intermediate:
                    os.sched_yield()
                _run_as_started(request)
        finally:
            os._exit(0)
    os.close(write)
    answer = os.read(read, 32)
    os.close(read)
    os.waitpid(first, 0)
    return int(answer or 0)


def _run_as_started(request: dict) -> None:
    """In the grandchild: become what `python ARGS` started by the runner would be (its own session,
    output into the log, nothing of the interpreter's open), run it, exit as it would."""
    run_then_leave(lambda: _command_into_log(request), _exit_as_an_interpreter)


def _command_into_log(request: dict) -> None:
    os.setsid()
    reseed_global_generators()
    for fd, path in ((1, request["log"]), (2, request["errors"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW), fd)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    close_files_except({0, 1, 2})
    option, target, *args = request["args"]
    if option == "-m":
        sys.path[0] = os.getcwd()  # as `python -m` sets it
        sys.argv = [target, *args]
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.path[0] = ""  # as `python -c` sets it
        sys.argv = ["-c", *args]
        exec(compile(target, "<string>", "exec"), {"__name__": "__main__", "__builtins__": builtins})


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
