"""The checkpoint archive's tiny reference stack, the same on every torch release from 2.4.0 on:
a two-layer MLP under flat FSDP2, HSDP or FSDP2 x TP, an AdamW implementation, a warm-up
schedule, a seeded data stream and the global RNG, saved and loaded through DCP.

Only torch is imported, and each API is found where the running release keeps it, so the writer
(suites/checkpoints/archive_writer.py) runs in an old release's venv and the suite
(suites/test_checkpoint_archive.py) rebuilds the same stack in the candidate.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import torch
import torch.distributed as dist

SAVE_STEP = 3
"""Steps trained before the save."""
CONTINUE_STEPS = 3
"""Steps trained after it, by the writer without stopping and by the reader after the load."""
SIZES = (8, 16, 8)
"""Input, hidden and output width: 280 parameters, every dimension divisible by 4 ranks."""
BATCH = 4
MESHES = {"tp": (2,), "fsdp2": (2,), "hsdp": (2, 2), "fsdp2-tp": (2, 2)}
"""Each layout's mesh shape: tensor parallel alone and flat FSDP2 at 2 ranks, HSDP 2 x 2 and FSDP2 x TP
2 x 2 at 4. Tensor parallel alone is what releases whose FSDP2 needs CUDA streams still write on CPU."""
IMPLEMENTATIONS = {"forloop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}
"""AdamW's keyword per implementation of its step."""


@dataclass(frozen=True)
class Form:
    """One archived checkpoint's layout, optimizer implementation and save (sync or async)."""

    mesh: str
    implementation: str
    save: str

    @property
    def name(self) -> str:
        return f"{self.mesh}/{self.implementation}/{self.save}"

    @property
    def directory(self) -> str:
        return self.name.replace("/", "-")

    @property
    def world_size(self) -> int:
        return 2 if len(MESHES[self.mesh]) == 1 else 4


FORMS = tuple(Form(mesh, implementation, "sync") for mesh in MESHES for implementation in IMPLEMENTATIONS) + tuple(
    Form(mesh, "foreach", "async") for mesh in MESHES
)
"""Every implementation saves synchronously; the async save, which stages the same state, once per layout."""


def first_attribute(*paths: str):
    """The first `module:attribute` this release has, or None: 2.4 keeps fully_shard and DTensor
    under private modules that later releases made public."""
    for path in paths:
        module, _, attribute = path.partition(":")
        try:
            return getattr(importlib.import_module(module), attribute)
        except (ImportError, AttributeError):
            continue
    return None


def fully_shard():
    return first_attribute("torch.distributed.fsdp:fully_shard", "torch.distributed._composable.fsdp:fully_shard")


def dtensor_api():
    """(DTensor, Replicate) from where this release keeps them."""
    return (
        first_attribute("torch.distributed.tensor:DTensor", "torch.distributed._tensor:DTensor"),
        first_attribute("torch.distributed.tensor:Replicate", "torch.distributed._tensor:Replicate"),
    )


def missing(form: Form) -> str | None:
    """Why this release cannot write `form`, when an API it needs is absent; None when it can try."""
    if form.mesh != "tp" and fully_shard() is None:
        return "no FSDP2 (fully_shard) in this release"
    if form.save == "async" and first_attribute("torch.distributed.checkpoint:async_save") is None:
        return "no dcp.async_save in this release"
    if first_attribute("torch.distributed.checkpoint.state_dict:get_state_dict") is None:
        return "no torch.distributed.checkpoint.state_dict helpers in this release"
    return None


