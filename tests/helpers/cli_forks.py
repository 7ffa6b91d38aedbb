"""`python -m torchmatrix` for many short commands at the cost of one interpreter: each command runs
in a fork of a server that imported the CLI once (tests/helpers/cli_fork_server.py), saving the
0.4 CPU seconds of torchmatrix's imports that every fresh interpreter pays; a preloaded server has
imported torch's distributed stack too, so a run it forks forks its preloaded interpreter from itself
(torchmatrix.forks.preloaded_forks.preload_here) instead of importing torch again."""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from helpers.checkout import checkout_env

SERVER = Path(__file__).with_name("cli_fork_server.py")
PER_TEST = ("PYTEST_CURRENT_TEST",)  # pytest's own, changed per test; nothing a run starts reads it

forked_cpu_seconds = 0.0
"""The CPU seconds of every command this process's servers ran (helpers.cpu_seconds counts them)."""


class CliForks:
    """One server, started with the environment Project.torchmatrix gives its commands."""

    def __init__(self, scratch: Path, *, preloaded: bool = False, env: dict | None = None):
        self.scratch = scratch
        self.preloaded = preloaded
        self.env = env or checkout_env()
        self._start()

    def _start(self) -> None:
        """A server in a process group of its own, so that a command past its timeout goes with it."""
        self.server = subprocess.Popen(
            [sys.executable, str(SERVER), *(["--preload"] if self.preloaded else [])],
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.replies = selectors.DefaultSelector()
        self.replies.register(self.server.stdout, selectors.EVENT_READ)

    def run(self, cwd: Path, *args: str, timeout: float) -> subprocess.CompletedProcess:
        """The command's exit code and output, as subprocess.run would return them; a command still
        running after `timeout` seconds is killed with the server (a new one serves the next) and
        raises subprocess.TimeoutExpired."""
        stdout, stderr = self.scratch / "stdout", self.scratch / "stderr"
        request = {"cwd": str(cwd), "args": list(args), "stdout": str(stdout), "stderr": str(stderr)}
        self.server.stdin.write(json.dumps(request) + "\n")
        self.server.stdin.flush()
        if not self.replies.select(timeout):
            os.killpg(self.server.pid, signal.SIGKILL)
            self.server.wait()
            self._start()
            raise subprocess.TimeoutExpired(["torchmatrix", *args], timeout)
        global forked_cpu_seconds
        reply = json.loads(self.server.stdout.readline())
        forked_cpu_seconds += reply["cpu_seconds"]
        return subprocess.CompletedProcess(
            ["torchmatrix", *args],
            reply["returncode"],
            stdout.read_text(errors="replace"),
            stderr.read_text(errors="replace"),
        )

    def close(self) -> None:
        self.server.stdin.close()
        self.server.wait(timeout=30)


class SharedServer:
    """The preloaded server of one test process, for the commands of its tests that run in the
    environment it was made for (tests/conftest.py: the session's), started at the first of them."""

    def __init__(self, env: dict):
        self.env = env
        self.forks: CliForks | None = None
        self.busy = threading.Lock()

    @contextlib.contextmanager
    def serving(self, env: dict):
        """The server where a command in `env` runs in it as in a fresh interpreter, and no other
        command runs in it now (a test's second command at once); else None."""
        if _without_per_test(env) != _without_per_test(self.env) or not self.busy.acquire(blocking=False):
            yield None
            return
        try:
            if self.forks is None:
                scratch = Path(tempfile.mkdtemp(prefix="torchmatrix-cli-forks-"))
                self.forks = CliForks(scratch, preloaded=True, env=self.env)
            yield self.forks
        finally:
            self.busy.release()

    def close(self) -> None:
        if self.forks is not None:
            self.forks.close()


def _without_per_test(env: dict) -> dict:
    return {name: value for name, value in env.items() if name not in PER_TEST}


shared: SharedServer | None = None
"""This test process's shared server, while its session runs (tests/conftest.py)."""
