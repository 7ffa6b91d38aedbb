"""RankPool: world_size rank processes that join one process group and run functions on demand.

The pool is started once per pytest process and reused by every test of every cell of its world
size, so the process group is created once, not once per test. Ranks fork from the zygote, which
imported torch once for them all.

A test in which any rank did not answer "ok" (it raised, died or missed the deadline) takes the
whole pool down, and the next test gets a fresh one. Proving the old one healthy instead would
cost a collective whose own failure mode is a hang, and a rank that raised inside a collective
leaves its gloo pairs closed for every later test ("Connection closed by peer"); a rebuild from
the zygote costs well under a second. A failing test never changes a later test's result.
"""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import sys
import tempfile
import time
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path

from torchmatrix import file_writes
from torchmatrix.forks import zygote
from torchmatrix.forks.log_tail import last_lines
from torchmatrix.ranks import worker
from torchmatrix.ranks.per_test_usage import cpu_seconds_of

START_TIMEOUT_S = 300.0
GRACE_AFTER_ERROR_S = 5.0
STACK_WAIT_S = 1.0
LOG_TAIL_LINES = 30
EXIT_WAIT_S = 2.0
COLLECTIVE_TIMEOUT_MARGIN_S = 60.0


def collective_timeout(deadline_s: float) -> float:
    """The process group's timeout for tests with this deadline: longer, so a hung collective is
    always caught by the deadline (with every rank's stack), never by gloo or nccl first."""
    return deadline_s + COLLECTIVE_TIMEOUT_MARGIN_S


class RankFailure(Exception):
    """A rank raised, died, or missed the deadline; the message holds every rank's evidence and
    `root_cause` the one line that says what broke (the first failing rank's innermost exception).
    `interrupted`: a rank died or was killed before it answered, so what it was writing may be half-written."""

    def __init__(self, report: str, root_cause: str = "", *, timed_out: bool = False, interrupted: bool = False):
        super().__init__(report)
        self.root_cause = root_cause
        self.timed_out = timed_out
        self.interrupted = interrupted or timed_out


