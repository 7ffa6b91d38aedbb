"""A run's component check and pytest processes are forks of one interpreter that imported torch
once (torchmatrix/forks/preloaded_forks.py): children of the runner, each in its own session and with
its own log, as `python -m pytest` or `python -c` would be, and ended with the exit code they gave.
A process that would run in another environment than the interpreter's is started as before. A
runner that imported the preload itself forks that interpreter from itself, and its processes are the
same as a started interpreter's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from junitparser import JUnitXml

from helpers.checkout import checkout_env
from helpers.cli_forks import CliForks
from helpers.matrix_files import matrix_toml

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="pytest processes are forked on Linux only"),
]

SERVE = "from torchmatrix.forks.preloaded_forks import serve; serve()"

SUITE = """
import json, os, signal, sys

import torch.distributed as dist


def _rank():
    return dist.get_rank()


def test_where_it_runs(cell, ranks):
    assert ranks.run(_rank) == list(range(cell.world_size))
    seen = {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "sid": os.getsid(0),
        "runner": int(os.environ["TORCHMATRIX_PARENT_PID"]),
        "cmdline": open("/proc/self/cmdline").read().split(chr(0)),
        "argv": sys.argv,
        "path0": sys.path[0],
        "path": sys.path[1:],
        "sigterm": str(signal.getsignal(signal.SIGTERM)),
        "cwd": os.getcwd(),
        "stdin": os.readlink("/proc/self/fd/0"),
    }
    with open(os.path.join(os.environ["FORKS_OUT"], f"ws{cell.world_size}.json"), "w") as out:
        json.dump(seen, out)


def test_fails_at_two_ranks(cell):
    assert cell.world_size == 1
"""


RECORDER = """
import json, os

with open(os.path.join(os.environ["FORKS_OUT"], "imports.jsonl"), "a") as out:
    out.write(json.dumps({"cmdline": open("/proc/self/cmdline").read().split(chr(0)), "ppid": os.getppid()}) + "\\n")
