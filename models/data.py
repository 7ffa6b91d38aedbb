"""A small learnable token dataset on disk and a rank-sharded loader whose position is checkpointed.

Random tokens give a flat loss, and a flat loss hides a resumed run that lost its optimizer
moments; these sequences follow one fixed successor table, so the loss falls from the first
steps and any divergence after a resume shows in it.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch


class TokenDataset:
    """Token sequences of one length, stored in one file; the model shifts them into targets itself.

    The `dataset` component: `TokenDataset.write(path, ...)` creates the file once (the suite
    does it in its main process), and each rank opens it with `TokenDataset(path)`.
    """

    def __init__(self, path: str | Path):
        saved = torch.load(path, mmap=True, weights_only=True)
        self.tokens: torch.Tensor = saved["tokens"]
        self.vocab_size: int = saved["vocab_size"]

    @classmethod
    def write(
        cls, path: str | Path, *, vocab_size: int = 64, num_sequences: int = 256, seq_len: int = 32, seed: int = 0
    ) -> TokenDataset:
        """Write sequences that each start at a random token and then follow one random successor
        permutation, a pattern a tiny model starts learning within a few steps.

        The write is atomic: under a launcher every rank writes the same file at once.
        """
        generator = torch.Generator().manual_seed(seed)
        successor = torch.randperm(vocab_size, generator=generator)
        tokens = torch.empty(num_sequences, seq_len, dtype=torch.int64)
        tokens[:, 0] = torch.randint(vocab_size, (num_sequences,), generator=generator)
        for position in range(1, seq_len):
            tokens[:, position] = successor[tokens[:, position - 1]]
        path = Path(path)
        partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
        torch.save({"tokens": tokens, "vocab_size": vocab_size}, partial)
        os.replace(partial, path)
        return cls(path)

    @property
    def seq_len(self) -> int:
        return self.tokens.shape[1]

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def loader(self, *, batch_size: int, rank: int, world_size: int) -> ShardedLoader:
        """This rank's loader: `batch_size` sequences per rank and step."""
        return ShardedLoader(self, batch_size=batch_size, rank=rank, world_size=world_size)


class ShardedLoader:
    """Walks the dataset in global batches of `batch_size * world_size` sequences, in file order,
    wrapping at the end; each rank yields its own slice of every global batch.

    `position` (global batches consumed) is the whole of its state, so it is identical on every
    rank and restoring it makes a resumed run read exactly the batches a straight run reads.
    """

    def __init__(self, dataset: TokenDataset, *, batch_size: int, rank: int, world_size: int):
        self.dataset = dataset
        self.batch_size = batch_size
        self.rank = rank
        self.world_size = world_size
        self.position = 0

    def __iter__(self):
        return self

    def __next__(self) -> torch.Tensor:
        """This rank's token ids for the next step, shape (batch_size, seq_len)."""
        first = (self.position * self.world_size + self.rank) * self.batch_size
        indices = torch.arange(first, first + self.batch_size) % len(self.dataset)
        self.position += 1
        return self.dataset.tokens[indices]

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = int(state["position"])