class RankPool:
    """Rank processes 0..world_size-1, each serving `fn(*args)` calls over a socket pair."""

    def __init__(
        self,
        world_size: int,
        *,
        device_type: str,
        backend: str,
        collective_timeout_s: float,
        threads_per_rank: int = 1,
        cores: list[int] = (),
    ):
        self.world_size = world_size
        self.device_type = device_type
        self.backend = backend
        self.collective_timeout_s = collective_timeout_s
        self.threads_per_rank = threads_per_rank
        self.cores = list(cores)
        self.starts = 0
        self.retired_cpu_seconds = 0.0
        self.unread_ranks = 0
        self._procs: list[BaseProcess] = []
        self._conns: list[Connection] = []
        self._dir: Path | None = None

    @property
    def running(self) -> bool:
        return bool(self._procs)

    def start(self) -> None:
        """Spawn the ranks and wait until every one has joined the process group."""
        if self.running:
            return
        self._dir = Path(tempfile.mkdtemp(prefix=f"torchmatrix-ws{self.world_size}-"))
        self.starts += 1
        ranks = zygote.context()
        nice = os.getpriority(os.PRIO_PROCESS, 0)
        for rank in range(self.world_size):
            parent_end, child_end = ranks.Pipe(duplex=True)
            proc = ranks.Process(
                target=worker.main,
                args=(child_end, rank, self.world_size),
                kwargs=dict(
                    stack_file=str(self._stacks(rank)),
                    log=str(self._log(rank)),
                    env=self._env(rank),
                    nice=nice,
                    core=self.cores[rank % len(self.cores)] if self.cores else None,
                ),
                name=f"rank{rank}",
            )
            try:
                proc.start()
            except (OSError, EOFError) as error:
                parent_end.close()
                self.close(graceful=False)
                raise RankFailure(
                    f"could not fork rank {rank}: the zygote (torchmatrix.forks.zygote) is gone or refused ({error!r})"
                ) from None
            finally:
                child_end.close()
            self._procs.append(proc)
            self._conns.append(parent_end)
        path = pickle.dumps(sys.path)
        for conn in self._conns:
            conn.send_bytes(path)
        self._handshake()

    def run(self, fn, args: tuple, *, deadline: float, name: str | None = None) -> list:
        """Run fn(*args) on every rank; return the per-rank results or raise RankFailure naming
        `name` (the test's function, when `fn` is a wrapper that calls it), else fn."""
        self.start()
        name = name or getattr(fn, "__qualname__", repr(fn))
        try:
            payload = pickle.dumps(("call", fn, args))
        except Exception as error:
            raise RankFailure(
                f"cannot send {name!r} to the ranks: {error}; use a module-level function and picklable arguments"
            ) from None
        for conn in self._conns:
            conn.send_bytes(payload)
        replies = self._collect(deadline)
        failed = {rank: reply for rank, reply in replies.items() if reply[0] != "ok"}
        if not failed and len(replies) == self.world_size:
            return [replies[rank][1] for rank in range(self.world_size)]
        report = self._failure_report(name, replies)
        self.close(graceful=False)
        interrupted = len(replies) < self.world_size or any(kind == "died" for kind, _ in replies.values())
        raise RankFailure(report, self._root_cause(name, replies), timed_out=not failed, interrupted=interrupted)

    def test_directory(self, own: Path, shared_root: Path, name: str) -> Path:
        """Every rank runs on this machine, so a test's own tmp_path serves them all."""
        return own

    def of_size(self, world_size: int) -> RankPool:
        """A pool like this one of `world_size` ranks: forked from the same zygote onto the same cores,
        joined into a process group of their own, whose default group is exactly those ranks."""
        return RankPool(
            world_size,
            device_type=self.device_type,
            backend=self.backend,
            collective_timeout_s=self.collective_timeout_s,
            threads_per_rank=self.threads_per_rank,
            cores=self.cores,
        )

    def close(self, *, graceful: bool = True) -> None:
        """Stop every rank (asking first when `graceful`), reap it, and remove the ranks' logs and
        stack files (a failure report has quoted them by then); safe to call twice. What the ranks
        used goes to `retired_cpu_seconds` first (or counts in `unread_ranks`), so the test that failed
        them still counts it."""
        for proc in self._procs:
            used = cpu_seconds_of(proc.pid)
            if used is None:
                self.unread_ranks += 1
            else:
                self.retired_cpu_seconds += used
        for conn in self._conns:
            if graceful:
                try:
                    conn.send_bytes(pickle.dumps(("exit", None, ())))
                except OSError:
                    pass
            conn.close()
        for proc in self._procs:
            if graceful:
                proc.join(EXIT_WAIT_S)
            if proc.exitcode is None:
                _kill_session(proc.pid)
            proc.join()
        self._procs, self._conns = [], []
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def _env(self, rank: int) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(self.world_size),
            TORCHMATRIX_DEVICE=self.device_type,
            TORCHMATRIX_BACKEND=self.backend,
            OMP_NUM_THREADS=str(self.threads_per_rank),
        )
        env[worker.COLLECTIVE_TIMEOUT_VARIABLE] = str(self.collective_timeout_s)
        return env

    def _log(self, rank: int) -> Path:
        return self._dir / f"rank{rank}.log"

    def _stacks(self, rank: int) -> Path:
        return self._dir / f"rank{rank}.stacks"

    def _handshake(self) -> None:
        """Forward rank 0's store port to the others, then wait for every rank to be ready."""
        deadline = time.monotonic() + START_TIMEOUT_S
        ready: set[int] = set()
        while len(ready) < self.world_size:
            pending = {self._conns[r]: r for r in range(self.world_size) if r not in ready}
            remaining = deadline - time.monotonic()
            for conn in wait(list(pending), timeout=max(remaining, 0)) or []:
                rank = pending[conn]
                try:
                    kind, value = pickle.loads(conn.recv_bytes())
                except EOFError:
                    kind, value = "died", self._exit_reason(rank)
                if kind == "port":
                    for other in self._conns[1:]:
                        other.send_bytes(pickle.dumps(("port", value)))
                elif kind == "ready":
                    ready.add(rank)
                else:
                    why, cause = value if kind == "error" else (value, f"rank {rank} {value}")
                    text = (
                        f"rank {rank} could not join the process group: {why}\n{self._evidence(range(self.world_size))}"
                    )
                    self.close(graceful=False)
                    raise RankFailure(text, cause)
            if time.monotonic() >= deadline and len(ready) < self.world_size:
                late = sorted(set(range(self.world_size)) - ready)
                summary = f"ranks {late} did not join the process group within {START_TIMEOUT_S:.0f}s"
                text = f"{summary}\n{self._evidence(range(self.world_size), stack_ranks=set(late))}"
                self.close(graceful=False)
                raise RankFailure(text, summary)

    def _collect(self, deadline: float) -> dict[int, tuple[str, object]]:
        """Gather replies until all ranks answered, the deadline passed, or a failure's grace ran out."""
        replies: dict[int, tuple[str, object]] = {}
        cutoff = deadline
        while len(replies) < self.world_size:
            pending = {self._conns[r]: r for r in range(self.world_size) if r not in replies}
            ready = wait(list(pending), timeout=max(cutoff - time.monotonic(), 0))
            if not ready:
                break
            for conn in ready:
                rank = pending[conn]
                try:
                    replies[rank] = pickle.loads(conn.recv_bytes())
                except EOFError:
                    replies[rank] = ("died", self._exit_reason(rank))
                if replies[rank][0] != "ok":
                    cutoff = min(cutoff, time.monotonic() + GRACE_AFTER_ERROR_S)
        return replies

    def _root_cause(self, name: str, replies: dict[int, tuple[str, object]]) -> str:
        """What broke, in one line: the first rank to raise (in order of arrival), else the first to
        die, else the ranks that did not finish."""
        for kind, value in replies.values():
            if kind == "error":
                return value[1]
        for rank, (kind, value) in replies.items():
            if kind == "died":
                return f"rank {rank} {value}"
        missing = [r for r in range(self.world_size) if r not in replies]
        return f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} did not finish {name}"

    def _failure_report(self, name: str, replies: dict[int, tuple[str, object]]) -> str:
        missing = [r for r in range(self.world_size) if r not in replies]
        errors = {r: v[0] for r, (k, v) in replies.items() if k == "error"}
        deaths = {r: v for r, (k, v) in replies.items() if k == "died"}
        lines = []
        if errors:
            lines.append(f"{name} raised on rank{'s' if len(errors) > 1 else ''} {', '.join(map(str, sorted(errors)))}")
        if deaths:
            lines.append("; ".join(f"rank {r} {reason}" for r, reason in sorted(deaths.items())))
        if missing:
            why = "after another rank failed" if errors or deaths else "before the test's deadline"
            lines.append(
                f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} did not finish {name} {why} (stacks below)"
            )
        summary = "; ".join(lines)
        sections = [summary]
        for rank, text in sorted(errors.items()):
            sections.append(f"---- rank {rank} traceback ----\n{text.rstrip()}")
        sections.append(self._evidence(sorted(set(missing) | set(deaths)), stack_ranks=set(missing)))
        return "\n".join(sections)

    def _evidence(self, ranks, *, stack_ranks=frozenset()) -> str:
        """Log tails of `ranks`, and the Python stacks (dumped via SIGUSR1) of `stack_ranks`."""
        live = [r for r in sorted(stack_ranks) if self._procs[r].exitcode is None]
        for rank in live:
            file_writes.open_stream(self._stacks(rank)).close()  # truncated in place: the rank appends to this inode
            os.kill(self._procs[rank].pid, signal.SIGUSR1)
        if live:
            time.sleep(STACK_WAIT_S)
        sections = []
        for rank in ranks:
            if rank in stack_ranks:
                dump = self._stacks(rank).read_text(errors="replace").strip() or "(no stack: the process had exited)"
                sections.append(f"---- rank {rank} Python stacks ----\n{dump}")
            tail = last_lines(self._log(rank), LOG_TAIL_LINES)
            if tail:
                sections.append(f"---- rank {rank} output (last {len(tail)} lines) ----\n" + "\n".join(tail))
        return "\n".join(sections)

    def _exit_reason(self, rank: int) -> str:
        proc = self._procs[rank]
        proc.join(5)
        code = proc.exitcode
        if code is None:
            return "closed its connection but is still running"
        if code < 0:
            name = signal.Signals(-code).name
            hint = " (as the OOM killer does)" if -code == signal.SIGKILL else ""
            return f"died with signal {name}{hint}"
        return f"exited with code {code}"


def _kill_session(pid: int) -> None:
    """SIGKILL a rank and whatever it started (its own session), or the rank alone if it died
    before making that session."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
