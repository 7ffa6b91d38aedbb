"""Components written the way a training stack writes them, not for the protocol: a causal LM
called with `input_ids=` and `labels=` that returns a dict, a scheduler builder returning a
container of torch schedulers, and (in models/checkpoint.py) a checkpoint manager bound once to
its objects and a process group. tests/suites/test_training_forms.py runs the suites on them."""

from __future__ import annotations

import copy

import torch
from torch.optim.lr_scheduler import CosineAnnealingLR, LinearLR, SequentialLR

from torchmatrix.models.transformer import DecoderConfig, PrefixExpertDecoder, make_batch


class KeywordCausalLM(PrefixExpertDecoder):
    """Called as transformers' causal LMs are, `model(input_ids=..., labels=...)`, and returns a dict
    with "loss"; the labels are the input ids, which the decoder shifts itself."""

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> dict:
        if labels.shape != input_ids.shape:
            raise ValueError(f"labels {tuple(labels.shape)} do not match input_ids {tuple(input_ids.shape)}")
        return {"loss": super().forward(input_ids).loss}


def build_keyword_lm(cell, *, dropout: float = 0.0, dtype: torch.dtype = torch.float32) -> KeywordCausalLM:
    return KeywordCausalLM(DecoderConfig(attn=str(cell["attn"]), dropout=dropout)).to(dtype)


def keyword_batch(model, *, seed: int, device: torch.device) -> dict:
    tokens = make_batch(model, seed=seed, device=device)["tokens"]
    return {"input_ids": tokens, "labels": tokens}


class SchedulerContainer:
    """The schedulers of a stack's model parts stepped together, as stacks keep them (torchtitan's
    LRSchedulersContainer): no `last_epoch` of its own; one state dict, loaded into each."""

    def __init__(self, schedulers: list) -> None:
        self.schedulers = schedulers

    def step(self) -> None:
        for scheduler in self.schedulers:
            scheduler.step()

    def get_last_lr(self) -> list[float]:
        return self.schedulers[0].get_last_lr()

    def state_dict(self) -> dict:
        return self.schedulers[0].state_dict()

    def load_state_dict(self, state: dict) -> None:
        for scheduler in self.schedulers:
            scheduler.load_state_dict(copy.deepcopy(state))


def warmup_cosine(optimizer, *, warmup_steps: int, total_steps: int) -> SchedulerContainer:
    """Linear warm-up, then cosine decay to the end of training (no `cell` keyword: the suites pass it only where named)."""
    warmup = LinearLR(optimizer, start_factor=0.1, total_iters=warmup_steps)
    decay = CosineAnnealingLR(optimizer, T_max=max(1, total_steps - warmup_steps))
    return SchedulerContainer([SequentialLR(optimizer, [warmup, decay], milestones=[warmup_steps])])


class UnforwardedSchedulerContainer(SchedulerContainer):
    """A container whose `load_state_dict` forgets to pass the state on: the resumed run's schedule
    starts over from warm-up."""

    def load_state_dict(self, state: dict) -> None:
        pass


def warmup_cosine_not_restored(optimizer, *, warmup_steps: int, total_steps: int) -> UnforwardedSchedulerContainer:
    return UnforwardedSchedulerContainer(
        warmup_cosine(optimizer, warmup_steps=warmup_steps, total_steps=total_steps).schedulers
    )
