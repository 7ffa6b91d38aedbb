"""Run as a script by helpers.cli_forks: import torchmatrix's CLI once (and with `--preload` torch's
distributed stack, as a run's preloaded interpreter does), then run each command asked for on stdin
in a fork of this process, as `python -m torchmatrix` would run it in the directory given.

Protocol, one JSON line each way: {"cwd", "args", "stdout", "stderr"} (the two files the command's
output goes to) in, {"returncode", "cpu_seconds"} out once the command ended (the CPU seconds of the
command and every process it waited for).
"""

from __future__ import annotations

import json
import os
import sys
import traceback

from torchmatrix.cli import main
from torchmatrix.forks.preloaded_forks import preload_here


def exit_code(code) -> int:
    """The status an interpreter leaving with `sys.exit(code)` ends with."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def run_command(request: dict) -> None:
    """The fork's side: `python -m torchmatrix ARGS` in `cwd` (sys.path[0] is the directory, as `-m`
    makes it), stdin empty; never returns."""
    code = 1
    try:
        os.chdir(request["cwd"])
        sys.path[0] = request["cwd"]
        for fd, name in ((0, os.devnull), (1, request["stdout"]), (2, request["stderr"])):
            opened = os.open(name, os.O_RDONLY if fd == 0 else os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(opened, fd)
            os.close(opened)
        try:
            code = exit_code(main(request["args"]))
        except SystemExit as leaving:
            code = exit_code(leaving.code)
        except BaseException:
            traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def serve() -> None:
    if "--preload" in sys.argv[1:]:
        preload_here()
    replies = sys.stdout
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            run_command(request)
        _, status, usage = os.wait4(pid, 0)
        reply = {"returncode": os.waitstatus_to_exitcode(status), "cpu_seconds": usage.ru_utime + usage.ru_stime}
        print(json.dumps(reply), file=replies, flush=True)


if __name__ == "__main__":
    serve()
