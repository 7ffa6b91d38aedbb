"""The loader as the stack builds it (issue 60 item 4): suites/components/stack_loader.py reads a torch
DataLoader, torchdata's StatefulDataLoader and an iterator alike, and looks ahead without moving the
run (through a copy, else the loader's own state, else by reading again what it read); resume, on
CPU through the real CLI, resumes a StatefulDataLoader and an iterable of the tests' own exactly
through their own state, fails the loaders whose load misplaces it by the data position, and hands
the `dataset` component the `seq_len` and `vocab_size` its signature names
(tests/suites/stack_loaders.py)."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch.utils.data import DataLoader

from suites.components.stack_loader import StackLoader
from torchmatrix.testing import call_accepting

from helpers.checkout import REPO
from helpers.matrix_files import REFERENCE_COMPONENTS, matrix_toml
from helpers.run_results import cell_failures, run_suites

HAS_TORCHDATA = importlib.util.find_spec("torchdata") is not None
NEEDS_TORCHDATA = pytest.mark.skipif(not HAS_TORCHDATA, reason="needs torchdata: pip install torchdata")


def numbers(batches) -> list[int]:
    return [int(value) for batch in batches for value in batch]


def test_a_data_loader_is_read_epoch_after_epoch():
    reading = StackLoader(DataLoader(torch.arange(4), batch_size=2))
    assert numbers(reading.next_batch() for _ in range(5)) == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]


def test_the_look_ahead_of_a_loader_without_state_is_read_again_by_the_run():
    reading = StackLoader(DataLoader(torch.arange(6), batch_size=2))
    reading.next_batch()  # a live DataLoader iterator refuses to be copied
    assert numbers(reading.batches_ahead(3)) == [2, 3, 4, 5, 0, 1]
    assert numbers(reading.next_batch() for _ in range(4)) == [2, 3, 4, 5, 0, 1, 2, 3]


@NEEDS_TORCHDATA
def test_the_look_ahead_of_a_stateful_data_loader_goes_back_through_its_own_state(monkeypatch):
    from torchdata.stateful_dataloader import StatefulDataLoader

    loader = StatefulDataLoader(torch.arange(6), batch_size=2)
    reading = StackLoader(loader)
    reading.next_batch()
    loads = []
    monkeypatch.setattr(
        loader, "load_state_dict", lambda state: loads.append(StatefulDataLoader.load_state_dict(loader, state))
    )
    assert numbers(reading.batches_ahead(3)) == [2, 3, 4, 5, 0, 1]
    assert len(loads) == 1, "the position is put back through the loader's own load_state_dict"
    assert numbers(reading.next_batch() for _ in range(3)) == [2, 3, 4, 5, 0, 1]


@NEEDS_TORCHDATA
def test_a_loaded_stateful_data_loader_is_read_from_where_its_load_put_it():
    from torchdata.stateful_dataloader import StatefulDataLoader

    saved = StackLoader(StatefulDataLoader(torch.arange(8), batch_size=2))
    saved.next_batch(), saved.next_batch()
    fresh = StackLoader(StatefulDataLoader(torch.arange(8), batch_size=2))
    fresh.next_batch()  # an iterator already open before the load, as a look-ahead leaves one
    fresh.loader.load_state_dict(saved.loader.state_dict())
    fresh.reopen()
    assert numbers([fresh.next_batch()]) == [4, 5]


class EpochCountingLoader:
    """Counts its epochs itself and orders each epoch by it; its state dict keeps the position in the
    epoch only, so a read-ahead rewound through `load_state_dict` leaves it an epoch on."""

    def __init__(self, per_epoch: int = 3):
        self.per_epoch, self.epoch, self.position = per_epoch, 0, 0

    def __next__(self):
        batch = torch.tensor([self.epoch * 100 + self.position])
        self.position += 1
        if self.position == self.per_epoch:
            self.epoch, self.position = self.epoch + 1, 0
        return batch

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]


def test_the_look_ahead_reads_a_copy_and_leaves_state_the_state_dict_lacks_alone():
    loader = EpochCountingLoader()
    reading = StackLoader(loader)
    reading.next_batch()
    assert numbers(reading.batches_ahead(4)) == [1, 2, 100, 101]
    assert loader.epoch == 0 and numbers(reading.next_batch() for _ in range(2)) == [1, 2]

    rewound = EpochCountingLoader()
    position = rewound.state_dict()
    for _ in range(4):
        next(rewound)
    rewound.load_state_dict(position)
    assert rewound.epoch == 1, "a rewind through the state dict moves what the state dict lacks: why the copy"


class Uncopyable(EpochCountingLoader):
    def __deepcopy__(self, memo):
        raise TypeError("holds a file handle")


def test_a_loader_that_cannot_be_copied_is_read_and_rewound_through_its_state_dict():
    reading = StackLoader(Uncopyable(per_epoch=10))
    assert numbers(reading.batches_ahead(2)) == [0, 1]
    assert numbers([reading.next_batch()]) == [0]


def test_the_dataset_gets_the_sequence_length_and_vocabulary_its_signature_names(tmp_path):
    from stack_loaders import FlatTokenDataset

    path = str(tmp_path / "tokens.pt")
    FlatTokenDataset.write(path, vocab_size=64, num_sequences=8, seq_len=16, seed=0)
    dataset = call_accepting(
        FlatTokenDataset, path, seq_len=32, vocab_size=64, cell={"variant": "epoch_loader"}, dtype=None
    )
    assert dataset.sequences.shape == (4, 32)
    with pytest.raises(ValueError, match="not below vocab_size 8"):
        FlatTokenDataset(path, seq_len=32, vocab_size=8, cell={"variant": "epoch_loader"})


VARIANTS = ["epoch_loader", "one_batch_behind", "state_ignoring"] + (["stateful_data_loader"] if HAS_TORCHDATA else [])
WRONG_POSITION = {
    "one_batch_behind": "rank 0: after load: loader would yield batch 2, saved at batch 3",
    "state_ignoring": "rank 0: after load: loader would yield batch 0, saved at batch 3",
}
FOLLOWING = (
    "test_losses_identical_after_resume",
    "test_final_parameters_identical",
    "test_final_optimizer_state_identical",
)
LOADER_PIECE = "test_state_restored_right_after_load[piece=loader]"


@pytest.mark.slow
def test_resume_goes_through_the_loaders_own_state_and_names_a_misplaced_position(tmp_path):
    matrix = matrix_toml(
        axes={"world_size": [1], "fsdp": ["none"], "attn": ["sdpa"], "optimizer": ["adamw"], "variant": VARIANTS},
        suites={
            "resume": {
                "timeout": 300,
                "axes": ["world_size", "fsdp", "attn", "optimizer", "variant"],
                "options": {"steps": 6, "resume_step": 3},
            }
        },
        components={**REFERENCE_COMPONENTS, "dataset": "stack_loaders:FlatTokenDataset"},
    )
    done, outcomes = run_suites(tmp_path, matrix, REPO / "tests" / "suites")
    assert done.returncode == 1, done.stdout + done.stderr
    failures = cell_failures(tmp_path / "reports" / "latest" / "torch-system")
    for variant in VARIANTS:
        cell = f"ws1-none-sdpa-adamw-{variant}"
        failed = {test for test, outcome in outcomes[cell].items() if outcome in ("failure", "error")}
        if variant not in WRONG_POSITION:
            assert not failed, (variant, failures[cell])
            assert outcomes[cell][LOADER_PIECE] == "passed"
            continue
        assert failed == {LOADER_PIECE, *FOLLOWING}, (variant, outcomes[cell])
        assert WRONG_POSITION[variant] in failures[cell][LOADER_PIECE], failures[cell][LOADER_PIECE]
