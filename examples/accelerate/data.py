"""The `dataset` component: the suite's token file as a map-style torch Dataset of sequences of the
`seq_len` it asks for, and a shuffled DataLoader prepared by the run's Accelerator (stateful, so
`save_state` keeps its position), which shards it across the processes itself."""

from __future__ import annotations

import torch
from parallel import BUILDING
from torch.utils.data import DataLoader, Dataset

from torchmatrix.models.data import TokenDataset


class TokenSequences(Dataset):
    """The token file cut into sequences of `seq_len` tokens."""

    def __init__(self, path: str, *, seq_len: int):
        tokens = torch.load(path, weights_only=True)["tokens"].reshape(-1)
        self.sequences = tokens[: len(tokens) // seq_len * seq_len].view(-1, seq_len)

    write = TokenDataset.write

    def __len__(self) -> int:
        return len(self.sequences)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.sequences[index]

    def loader(self, *, batch_size: int, rank: int, world_size: int):
        return BUILDING[0].prepare(DataLoader(self, batch_size=batch_size, shuffle=True))
