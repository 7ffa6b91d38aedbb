"""The protocol end to end: a user's own model and batch factory, in a temporary package that has
nothing to do with models/, run through grad_ckpt, resume and dtensor_optim by the real CLI.

The model differs from the reference one wherever the protocol leaves room: its output is a
dataclass (not a NamedTuple), its cache a UserDict, its layers live under another name.
"""

from __future__ import annotations

import shutil

import pytest
from junitparser import JUnitXml

from helpers.checkout import REPO
from helpers.matrix_files import matrix_toml
from helpers.projects import Project

pytestmark = pytest.mark.slow

MATRIX = matrix_toml(
    axes={"world_size": [1, 2], "fsdp": ["none", "fsdp2"], "optimizer": ["adamw"]},
    exclude=[{"fsdp": "none", "world_size": 2}, {"fsdp": "fsdp2", "world_size": 1}],
    suites={"grad_ckpt": {"timeout": 120}, "resume": {"timeout": 120}, "dtensor_optim": {"timeout": 120}},
    components={
        "model": "userstack.tiny:build_tiny_lm",
        "batch": "userstack.tiny:random_tokens",
        "parallelize": "torchmatrix.models.parallel:parallelize",
        "optimizer_adamw": "torchmatrix.models.optim:build_adamw",
        "checkpointer": "torchmatrix.models.checkpoint:Checkpointer",
        "dataset": "torchmatrix.models.data:TokenDataset",
    },
)

TINY_LM = '''
from collections import UserDict
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class Block(nn.Module):
    """Writes its output into the cache (overwriting) and, after the first block, reads the previous entry."""

    def __init__(self, index, width, dropout):
        super().__init__()
        self.index, self.checkpointing, self.calls = index, False, 0
        self.mix = nn.Linear(width, width)
        self.dropout = nn.Dropout(dropout)

    def forward(self, hidden, cache):
        if self.checkpointing:
            return checkpoint(self.body, hidden, cache, use_reentrant=False)
        return self.body(hidden, cache)

    def body(self, hidden, cache):
        self.calls += 1
        if self.index:
            hidden = hidden + cache[self.index - 1][0]
        out = torch.tanh(self.mix(hidden))
        cache[self.index] = (out,)
        return hidden + self.dropout(out)


@dataclass
class Output:
    loss: torch.Tensor
    past_key_values: UserDict


class TinyLM(nn.Module):
    def __init__(self, dropout):
        super().__init__()
        self.vocab_size = 64
        self.embedding = nn.Embedding(self.vocab_size, 16)
        self.stack = nn.ModuleList(Block(i, 16, dropout) for i in range(2))
        self.unembedding = nn.Linear(16, self.vocab_size)

    def forward(self, tokens):
        cache, hidden = UserDict(), self.embedding(tokens)
        for block in self.stack:
            hidden = block(hidden, cache)
        logits = self.unembedding(hidden)[:, :-1].float()
        return Output(nn.functional.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()), cache)

    def decoder_layers(self):
        return list(self.stack)

    def body_calls(self):
        return {f"stack.{block.index}": block.calls for block in self.stack}


def build_tiny_lm(cell, *, dtype, dropout=0.0):
    return TinyLM(dropout).to(dtype)


def random_tokens(model, *, seed, device):
    generator = torch.Generator().manual_seed(seed)
    return {"tokens": torch.randint(model.vocab_size, (2, 8), generator=generator).to(device)}
'''

CELLS = {
    "ws1-none-adamw": 31,
    "ws2-fsdp2-adamw": 31,
}  # resume: 8 pieces after load, extra_state included, the cross-implementation load, the for-loop twin and
# the state the checkpoint holds;
# grad_ckpt: the forward at another length and the eager-twin comparison, which these eager cells skip


def test_a_user_model_in_its_own_package_runs_through_every_suite(tmp_path):
    project = Project(tmp_path / "project")
    project.write("matrix.toml", MATRIX)
    project.write("userstack/__init__.py", "")
    project.write("userstack/tiny.py", TINY_LM)
    # the suites with their helper packages, as a user copies the folder
    shutil.copytree(
        REPO / "suites", project.root / "suites", dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__")
    )
    done = project.torchmatrix("run", "--torch", "system", "--reports", "out", timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    suites = {
        suite.name.split("/", 1)[1]: list(suite)
        for suite in JUnitXml.fromfile(str(project.root / "out" / "latest" / "junit.xml"))
    }
    assert {cell: len(cases) for cell, cases in suites.items()} == CELLS, output
    ran = {case.name.split("[", 1)[0] for cases in suites.values() for case in cases if case.is_passed}
    assert {
        "test_checkpointing_leaves_loss_and_gradients_unchanged",
        "test_recompute_reruns_layers_and_rewrites_cache_identically",
        "test_state_restored_right_after_load",
        "test_final_optimizer_state_identical",
        "test_state_is_laid_out_like_its_param",
        "test_saved_state_is_sharded",
        "test_reshard_load_is_exact",
    } <= ran, output