SEEN = None
"""


def test_the_component_check_and_each_world_sizes_pytest_process_are_forks_the_runner_adopted(
    project, tmp_path, monkeypatch
):
    out = tmp_path / "seen"
    out.mkdir()
    monkeypatch.setenv("FORKS_OUT", str(out))
    matrix = matrix_toml(axes={"world_size": [1, 2]}, suites={"where": {}}, components={"recorder": "recorder:SEEN"})
    project.write_suites(matrix, test_where=SUITE)
    project.write("recorder.py", RECORDER)
    done = project.torchmatrix("run", "--torch", "system", "--reports", "out", "--run-id", "r1", "--confirm-limit", "0")
    assert done.returncode == 1, done.stdout + done.stderr

    seen = {size: json.loads((out / f"ws{size}.json").read_text()) for size in (1, 2)}
    assert seen[1]["pid"] != seen[2]["pid"]
    check = json.loads((out / "imports.jsonl").read_text().splitlines()[0])
    assert check["cmdline"][1:3] == ["-c", SERVE], "the component check started a new interpreter"
    assert check["ppid"] == seen[1]["runner"], "the runner did not adopt its component check"
    for process in seen.values():
        assert process["cmdline"][1:3] == ["-c", SERVE], "started as a new interpreter, not forked"
        assert process["ppid"] == process["runner"], "the runner did not adopt its pytest process"
        assert process["sid"] == process["pid"], "the pytest process shares a session"
        assert process["argv"][0].endswith(os.path.join("pytest", "__main__.py")), process["argv"]
        assert "--torchmatrix-plan" in process["argv"]
        assert process["path0"] == process["cwd"] == str(project.root.resolve())
        assert process["stdin"] == os.devnull

    failed = [
        case.name
        for suite in JUnitXml.fromfile(str(project.root / "out" / "r1" / "junit.xml"))
        for case in suite
        if case.result
    ]
    assert failed == ["test_fails_at_two_ranks[torch=system,ws2]"], failed
    logs = project.root / "out" / "r1" / "torch-system" / "logs"
    assert "1 failed, 1 passed" in (logs / "ws2.log").read_text()


def test_a_runner_that_imported_the_preload_forks_the_interpreter_from_itself_and_its_forks_are_the_same(
    project, tmp_path, monkeypatch
):
    """The run of the test above from a server that imported the preload (helpers/cli_forks.py, as this
    test session's runs are), and from a fresh interpreter: the component check and each pytest process
    descend from the runner's own process, not from a new interpreter, and see the same import path,
    directory, arguments, signal handlers and stdin; the outcomes are the same."""
    out = tmp_path / "seen"
    matrix = matrix_toml(axes={"world_size": [1, 2]}, suites={"where": {}}, components={"recorder": "recorder:SEEN"})
    project.write_suites(matrix, test_where=SUITE)
    project.write("recorder.py", RECORDER)
    monkeypatch.setenv("FORKS_OUT", str(out))
    seen, checks, failed = {}, {}, {}
    for way in ("started", "forked"):
        out.mkdir()
        args = ("run", "--torch", "system", "--reports", "out", "--run-id", way, "--confirm-limit", "0")
        if way == "started":
            done = subprocess.run(
                [sys.executable, "-m", "torchmatrix", *args],
                cwd=project.root,
                env=checkout_env(),
                capture_output=True,
                text=True,
                timeout=300,
            )
        else:
            (tmp_path / "cli").mkdir()
            forks = CliForks(tmp_path / "cli", preloaded=True)
            try:
                done = forks.run(project.root, *args, timeout=300)
            finally:
                forks.close()
        assert done.returncode == 1, done.stdout + done.stderr
        seen[way] = {size: json.loads((out / f"ws{size}.json").read_text()) for size in (1, 2)}
        checks[way] = json.loads((out / "imports.jsonl").read_text().splitlines()[0])
        failed[way] = [
            case.name
            for suite in JUnitXml.fromfile(str(project.root / "out" / way / "junit.xml"))
            for case in suite
            if case.result
        ]
        out.rename(tmp_path / f"seen-{way}")

    assert checks["started"]["cmdline"][1:3] == ["-c", SERVE]
    assert checks["forked"]["cmdline"][1].endswith("cli_fork_server.py"), "the runner started an interpreter"
    assert checks["forked"]["ppid"] == seen["forked"][1]["runner"], "the runner did not adopt its component check"
    for size in (1, 2):
        forked, started = seen["forked"][size], seen["started"][size]
        assert forked["cmdline"][1].endswith("cli_fork_server.py"), "the runner started an interpreter"
        assert forked["ppid"] == forked["runner"] and forked["sid"] == forked["pid"], forked
        forked["argv"] = [argument.replace("/forked/", "/started/") for argument in forked["argv"]]  # the run's id
        different = [key for key in ("argv", "path0", "path", "cwd", "sigterm", "stdin") if forked[key] != started[key]]
        assert not different, {key: (forked[key], started[key]) for key in different}
        assert forked["path"][0] == str(project.root), "the run's import path"
    assert failed["forked"] == failed["started"] == ["test_fails_at_two_ranks[torch=system,ws2]"], failed


FORKS_AS_STARTED = """
import atexit, json, os, sys, threading

from torchmatrix.forks import preloaded_forks

before = preloaded_forks._forks_as_started(dict(os.environ))
preloaded_forks.preload_here()
env = dict(os.environ)  # as the runner forked from this process has it (the import may set variables)
run = {**env, "PYTHONPATH": os.pathsep.join(["/the/project", env.get("PYTHONPATH", "")]), "TORCHMATRIX_PARENT_PID": "1"}
answers = {
    "before_the_preload": before,
    "the_runs_environment": preloaded_forks._forks_as_started(run),
    "another_variable": preloaded_forks._forks_as_started({**run, "OMP_NUM_THREADS": "3"}),
    "another_import_path": preloaded_forks._forks_as_started({**run, "PYTHONPATH": "/the/project"}),
}
stop = threading.Event()
thread = threading.Thread(target=stop.wait)
thread.start()
answers["with_a_thread"] = preloaded_forks._forks_as_started(run)
stop.set()
thread.join()
atexit.register(lambda: None)
answers["with_an_exit_handler"] = preloaded_forks._forks_as_started(run)
print(json.dumps(answers))
"""


def test_a_runner_forks_the_interpreter_only_where_the_fork_is_what_a_started_one_would_be():
    """Only after the preload was imported, in the environment it was imported in (the run adds its
    import path in front and the runner's pid), with no thread running and no exit handler added."""
    env = {**checkout_env(), "PYTHONPATH": os.pathsep.join([checkout_env()["PYTHONPATH"], "/the/users/path"])}
    done = subprocess.run(
        [sys.executable, "-c", FORKS_AS_STARTED], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {
        "before_the_preload": False,
        "the_runs_environment": True,
        "another_variable": False,
        "another_import_path": False,
        "with_a_thread": False,
        "with_an_exit_handler": False,
    }


FORKS_HERE = """
import json, os, subprocess, sys, tempfile, time
from pathlib import Path

from torchmatrix.forks.leftover_processes import adopt_orphans
from torchmatrix.forks.preloaded_forks import PreloadedForks, run_to_end

here = Path(sys.argv[1])
command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "no_such_test_file.py"]
env = dict(os.environ)
(here / "a.log").touch()
orphaned = PreloadedForks(here / "forks.log").start(command, cwd=here, env=env, log=here / "a.log")
adopt_orphans()
forks = PreloadedForks(here / "forks.log")
try:
    forked = forks.start(command, cwd=here, env=env, log=here / "a.log")
    code = forked.wait() if forked else None
    elsewhere = forks.start(command, cwd=here, env={**env, "ANOTHER": "1"}, log=here / "a.log")
    launched = forks.start(["torchrun", *command[1:]], cwd=here, env=env, log=here / "a.log")
    said = "import sys; open(sys.argv[1], 'w').write(open('/proc/self/cmdline').read()); print('said'); sys.exit(3)"
    code_c = run_to_end(
        [sys.executable, "-c", said, str(here / "c.txt")], cwd=here, env=env, log=here / "c.log", errors=here / "c.log", timeout=60, forks=forks
    )
    try:
        run_to_end([sys.executable, "-c", "import time; time.sleep(60)"], cwd=here, env=env, log=here / "c.log", errors=here / "c.log", timeout=1, forks=forks)
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
finally:
    forks.close()
hung = PreloadedForks(here / "hung.log")  # an interpreter whose imports never end: it never answers
hung.server = subprocess.Popen(
    [sys.executable, "-c", "import time; time.sleep(120)"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    start_new_session=True,
)
hung.server_output, hung.started_in = tempfile.TemporaryFile(), (here, env)
started = time.monotonic()
try:
    run_to_end([sys.executable, "-c", "pass"], cwd=here, env=env, log=here / "h.log", errors=here / "h.log", timeout=2, forks=hung)
    hung_timed_out = False
except subprocess.TimeoutExpired:
    hung_timed_out = True
hung_seconds = time.monotonic() - started
print(json.dumps({
    "forked": forked is not None, "code": code, "elsewhere": elsewhere is None, "launched": launched is None,
    "orphaned": orphaned is None, "code_c": code_c, "c_forked": "serve()" in (here / "c.txt").read_text(),
    "timed_out": timed_out, "hung_timed_out": hung_timed_out, "hung_within_timeout": hung_seconds < 10,
}))
"""


def test_a_fork_ends_with_its_commands_exit_code_and_is_made_only_where_it_would_be_the_runners(tmp_path):
    """`python -m pytest` and `python -c` alike (one past its timeout is killed, and an interpreter that
    never answers costs no more than the timeout); not for another environment, a launcher's command,
    or a runner its forks would not be re-parented to."""
    done = subprocess.run(
        [sys.executable, "-c", FORKS_HERE, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result == {
        "forked": True,
        "code": 4,
        "elsewhere": True,
        "launched": True,
        "orphaned": True,
        "code_c": 3,
        "c_forked": True,
        "timed_out": True,
        "hung_timed_out": True,
        "hung_within_timeout": True,
    }, result
    assert "file or directory not found: no_such_test_file.py" in (tmp_path / "a.log").read_text()
    assert (tmp_path / "c.log").read_text().startswith("said\n")


DRAWS_HERE = """
import json, os, sys
from pathlib import Path

from torchmatrix.forks.leftover_processes import adopt_orphans
from torchmatrix.forks.preloaded_forks import PreloadedForks, run_to_end

here = Path(sys.argv[1])
draw = "import json, random, numpy; forked = 'serve()' in open('/proc/self/cmdline').read(); print(json.dumps([numpy.random.random(), random.random(), forked]))"
adopt_orphans()
forks = PreloadedForks(here / "forks.log")
try:
    for name in ("a", "b"):
        command = [sys.executable, "-c", draw]
        log = here / f"{name}.log"
        code = run_to_end(command, cwd=here, env=dict(os.environ), log=log, errors=log, timeout=120, forks=forks)
        assert code == 0, log.read_text()
finally:
    forks.close()
"""


def test_two_forks_draw_different_random_numbers_as_two_started_processes_would(tmp_path):
    """numpy's global generator (which the preload's torch import seeds) and Python's `random` are
    seeded anew in each fork: a failure that depends on a random draw can pass when re-run alone."""
    done = subprocess.run(
        [sys.executable, "-c", DRAWS_HERE, str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    first, second = (json.loads((tmp_path / f"{name}.log").read_text()) for name in ("a", "b"))
    assert first[2] and second[2], "both were forks of the preloaded interpreter"
    assert first[0] != second[0], "numpy's global generator"
    assert first[1] != second[1], "Python's random"


LINGERING_PARENT = """
import os, sys, time

from torchmatrix.forks import preloaded_forks
from torchmatrix.forks.leftover_processes import adopt_orphans

adopt_orphans()
answer = os.write


def answer_then_linger(fd, data):
    written = answer(fd, data)
    time.sleep(0.5)  # the fork between the interpreter and its grandchild exits late
    return written


os.write = answer_then_linger
log = sys.argv[1]
pid = preloaded_forks._fork({"args": ["-c", "import os; print(os.getppid())"], "log": log, "errors": log})
os.waitpid(pid, 0)
print(os.getpid(), open(log).read().strip())
"""


def test_a_fork_runs_nothing_until_the_runner_has_adopted_it(tmp_path):
    """The grandchild waits for its first parent's exit, however late: a process that read its parent
    earlier (a parent-death signal, a check of who adopted it) would have named the fork in between."""
    log = tmp_path / "fork.log"
    log.touch()
    done = subprocess.run(
        [sys.executable, "-c", LINGERING_PARENT, str(log)],
        env=checkout_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    runner, parent_seen = done.stdout.split()
    assert parent_seen == runner, "the fork ran before the runner adopted it"
