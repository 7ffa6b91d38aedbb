"""The runner <-> pytest-process contract: the grant, the group plan and the event log read back as
written, another format or a renamed field is refused in one line, and the ranks come from the
plan and the grant."""

from __future__ import annotations

import json

import pytest

from torchmatrix.components.optional import OptionalWhere
from torchmatrix.env.devices import Environment
from torchmatrix.matrix.cells import Cell
from torchmatrix.matrix.suite_options import CrossVersionOptions
from torchmatrix.messages.events import (
    Collected,
    CollectError,
    EventLog,
    EventLogError,
    EventReader,
    LogOpened,
    PoolStarted,
    TestFinished,
    TestOutcome,
    TestStarted,
    from_json,
    to_json,
)
from torchmatrix.messages.grant import Grant
from torchmatrix.messages.group_plan import GroupPlan, GroupPlanError, SuiteSpec
from torchmatrix.ranks.launched import LaunchedRank
from torchmatrix.ranks.pool import RankPool, collective_timeout
from torchmatrix.ranks.rank_group import open_ranks
from torchmatrix.status import Status


def group_plan(**changes) -> GroupPlan:
    fields = dict(
        torch="2.13.0",
        world_size=2,
        device=Environment(torch="2.13.0+cpu", python="/usr/bin/python3"),
        events="/tmp/ws2.events.jsonl",
        gate="/tmp/ws2.go",
        launched=False,
        components={"model": "torchmatrix.models.transformer:build_model"},
        optional={"model": OptionalWhere(devices=("cpu",))},
        suites={
            "resume": SuiteSpec("suites/test_resume.py", 300.0, {"steps": 4}),
            "collectives": SuiteSpec("suites/test_collectives.py", 60.0, {}),
        },
        runs=(("resume", Cell({"world_size": 2, "fsdp": "fsdp2"})), ("collectives", Cell({"world_size": 2}))),
        output_cap=1024,
        only_tests={},
        known_failures={},
    )
    return GroupPlan(**{**fields, **changes})


def test_a_grant_reads_back_as_written(tmp_path):
    gate = tmp_path / "ws2.go"
    Grant.for_group(2, 4, cores=[0, 1, 2, 3], nice=19).write(gate)
    assert Grant.wait(gate) == Grant(gpus=(), cores=(0, 1, 2, 3), threads_per_rank=2, nice=19)
    assert not list(tmp_path.glob("*.partial"))


def test_threads_per_rank_is_derived_where_the_grant_is_made():
    assert Grant.for_group(4, 2).threads_per_rank == 1, "never below one thread"
    assert Grant.for_group(2, 8, gpus=[0, 1]).threads_per_rank == 4


def test_a_group_plan_reads_back_as_written(tmp_path):
    plan = group_plan(
        only_tests={"resume|ws2-fsdp2": ("test_resume_is_exact",)},
        known_failures={"resume|ws2-fsdp2": (("test_*", "pytorch#1: a reason"),)},
    )
    plan.write(tmp_path / "ws2.plan.json")
    read = GroupPlan.read(tmp_path / "ws2.plan.json")
    assert read == plan
    assert read.deadline == 300.0


def test_a_built_in_suites_options_cross_as_the_fields_they_set_and_read_back_as_its_dataclass(tmp_path):
    """The pytest process gets the dataclass the runner checked; a suite of the user's own keeps its table's bytes."""
    options = CrossVersionOptions(steps=6, resume_step=3, peers=("2.14.0",))
    spec = SuiteSpec("suites/test_cross_version.py", 300.0, options)
    assert spec.to_json() == {
        "path": "suites/test_cross_version.py",
        "timeout": 300.0,
        "options": {"steps": 6, "resume_step": 3, "peers": ["2.14.0"]},
        "options_type": "CrossVersionOptions",
    }
    plan = group_plan(suites={"cross_version": spec, "mine": SuiteSpec("suites/test_mine.py", 60.0, {"lr": 1})})
    plan.write(tmp_path / "ws2.plan.json")
    assert GroupPlan.read(tmp_path / "ws2.plan.json") == plan
    assert "options_type" not in json.loads((tmp_path / "ws2.plan.json").read_text())["suites"]["mine"]
    foreign = {**spec.to_json(), "options_type": "MineOptions"}
    path = tmp_path / "foreign.plan.json"
    path.write_text(json.dumps({**plan.to_json(), "suites": {"cross_version": foreign}}))
    with pytest.raises(GroupPlanError, match="MineOptions"):
        GroupPlan.read(path)


def test_a_group_plan_of_another_format_is_refused_with_what_to_do(tmp_path):
    path = tmp_path / "ws2.plan.json"
    path.write_text(json.dumps({**group_plan().to_json(), "format_version": 0}))
    with pytest.raises(GroupPlanError, match="reinstall torchmatrix in this venv"):
        GroupPlan.read(path)
    path.write_text(json.dumps({k: v for k, v in group_plan().to_json().items() if k != "suites"}))
    with pytest.raises(GroupPlanError, match="'suites'"):
        GroupPlan.read(path)


def test_ranks_are_built_from_the_plan_and_the_grant():
    pool = open_ranks(group_plan(), Grant.for_group(2, 2, cores=[0, 1]))
    assert isinstance(pool, RankPool) and not pool.running
    assert (pool.cores, pool.threads_per_rank) == ([0, 1], 1)
    assert pool.collective_timeout_s == collective_timeout(300.0)
    launched = open_ranks(group_plan(launched=True), Grant())
    assert isinstance(launched, LaunchedRank) and launched.world_size == 2


def test_every_event_reads_back_as_written_after_the_format_line(tmp_path):
    path = tmp_path / "ws2.events.jsonl"
    written = [
        Collected({"resume|ws2-fsdp2": ["test_resume_is_exact"]}),
        PoolStarted(2),
        TestStarted("resume", "ws2-fsdp2", "test_resume_is_exact", 1767323045.25),
        TestFinished(
            "resume", "test_resume_is_exact", "failed", 1.5, "boom", "E boom", [["k", 1]], nodeid="n", cell="ws2-fsdp2"
        ),
        CollectError("resume", "suites/test_resume.py", "SyntaxError"),
    ]
    log = EventLog(path)
    for event in written:
        log.write(event)
    log.close()
    assert EventReader(path).read_new() == [LogOpened(), *written]
    assert json.loads(path.read_text().splitlines()[0]) == {"event": "log", "format_version": 2}


def test_an_event_log_of_another_format_or_with_a_renamed_field_is_refused(tmp_path):
    path = tmp_path / "old.events.jsonl"
    path.write_text('{"event": "log", "format_version": 1}\n')
    with pytest.raises(EventLogError, match="format 1, not 2"):
        EventReader(path).read_new()
    path.write_text('{"event": "start", "suite": "s", "cell": "c", "testname": "t", "started": 1.0}\n')
    with pytest.raises(EventLogError, match="testname"):
        EventReader(path).read_new()


def test_a_finished_test_is_the_outcome_the_reports_keep_and_a_bad_status_is_refused():
    finished = TestFinished("resume", "test_x", "failed", nodeid="n", cell="ws1")
    assert isinstance(finished, TestOutcome) and finished.status is Status.FAILED and finished.key == "resume|ws1"
    line = {**to_json(finished), "status": "exploded"}
    with pytest.raises(EventLogError, match="not an event this torchmatrix writes"):
        from_json(line)
