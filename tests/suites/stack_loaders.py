"""`dataset` components whose loader is what a stack builds, for tests/suites/test_stack_loaders.py:
torchdata's StatefulDataLoader, and an iterable of its own (one epoch per `iter()`, its position in
its state dict) with two known-bad variants: a load that restores one batch behind, and one that
ignores its state. Each takes the `seq_len` and `vocab_size` the suite asks for and cuts one flat
token stream into sequences itself, as a memory-mapped pretraining dataset does, and the cell's
`variant` picks its loader."""

from __future__ import annotations

import torch

from torchmatrix.models.data import TokenDataset


class EpochLoader:
    """This rank's slice of each global batch, one shuffled epoch per `iter()`; its position (the
    epoch and the batches read in it) is its state dict, so `iter()` after a load reads on from there."""

    def __init__(self, sequences: torch.Tensor, *, batch_size: int, rank: int, world_size: int):
        self.sequences, self.batch_size, self.rank, self.world_size = sequences, batch_size, rank, world_size
        self.epoch, self.read = 0, 0

    def __iter__(self):
        order = torch.randperm(len(self.sequences), generator=torch.Generator().manual_seed(self.epoch))
        global_batch = self.batch_size * self.world_size
        while (self.read + 1) * global_batch <= len(order):
            first = self.read * global_batch + self.rank * self.batch_size
            self.read += 1
            yield self.sequences[order[first : first + self.batch_size]]
        self.epoch, self.read = self.epoch + 1, 0

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "read": self.read}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.read = int(state["epoch"]), int(state["read"])


class OneBatchBehindLoader(EpochLoader):
    """Known bad: restores the position one batch behind (a count saved after the step's batch was
    taken, restored as if before it): the resumed run reads the save step's batch again."""

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict({**state, "read": max(int(state["read"]) - 1, 0)})


class StateIgnoringLoader(EpochLoader):
    """Known bad: takes its state and keeps nothing of it, so a resumed run reads from the start."""

    def load_state_dict(self, state: dict) -> None:
        pass


def stateful_data_loader(sequences: torch.Tensor, *, batch_size: int, rank: int, world_size: int):
    """torchdata's StatefulDataLoader over this rank's shard, shuffled by a DistributedSampler, with a
    generator of its own: without one, every `iter()`, the one after a load too, draws the iterator's
    base seed from torch's global RNG, so a resumed run's dropout runs one draw off the straight run's."""
    from torch.utils.data.distributed import DistributedSampler
    from torchdata.stateful_dataloader import StatefulDataLoader

    sampler = DistributedSampler(sequences, num_replicas=world_size, rank=rank, shuffle=True, seed=0, drop_last=True)
    return StatefulDataLoader(sequences, batch_size=batch_size, sampler=sampler, generator=torch.Generator())


LOADERS = {
    "epoch_loader": EpochLoader,
    "one_batch_behind": OneBatchBehindLoader,
    "state_ignoring": StateIgnoringLoader,
    "stateful_data_loader": stateful_data_loader,
}


class FlatTokenDataset:
    """The `dataset` component: the reference token file read as one flat stream, cut into sequences
    of `seq_len` and checked against `vocab_size` (both passed because the signature names them)."""

    def __init__(self, path: str, *, seq_len: int, vocab_size: int, cell):
        tokens = TokenDataset(path).tokens.reshape(-1)
        if int(tokens.max()) >= vocab_size:
            raise ValueError(f"token {int(tokens.max())} is not below vocab_size {vocab_size}")
        self.sequences = tokens[: len(tokens) // seq_len * seq_len].view(-1, seq_len)
        self.build_loader = LOADERS[cell["variant"]]

    @classmethod
    def write(cls, path: str, *, vocab_size: int, num_sequences: int, seq_len: int, seed: int) -> None:
        TokenDataset.write(path, vocab_size=vocab_size, num_sequences=num_sequences, seq_len=seq_len, seed=seed)

    def loader(self, *, batch_size: int, rank: int, world_size: int):
        return self.build_loader(self.sequences, batch_size=batch_size, rank=rank, world_size=world_size)
