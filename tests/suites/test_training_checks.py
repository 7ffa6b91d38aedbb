"""The training side's new checks in one process (issue 30): the sharded-layout check finds state
keyed by position and says sharded-or-not and keyed-by-what on separate lines; the checkpointer's
two forms behind one face, with what `load` returns read as the step or a mapping of extra state;
the extra state compared key by key; the seeding and batch_keywords options checked; an optimizer
container read through its inner optimizers; the sensitivity command's checkpointer mutants in the bound form."""

from __future__ import annotations

import pytest
import torch

from suites.checkpoints.checkpointer_forms import RunCheckpointer, reshards_itself
from suites.checkpoints.dcp_layout import Chunk, ExpectedState, TensorLayout, storage_findings
from suites.state.optimizer_state import inner_optimizers, optimizer_state_of, param_groups_of
from suites.test_resume import rank_zero_rng
from suites.training_runs.restored_state import extra_state_differences
from suites.training_runs.resumed_run import FinalState, RankRecord
from torchmatrix.models.checkpoint import BoundCheckpointer, Checkpointer
from torchmatrix.models.data import TokenDataset
from torchmatrix.sensitivity.mutants import skips_on_load

PARAM = (4, 3)


def layout(key: str, chunks: list[tuple[int, int]]) -> TensorLayout:
    """A [4, 3] float32 entry stored as these (first row, rows) chunks, the i-th written by rank i."""
    return TensorLayout(
        key,
        PARAM,
        torch.float32,
        tuple(Chunk((start, 0), (rows, 3), rank) for rank, (start, rows) in enumerate(chunks)),
    )


SHARDED, WHOLE = [(0, 2), (2, 2)], [(0, 4)]
EXPECTED = [
    ExpectedState("a.weight.exp_avg", "state.0.exp_avg", PARAM),
    ExpectedState("b.weight.exp_avg", "state.1.exp_avg", PARAM),
]


def test_state_keyed_by_position_and_sharded_is_described_so():
    layouts = {key: layout(key, SHARDED) for key in ("optimizer.state.0.exp_avg", "optimizer.state.1.exp_avg")}
    findings = storage_findings(layouts, EXPECTED, world_size=2)
    assert findings.problems == []
    assert findings.lines[0] == "stored sharded: 2 of 2 param-shaped states (e.g. optimizer.state.0.exp_avg)"
    assert findings.lines[1].startswith(
        "keyed by position: 2 of 2 param-shaped states (e.g. optimizer.state.0.exp_avg), their place in the optimizer's param order"
    )
    assert len(findings.lines) == 2


def test_state_keyed_by_position_and_not_sharded_says_both():
    layouts = {key: layout(key, WHOLE) for key in ("optimizer.state.0.exp_avg", "optimizer.state.1.exp_avg")}
    findings = storage_findings(layouts, EXPECTED, world_size=2)
    assert len(findings.problems) == 2 and "expected 2 chunks, one per rank" in findings.problems[0]
    assert findings.lines[0] == "not stored sharded: 2 of 2 param-shaped states (e.g. optimizer.state.0.exp_avg)"
    assert findings.lines[1].startswith("keyed by position")


def test_state_keyed_by_name_is_preferred_and_a_mix_gets_a_line_each():
    layouts = {
        "optimizer.state.a.weight.exp_avg": layout("optimizer.state.a.weight.exp_avg", SHARDED),
        "optimizer.state.1.exp_avg": layout("optimizer.state.1.exp_avg", WHOLE),
    }
    findings = storage_findings(layouts, EXPECTED, world_size=2)
    assert findings.keyed_by == {
        "a.weight.exp_avg": ("parameter name", "optimizer.state.a.weight.exp_avg"),
        "b.weight.exp_avg": ("position", "optimizer.state.1.exp_avg"),
    }
    assert [line.split(" (e.g.")[0] for line in findings.lines] == [
        "stored sharded: 1 of 2 param-shaped states",
        "not stored sharded: 1 of 2 param-shaped states",
        "keyed by parameter name: 1 of 2 param-shaped states",
        "keyed by position: 1 of 2 param-shaped states",
    ]