class Stack:
    """One rank's model, optimizer, scheduler, data position and RNG for `form`, built from `seed`."""

    def __init__(self, form: Form, seed: int):
        from torch.distributed.device_mesh import init_device_mesh

        self.form = form
        shape = MESHES[form.mesh]
        names = {"tp": ("tp",), "fsdp2": ("dp",), "hsdp": ("replicate", "shard"), "fsdp2-tp": ("dp", "tp")}[form.mesh]
        self.mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
        torch.manual_seed(seed)
        self.model = torch.nn.Sequential(
            torch.nn.Linear(SIZES[0], SIZES[1]), torch.nn.Tanh(), torch.nn.Linear(SIZES[1], SIZES[2])
        )
        if form.mesh in ("tp", "fsdp2-tp"):
            from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

            parallelize_module(self.model, self.mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
            self.data_rank = 0  # the tensor-parallel ranks of a data rank see the same batch
        if form.mesh == "fsdp2-tp":
            fully_shard()(self.model, mesh=self.mesh["dp"])
            self.data_rank = self.mesh["dp"].get_local_rank()
        elif form.mesh != "tp":
            fully_shard()(self.model, mesh=self.mesh)
            self.data_rank = dist.get_rank()
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=0.05, weight_decay=0.01, **IMPLEMENTATIONS[form.implementation]
        )
        self.scheduler = torch.optim.lr_scheduler.LinearLR(self.optimizer, start_factor=0.25, total_iters=4)
        self.position = 0
        torch.manual_seed(seed + 1000 * self.data_rank)  # the stream of input noise, one per data rank

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch at the data position, plus noise from the global RNG: a resume that loses
        either the position or the RNG trains on other inputs."""
        generator = torch.Generator().manual_seed(7919 * self.data_rank + self.position)
        inputs = torch.randn(BATCH, SIZES[0], generator=generator)
        targets = torch.sin(inputs.sum(dim=1, keepdim=True)).expand(BATCH, SIZES[2]).contiguous()
        return inputs + 0.01 * torch.randn(BATCH, SIZES[0]), targets

    def train_step(self) -> torch.Tensor:
        inputs, targets = self.batch()
        self.position += 1
        loss = torch.nn.functional.mse_loss(self.model(inputs), targets)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.scheduler.step()
        return loss.detach()

    def named_parameters(self) -> list[tuple[str, torch.Tensor]]:
        return list(self.model.named_parameters())

    def checkpoint_state(self) -> dict:
        """What DCP saves and loads: model and optimizer through the state_dict helpers, the rest as
        this rank's own entries (the RNG and position differ per rank)."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optimizer_state = get_state_dict(self.model, self.optimizer)
        rank = dist.get_rank()
        return {
            "model": model_state,
            "optimizer": optimizer_state,
            "scheduler": self.scheduler.state_dict(),
            f"rank{rank}": {"position": torch.tensor(self.position), "rng": torch.get_rng_state()},
        }

    def save(self, path: str) -> None:
        import torch.distributed.checkpoint as dcp

        state = self.checkpoint_state()
        if self.form.save == "async":
            dcp.async_save(state, checkpoint_id=path).result()
        else:
            dcp.save(state, checkpoint_id=path)

    def load(self, path: str) -> list[str]:
        """Load a checkpoint into this stack: DCP fills the state in place, the helpers set it.
        Keys this release's state has and the checkpoint lacks (a field a later release added) are
        left as they are and returned: whether every value was restored is the caller's check."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
        from torch.distributed.checkpoint.state_dict import set_state_dict

        state = self.checkpoint_state()
        stored = FileSystemReader(path).read_metadata().state_dict_metadata
        lacking = sorted(key for key in flat_keys(state) if not stored_under(key, stored))
        dcp.load(state, checkpoint_id=path, planner=DefaultLoadPlanner(allow_partial_load=bool(lacking)))
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        own = state[f"rank{dist.get_rank()}"]
        self.position = int(own["position"])
        torch.set_rng_state(own["rng"])
        return lacking

    def capture(self) -> dict:
        """What a load must restore, in plain full tensors: the same on every release."""
        state = self.optimizer.state
        return {
            "parameters": {name: full(param) for name, param in self.named_parameters()},
            "optimizer": {
                name: {key: full(value) for key, value in sorted(state[param].items())}
                for name, param in self.named_parameters()
                if param in state
            },
            "param_groups": [
                {key: group[key] for key in ("lr", "initial_lr", "betas", "eps", "weight_decay")}
                for group in self.optimizer.param_groups
            ],
            "scheduler": {"last_epoch": self.scheduler.last_epoch, "last_lr": self.scheduler.get_last_lr()},
            "rank": {"position": self.position, "rng": torch.get_rng_state()},
        }

    def restore(self, captured: dict) -> None:
        """Set the state `captured` holds directly, with no checkpoint format in between: the
        candidate's own run that never stopped starts here."""
        with torch.no_grad():
            for name, param in self.named_parameters():
                param.to_local().copy_(local_like(captured["parameters"][name], param).to_local())
                self.optimizer.state[param] = {
                    key: local_like(value, param) if key != "step" else value.clone()
                    for key, value in captured["optimizer"][name].items()
                }
        for group, saved in zip(self.optimizer.param_groups, captured["param_groups"]):
            group.update({key: tuple(value) if key == "betas" else value for key, value in saved.items()})
        self.scheduler.last_epoch = captured["scheduler"]["last_epoch"]
        self.scheduler._last_lr = list(captured["scheduler"]["last_lr"])
        self.scheduler._step_count = captured["scheduler"]["last_epoch"] + 1
        self.position = captured["rank"]["position"]
        torch.set_rng_state(captured["rank"]["rng"])


def flat_keys(value, prefix: str = "") -> set[str]:
    """The keys DCP stores a nested state under: dict keys and list indices joined by dots."""
    if isinstance(value, dict):
        return {key for name, item in value.items() for key in flat_keys(item, f"{prefix}{name}.")}
    if isinstance(value, list):
        return {key for index, item in enumerate(value) for key in flat_keys(item, f"{prefix}{index}.")}
    return {prefix.removesuffix(".")}


def stored_under(key: str, stored) -> bool:
    """Whether DCP stored `key`, itself or within a value it keeps whole (a list of numbers)."""
    return any(key == name or key.startswith(f"{name}.") for name in stored)


def full(value):
    """A DTensor's full tensor, a plain tensor's clone, other values as they are."""
    if hasattr(value, "full_tensor"):
        return value.full_tensor().detach().clone()
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def local_like(full_value: torch.Tensor, param):
    """`full_value` laid out as `param` is (its mesh and placements), as a DTensor when it is one."""
    DTensor, Replicate = dtensor_api()
    replicated = DTensor.from_local(
        full_value, param.device_mesh, [Replicate()] * param.device_mesh.ndim, run_check=False
    )
    return replicated.redistribute(param.device_mesh, param.placements)
