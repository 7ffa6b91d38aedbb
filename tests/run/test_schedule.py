"""The scheduler's grants on a CPU box (cores for the groups that fit, fillers beyond them), and what
an interrupt leaves in the book."""

from __future__ import annotations

import time

import pytest

from torchmatrix.matrix.cells import Cell
from torchmatrix.matrix.config import Suite
from torchmatrix.matrix.plan import Group, SuiteRun
from torchmatrix.messages.events import Collected, TestStarted
from torchmatrix.messages.grant import Grant
from torchmatrix.run.interrupts import STOPPED
from torchmatrix.run.outcomes import OutcomeBook
from torchmatrix.run.schedule import FILLER_NICE, Scheduler
from torchmatrix.status import Status


class GateRecorder:
    """Stands in for a GroupProcess: records what its gate was opened with."""

    def __init__(self, group: Group):
        self.group = group
        self.grant = None
        self.gpus, self.cores, self.slots = [], [], 0

    def open(self, grant, slots):
        self.gpus, self.cores, self.slots = list(grant.gpus), list(grant.cores), slots
        self.grant = grant


def scheduler_on(cores: list[int], *world_sizes: int) -> Scheduler:
    scheduler = Scheduler([], book=None, start=GateRecorder, slots=len(cores), core_ids=cores)
    scheduler.waiting = [GateRecorder(Group(f"g{i}", size, ())) for i, size in enumerate(world_sizes)]
    return scheduler


def test_the_first_group_gets_the_cores_and_the_rest_fill_in_unpinned_at_lowest_priority():
    scheduler = scheduler_on([0, 1], 4, 2, 1)
    scheduler._open_what_fits()
    assert [(p.grant, p.slots) for p in scheduler.active] == [
        (Grant(cores=(0, 1), threads_per_rank=1), 2),
        (Grant(nice=FILLER_NICE), 0),
        (Grant(nice=FILLER_NICE), 0),
    ]


def test_groups_that_fit_side_by_side_get_disjoint_cores():
    scheduler = scheduler_on([0, 1, 2, 3], 2, 1, 1, 1)
    scheduler._open_what_fits()
    assert [p.grant.cores for p in scheduler.active] == [(0, 1), (2,), (3,), ()]
    assert scheduler.active[-1].grant.nice == FILLER_NICE


def test_on_gpus_groups_get_gpu_slices_and_no_cores():
    scheduler = Scheduler([], book=None, start=GateRecorder, slots=4, gpu_ids=[0, 1, 2, 3])
    scheduler.waiting = [GateRecorder(Group(f"g{i}", size, ())) for i, size in enumerate((2, 1, 2))]
    scheduler._open_what_fits()
    assert [(p.gpus, p.cores) for p in scheduler.active] == [([0, 1], []), ([2], [])]
    assert [p.group.name for p in scheduler.waiting] == ["g2"], "waits for GPUs instead of oversubscribing them"


def test_a_group_under_a_launcher_runs_alone_with_the_whole_node():
    scheduler = scheduler_on([0, 1], 1)
    scheduler.waiting.insert(0, GateRecorder(Group("wide", 4, (), launcher="torchrun --nnodes=2")))
    scheduler._open_what_fits()
    assert [(p.group.name, p.grant) for p in scheduler.active] == [("wide", Grant(threads_per_rank=1))]


class StoppedProcess:
    """Stands in for a GroupProcess whose events arrive after the scheduler's last poll."""

    def __init__(self, group: Group, events: list):
        self.group, self.gpus, self.cores, self.slots = group, [], [], 0
        self.keys = [run.key for run in group.runs]
        self.events = self
        self.unread = events
        self.proc = self
        self.killed = False
        self.started_at, self.finished_at = time.monotonic(), None

    def open(self, grant, slots):
        pass

    def poll(self):
        return None

    def kill(self):
        self.killed = True

    def read_new(self) -> list:
        if not self.killed:  # the poll before the interrupt sees nothing yet
            return []
        unread, self.unread = self.unread, []
        return unread


def test_an_interrupt_reads_what_a_process_wrote_since_the_last_poll_so_each_test_is_named():
    suite = Suite("gated", "suites/test_gated.py", 60.0, ())
    cell = Cell({"world_size": 1})
    run = SuiteRun(suite, cell, (cell,))
    book = OutcomeBook([run])
    names = ["test_waits", "test_after"]
    events = [Collected({run.key: names}), TestStarted("gated", cell.id, "test_waits", 0.0)]

    def interrupt():
        raise KeyboardInterrupt

    scheduler = Scheduler(
        [Group("ws1", 1, (run,))],
        book,
        start=lambda group: StoppedProcess(group, events),
        slots=1,
        core_ids=[0],
        on_update=interrupt,
    )
    with pytest.raises(KeyboardInterrupt):
        scheduler.run()
    assert [(t.test, t.status, t.message) for t in book.tests[run.key]] == [
        (name, Status.ERROR, STOPPED) for name in names
    ]
