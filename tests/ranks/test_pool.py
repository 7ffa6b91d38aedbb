"""The rank pool: results per rank, failures with evidence, deadlines, dead ranks, reuse."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torchmatrix.ranks.pool import RankFailure, RankPool, collective_timeout

from helpers import rank_functions as rf

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pool():
    pool = RankPool(2, device_type="cpu", backend="gloo", collective_timeout_s=60)
    yield pool
    pool.close()


def soon(seconds=60.0):
    return time.monotonic() + seconds


def test_results_come_back_in_rank_order_and_the_pool_is_reused(pool):
    first = pool.run(rf.identity, (), deadline=soon())
    second = pool.run(rf.identity, (), deadline=soon())
    assert [(r, w) for r, w, _ in first] == [(0, 2), (1, 2)]
    assert [pid for *_, pid in first] == [pid for *_, pid in second], "same processes serve both calls"


def test_exception_on_one_rank_fails_with_that_ranks_traceback_and_root_cause(pool):
    before = [pid for *_, pid in pool.run(rf.identity, (), deadline=soon())]
    with pytest.raises(RankFailure) as raised:
        pool.run(rf.raise_on_rank, (1,), deadline=soon())
    text = str(raised.value)
    assert "raised on rank 1" in text
    assert "ValueError: injected failure on rank 1" in text
    assert "rank 0 traceback" not in text
    assert raised.value.root_cause == "ValueError: injected failure on rank 1"
    assert not raised.value.interrupted, "every rank answered: nothing was cut off mid-write"
    assert not any(_alive(pid) for pid in before), "any failure takes the whole pool down, leaving no process"
    after = [pid for *_, pid in pool.run(rf.identity, (), deadline=soon())]
    assert set(after).isdisjoint(before), "the next call runs on a fresh pool"


def test_the_root_cause_is_the_innermost_exception_of_a_chain(pool):
    with pytest.raises(RankFailure) as raised:
        pool.run(rf.raise_chained_on_rank, (0,), deadline=soon())
    assert raised.value.root_cause == "KeyError: 'the innermost cause'"
    assert "RuntimeError: the wrapper" in str(raised.value), "the whole chain stays in the text"


def test_collectives_that_raised_on_every_rank_do_not_break_the_next_test():
    """Mismatched collectives that gloo times out on every rank leave its pairs closed ("Connection
    closed by peer" for every later collective): the pool must not be reused after them."""
    pool = RankPool(2, device_type="cpu", backend="gloo", collective_timeout_s=3)
    try:
        with pytest.raises(RankFailure) as raised:
            pool.run(rf.mismatched_collectives, (), deadline=soon(60))
        assert "raised on ranks 0, 1" in str(raised.value)
        assert raised.value.root_cause.startswith("RuntimeError: ") and not raised.value.timed_out
        assert [r for r, _, _ in pool.run(rf.all_reduce_rank, (), deadline=soon())] == [1, 1]
    finally:
        pool.close()


def test_the_process_group_outlives_any_deadline(pool):
    """The ranks' process group times out after the longest deadline plus a margin, never before it."""
    assert pool.run(rf.process_group_timeout, (), deadline=soon()) == [60.0, 60.0]
    assert collective_timeout(300) > 300


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"


def test_exception_while_the_other_rank_waits_shows_its_stack_and_rebuilds(pool):
    started = time.monotonic()
    with pytest.raises(RankFailure) as raised:
        pool.run(rf.raise_on_rank_while_others_wait_in_all_reduce, (1,), deadline=soon(120))
    text = str(raised.value)
    assert time.monotonic() - started < 30, "the grace after a failure is short, not the full deadline"
    assert "injected failure before the all_reduce" in text
    assert raised.value.interrupted and not raised.value.timed_out, "rank 0 was killed before it answered"
    assert "rank 0 Python stacks" in text and "raise_on_rank_while_others_wait_in_all_reduce" in text
    assert [r for r, _, _ in pool.run(rf.identity, (), deadline=soon())] == [0, 1], "the next call gets a fresh pool"


def test_deadline_dumps_every_ranks_stack_and_the_next_call_works(pool):
    started = time.monotonic()
    with pytest.raises(RankFailure) as raised:
        pool.run(rf.spin_forever, (), deadline=soon(3))
    assert time.monotonic() - started < 20
    text = str(raised.value)
    assert "did not finish spin_forever before the test's deadline" in text
    assert raised.value.timed_out and raised.value.root_cause == "ranks 0, 1 did not finish spin_forever"
    for rank in (0, 1):
        assert f"rank {rank} Python stacks" in text
    assert text.count("in spin_forever") >= 2, text
    assert len(pool.run(rf.identity, (), deadline=soon())) == 2


def test_collective_hang_names_the_waiting_rank(pool):
    with pytest.raises(RankFailure) as raised:
        pool.run(rf.hang_in_barrier_except, (1,), deadline=soon(3))
    text = str(raised.value)
    assert "rank 0 did not finish" in text
    assert "hang_in_barrier_except" in text.split("rank 0 Python stacks")[1]


@pytest.mark.parametrize("signum, name", [(signal.SIGKILL, "SIGKILL"), (signal.SIGSEGV, "SIGSEGV")])
def test_a_dead_rank_fails_with_its_signal_and_the_pool_is_rebuilt(pool, signum, name):
    with pytest.raises(RankFailure) as raised:
        pool.run(rf.kill_self_on_rank, (1, signum), deadline=soon(60))
    assert f"rank 1 died with signal {name}" in str(raised.value)
    assert raised.value.interrupted
    assert len(pool.run(rf.identity, (), deadline=soon())) == 2


def _bytes_read_by_this_process() -> int:
    return int(
        next(line for line in Path("/proc/self/io").read_text().splitlines() if line.startswith("rchar:")).split()[1]
    )


def test_a_dead_ranks_last_lines_are_read_from_the_end_of_its_log(pool):
    """30 MB of output before the rank died: its last lines are quoted, and far less than its log is read."""
    before = _bytes_read_by_this_process()
    with pytest.raises(RankFailure) as raised:
        pool.run(rf.print_then_kill_self_on_rank, (1, 30), deadline=soon(60))
    read = _bytes_read_by_this_process() - before
    text = str(raised.value)
    assert "rank 1 died with signal SIGKILL" in text
    assert text.rstrip().endswith("THE LAST LINE")
    assert read < 2 * 1024 * 1024, f"read {read} bytes to quote a 30 MB log's last lines"


def test_unpicklable_function_or_result_is_explained(pool):
    with pytest.raises(RankFailure, match="module-level function"):
        pool.run(lambda: None, (), deadline=soon())
    with pytest.raises(RankFailure, match="cannot be pickled"):
        pool.run(rf.unpicklable_result, (), deadline=soon())


def test_ranks_fork_from_the_zygote_as_simulated_ranks_on_the_granted_cores():
    """Ranks start with torch's distributed stack imported (forked from the zygote, not from this
    process), in their own sessions, as SCHED_BATCH, round robin over the granted cores."""
    cores = sorted(os.sched_getaffinity(0))
    granted = [cores[-1], cores[0]]
    pinned = RankPool(4, device_type="cpu", backend="gloo", collective_timeout_s=60, cores=granted)
    unpinned = RankPool(1, device_type="cpu", backend="gloo", collective_timeout_s=60, threads_per_rank=2)
    try:
        placements = pinned.run(rf.process_placement, (), deadline=soon())
        (free,) = unpinned.run(rf.process_placement, (), deadline=soon())
    finally:
        pinned.close()
        unpinned.close()
    assert [p["cores"] for p in placements] == [[granted[r % 2]] for r in range(4)]
    assert free["cores"] == cores and free["threads"] == 2
    for placement in [*placements, free]:
        assert placement["parent"] != os.getpid(), "forked from the zygote, not from the pool's process"
        assert placement["fsdp_preloaded"]
        assert placement["policy"] == os.SCHED_BATCH
        assert placement["session_leader"]
        assert placement["nice"] == os.getpriority(os.PRIO_PROCESS, 0)
    assert len({p["parent"] for p in [*placements, free]}) == 1, "one zygote serves every pool of the process"


def test_closing_the_pool_removes_the_ranks_logs_and_stack_files():
    pool = RankPool(2, device_type="cpu", backend="gloo", collective_timeout_s=60)
    pool.start()
    directory = pool._dir
    assert sorted(p.name for p in directory.iterdir()) == ["rank0.log", "rank0.stacks", "rank1.log", "rank1.stacks"]
    pool.close()
    assert not directory.exists()
    pool.close()


def test_a_killed_zygote_is_replaced_at_the_next_pool_start():
    from multiprocessing import forkserver

    pool = RankPool(1, device_type="cpu", backend="gloo", collective_timeout_s=60)
    try:
        pool.run(rf.identity, (), deadline=soon())
        pool.close()
        os.kill(forkserver._forkserver._forkserver_pid, signal.SIGKILL)
        time.sleep(0.5)
        assert len(pool.run(rf.identity, (), deadline=soon())) == 1
    finally:
        pool.close()


def test_a_zygote_that_cannot_start_fails_the_pool_with_a_rank_failure(tmp_path):
    """A torch that kills the interpreter at import takes the zygote down: the pool says so in one
    RankFailure (which the test reports) instead of an EOFError from multiprocessing."""
    (tmp_path / "dies_at_import.py").write_text("import os\nos._exit(3)\n")
    script = (
        "from torchmatrix.forks import zygote\n"
        "zygote.PRELOAD.insert(0, 'dies_at_import')\n"
        "from torchmatrix.ranks.pool import RankFailure, RankPool\n"
        "try:\n"
        "    RankPool(1, device_type='cpu', backend='gloo', collective_timeout_s=60).start()\n"
        "except RankFailure as failure:\n"
        "    print(failure)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert "could not fork rank 0: the zygote (torchmatrix.forks.zygote) is gone or refused" in done.stdout, done.stderr


ZYGOTE_FORKED_HERE = """
import json, os, signal, sys, time

signal.signal(signal.SIGTERM, lambda *_: None)  # as a pytest plugin might
held = open(sys.argv[1], "w")
from multiprocessing import forkserver

from torchmatrix.forks import zygote
from torchmatrix.ranks.pool import RankPool
from helpers import rank_functions as rf

zygote.start()
server = forkserver._forkserver._forkserver_pid
pool = RankPool(1, device_type="cpu", backend="gloo", collective_timeout_s=60)
try:
    (rank,) = pool.run(rf.inherited_state, (held.name,), deadline=time.monotonic() + 60)
finally:
    stat = open(f"/proc/{server}/stat").read().rsplit(")", 1)[1].split()
    server_argv = open(f"/proc/{server}/cmdline").read()
    pool.close()
own_cpu = (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")  # utime and stime, not its ranks'
same_argv = server_argv == open("/proc/self/cmdline").read()
print(json.dumps({"me": os.getpid(), "server_parent": int(stat[1]), "same_argv": same_argv, "server_cpu": own_cpu, "rank": rank}))
"""


def test_the_zygote_is_this_process_forked_once_it_imported_torch_and_holds_nothing_of_it(tmp_path):
    """zygote.start() forks the calling process (the pytest process) instead of starting an
    interpreter that imports torch again; the ranks it forks keep none of the caller's open
    files or signal handlers."""
    import json

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), *sys.path])}
    done = subprocess.run(
        [sys.executable, "-c", ZYGOTE_FORKED_HERE, str(tmp_path / "held")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["server_parent"] == seen["me"]
    assert seen["same_argv"], "the zygote is a fork of the process that started it, not an interpreter of its own"
    assert seen["server_cpu"] < 1.0, f"the zygote used {seen['server_cpu']} CPU s: it imported torch again"
    assert seen["rank"] == {"fsdp_preloaded": True, "sigterm": "default", "caller_file_open": False}