def test_state_found_under_neither_key_is_a_lookup_problem_naming_both():
    findings = storage_findings({}, EXPECTED[:1], world_size=2)
    assert findings.unfound == ["a.weight.exp_avg: no key in the checkpoint ending with it or with state.0.exp_avg"]
    assert findings.problems == [] and findings.lines == []


def test_state_saved_under_the_inner_module_names_is_found_by_a_tail_of_its_name():
    """A checkpointer that saves the module inside a trainer's wrapper drops the wrapper's name; an
    ambiguous tail finds nothing rather than another param's state."""
    wrapped = [ExpectedState(f"_forward_module.model.{state.name_key}", None, PARAM) for state in EXPECTED]
    layouts = {
        f"optimizer.state.model.{key}": layout(f"optimizer.state.model.{key}", SHARDED)
        for key in ("a.weight.exp_avg", "b.weight.exp_avg")
    }
    findings = storage_findings(layouts, wrapped, world_size=2)
    assert findings.unfound == [] and findings.problems == []
    assert findings.keyed_by["_forward_module.model.a.weight.exp_avg"] == (
        "parameter name",
        "optimizer.state.model.a.weight.exp_avg",
    )
    twice = {key: layout(key, SHARDED) for key in ("one.a.weight.exp_avg", "two.a.weight.exp_avg")}
    assert storage_findings(twice, [ExpectedState("outer.a.weight.exp_avg", None, PARAM)], world_size=2).unfound


class Returns:
    """A bound checkpointer whose save and load return what it is given."""

    def __init__(self, directory, *, model, optimizer, scheduler, loader, saved=None, loaded=0):
        self.saved, self.loaded = saved, loaded

    def save(self, step):
        return self.saved

    def load(self):
        return self.loaded


def returning(saved=None, loaded=0) -> RunCheckpointer:
    def factory(directory, *, model, optimizer, scheduler, loader):
        return Returns(
            directory, model=model, optimizer=optimizer, scheduler=scheduler, loader=loader, saved=saved, loaded=loaded
        )

    return RunCheckpointer(factory, "unused", model=None, optimizer=None, scheduler=None, loader=None)


def test_load_returns_the_step_or_a_mapping_with_it():
    assert returning(loaded=3).load() == (3, {})
    assert returning(loaded={"step": 3, "tokens_seen": 96}).load() == (3, {"tokens_seen": 96})
    assert returning(saved={"tokens_seen": 96}).save(3) == {"tokens_seen": 96}
    assert returning(saved=None).save(3) == {}


@pytest.mark.parametrize(
    ("saved", "loaded", "says"),
    [
        (
            None,
            {"tokens_seen": 96},
            'load returned a mapping without "step" ([\'tokens_seen\']); put the saved step under "step"',
        ),
        (None, None, 'load returned NoneType; return the saved step, or a mapping with "step" and the extra state'),
        (
            3,
            0,
            "save returned int; return None, a mapping of the extra state it wrote, or the future of an asynchronous save",
        ),
    ],
)
def test_what_the_forms_cannot_return_is_one_line(saved, loaded, says):
    run = returning(saved=saved, loaded=loaded)
    with pytest.raises(TypeError, match=r"^checkpointer test_training_checks:returning\.<locals>\.factory: ") as raised:
        run.save(3) if saved is not None else run.load()
    assert str(raised.value).endswith(says)


def test_the_forms_are_told_apart_by_signature():
    assert reshards_itself(BoundCheckpointer)
    assert not reshards_itself(Checkpointer)
    assert not reshards_itself(Returns)  # bound, but takes neither a process group nor a mesh


def test_extra_state_is_compared_key_by_key():
    saved = {"tokens_seen": 96, "epoch": torch.tensor(1)}
    assert extra_state_differences(saved, {**saved, "more": 1}) == []
    assert extra_state_differences(saved, {"epoch": torch.tensor(2)}) == [
        "after load: extra state 'epoch' is 2, saved 1",
        "after load: extra state 'tokens_seen' missing from what load returned",
    ]


