"""Lightning's demo `Transformer` (`lightning.pytorch.demos`, the model of Fabric's own examples) as
the `model` and `batch` components (torchmatrix/components/protocol.py): an encoder-decoder over
token ids whose forward returns log-probabilities; its loss is the training step's (step.py), as in
a Fabric training loop."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from lightning.pytorch.demos import Transformer

VOCAB_SIZE = 64  # the resume suite's default vocab_size
BATCH_SIZE = 2
SEQ_LEN = 16


def build_model(cell: Mapping[str, object], *, dtype: torch.dtype, dropout: float = 0.0) -> Transformer:
    """Component `model`: the demo Transformer, small (one encoder and one decoder layer, width 32)."""
    model = Transformer(vocab_size=VOCAB_SIZE, ninp=32, nhead=2, nhid=64, nlayers=1, dropout=dropout)
    return model.to(dtype)


def make_batch(model: Transformer, *, seed: int, device: torch.device) -> torch.Tensor:
    """Component `batch`: random token ids, one more than the sequence (the step reads the next
    tokens as targets), from a generator seeded with `seed`."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(VOCAB_SIZE, (BATCH_SIZE, SEQ_LEN + 1), generator=generator).to(device)
