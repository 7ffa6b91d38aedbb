"""`python -m torchmatrix` for many short commands at the cost of one interpreter: each command runs
in a fork of a server that imported the CLI once (tests/helpers/cli_fork_server.py), saving the
0.4 CPU seconds of torchmatrix's imports that every fresh interpreter pays."""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
from pathlib import Path

from helpers.checkout import checkout_env

SERVER = Path(__file__).with_name("cli_fork_server.py")


class CliForks:
    """One server, started with the environment Project.torchmatrix gives its commands."""

    def __init__(self, scratch: Path):
        self.scratch = scratch
        self._start()

    def _start(self) -> None:
        """A server in a process group of its own, so that a command past its timeout goes with it."""
        self.server = subprocess.Popen(
            [sys.executable, str(SERVER)],
            env=checkout_env(),
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
        returncode = json.loads(self.server.stdout.readline())["returncode"]
        return subprocess.CompletedProcess(
            ["torchmatrix", *args], returncode, stdout.read_text(errors="replace"), stderr.read_text(errors="replace")
        )

    def close(self) -> None:
        self.server.stdin.close()
        self.server.wait(timeout=30)