def rng_record(**fields) -> RankRecord:
    """A resume rank record with empty runs and these RNG fields."""
    empty = FinalState([], {}, {}, {})
    return RankRecord(
        empty,
        empty,
        other_implementations={},
        quantized_at_save=[],
        rng_streams_used=[],
        rebuilt_equals_saved=False,
        **fields,
    )


def test_rank_zero_rng_on_every_rank_is_named_only_where_ranks_saved_their_own():
    own = {"torch CPU": b"zero"}
    records = [
        rng_record(after_load={"rng": []}, rng_at_save=own, rng_after_load=own),
        rng_record(after_load={"rng": ["differs"]}, rng_at_save={"torch CPU": b"one"}, rng_after_load=own),
    ]
    assert "ranks [1] hold the RNG streams rank 0 saved, not their own" in rank_zero_rng("rng", records)[0]
    records[1].rng_after_load = {"torch CPU": b"other"}
    assert rank_zero_rng("rng", records) == []


class OptimizersContainer(torch.optim.Optimizer):
    """torchtitan's shape: an Optimizer over every param whose own `.state` stays empty, stepping one
    inner optimizer per model part."""

    def __init__(self, parts: list[torch.nn.Module]) -> None:
        self.optimizers = [torch.optim.SGD(part.parameters(), lr=0.1, momentum=0.9) for part in parts]
        super().__init__([param for part in parts for param in part.parameters()], {"lr": 0.1})

    def step(self, closure=None) -> None:
        for optimizer in self.optimizers:
            optimizer.step()


def test_an_optimizer_container_is_read_through_its_inner_optimizers():
    parts = [torch.nn.Linear(2, 2), torch.nn.Linear(2, 3)]
    container = OptimizersContainer(parts)
    sum(part(torch.ones(1, 2)).sum() for part in parts).backward()
    container.step()
    assert not container.state
    assert inner_optimizers(container) == container.optimizers
    assert set(optimizer_state_of(container)) == {param for part in parts for param in part.parameters()}
    assert all("momentum_buffer" in state for state in optimizer_state_of(container).values())
    assert param_groups_of(container) == [group for inner in container.optimizers for group in inner.param_groups]
    plain = container.optimizers[0]
    assert inner_optimizers(plain) == [plain] and optimizer_state_of(plain) == dict(plain.state)


def tiny_run(data: str) -> dict:
    """A model, optimizer, scheduler and loader as a run builds them, on one process."""
    model = torch.nn.Linear(4, 4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    return {
        "model": model,
        "optimizer": optimizer,
        "scheduler": scheduler,
        "loader": TokenDataset(data).loader(batch_size=2, rank=0, world_size=1),
    }


def test_the_sensitivity_mutants_of_a_bound_checkpointer_are_bound_and_revert_their_piece(tmp_path):
    """`skips_on_load` of a bound checkpointer: built as it is (process group and all), its load
    returns the step and extra state yet leaves the optimizer as freshly built."""
    data = str(tmp_path / "tokens.pt")
    TokenDataset.write(data, num_sequences=8, seq_len=4)
    mutant = skips_on_load("torchmatrix.models.checkpoint:BoundCheckpointer", "optimizer")
    assert reshards_itself(mutant)
    trained = tiny_run(data)
    trained["model"](torch.ones(1, 4)).sum().backward()
    trained["optimizer"].step()
    next(trained["loader"])
    BoundCheckpointer(str(tmp_path / "checkpoint"), **trained).save(1)
    fresh = tiny_run(data)
    returned = mutant(str(tmp_path / "checkpoint"), **fresh, process_group=None).load()
    assert returned == {"step": 1, "tokens_seen": 8}
    assert torch.equal(fresh["model"].weight, trained["model"].weight)
    assert not fresh["optimizer"].state
    assert fresh["loader"].position == 1
    unmutated = tiny_run(data)
    BoundCheckpointer(str(tmp_path / "checkpoint"), **unmutated).load()
    assert unmutated["optimizer"].state, "the unmutated load restores the moments the mutant put back"
