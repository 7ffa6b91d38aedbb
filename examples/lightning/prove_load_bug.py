"""Lightning Fabric's sharded `Fabric.load` leaves the scheduler and the loader of `state` as built,
shown without torchmatrix: train four steps under FSDP on two CPU processes, `fabric.save` the
state as Fabric's docs write it, build everything afresh, `fabric.load` it, and compare.

    python examples/lightning/prove_load_bug.py [--strategy fsdp|model_parallel] [--checkpoint DIR]

Exit 1 with what was lost when the bug is there (lightning 2.6.6), 0 when the load restored both.
Fabric starts the second process itself (`fabric.launch()`), as in any Fabric script.
"""

from __future__ import annotations

import argparse
import sys
import tempfile

import torch
import torch.nn.functional as F
from lightning.fabric import Fabric
from lightning.fabric.strategies import FSDPStrategy, ModelParallelStrategy
from lightning.pytorch.demos import Transformer
from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard

STEPS = 4


class CPUFSDPStrategy(FSDPStrategy):
    """FSDPStrategy itself, on CPU processes talking gloo: Fabric refuses the FSDPStrategy class by
    its exact type off a GPU, and passes FSDP no `device_id` for a CPU; on a GPU use FSDPStrategy."""

    def setup_module(self, module: torch.nn.Module) -> torch.nn.Module:
        return super().setup_module(FullyShardedDataParallel(module, device_id=self.root_device, **self._fsdp_kwargs))


class Batches:
    """A loader that knows where it is: the batch it yields next, saved and restored by its state dict."""

    def __init__(self):
        self.position = 0

    def __next__(self) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.position)
        self.position += 1
        return torch.randint(64, (2, 9), generator=generator)

    def state_dict(self) -> dict:
        return {"position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]


def shard(model: torch.nn.Module, device_mesh) -> torch.nn.Module:
    """ModelParallelStrategy's parallelize function: FSDP2 over the whole model."""
    return fully_shard(model, mesh=device_mesh["data_parallel"])


def training_objects(fabric: Fabric):
    """The model, AdamW, a warm-up LambdaLR and the loader, set up through Fabric as its docs show."""
    torch.manual_seed(0)
    model = fabric.setup_module(Transformer(vocab_size=64, ninp=32, nhead=2, nhid=32, nlayers=1, dropout=0.0))
    optimizer = fabric.setup_optimizers(torch.optim.AdamW(model.parameters(), lr=1e-3))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 10))
    return model, optimizer, scheduler, Batches()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", choices=("fsdp", "model_parallel"), default="fsdp")
    parser.add_argument("--checkpoint", help="directory to save into (default: a temporary one)")
    arguments = parser.parse_args()
    strategy = CPUFSDPStrategy() if arguments.strategy == "fsdp" else ModelParallelStrategy(parallelize_fn=shard)
    fabric = Fabric(accelerator="cpu", devices=2, strategy=strategy)
    fabric.launch()
    path = arguments.checkpoint or fabric.broadcast(tempfile.mkdtemp()) + "/checkpoint"

    model, optimizer, scheduler, loader = training_objects(fabric)
    for _ in range(STEPS):
        tokens = next(loader)
        inputs, target = tokens[:, :-1], tokens[:, 1:]
        fabric.backward(F.nll_loss(model(inputs, target), target.reshape(-1)))
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    fabric.save(path, {"model": model, "optimizer": optimizer, "scheduler": scheduler, "loader": loader})

    model, optimizer, scheduler, loader = training_objects(fabric)
    state = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "loader": loader}
    fabric.load(path, state)
    lost = []
    if scheduler.last_epoch != STEPS:
        lost.append(f"scheduler.last_epoch is {scheduler.last_epoch}, saved {STEPS}")
    if loader.position != STEPS:
        lost.append(f"the loader would yield batch {loader.position}, saved at batch {STEPS}")
    if fabric.global_rank == 0:
        for line in lost:
            print(f"after fabric.load: {line}")
        kinds = {key: type(state[key]).__name__ for key in ("scheduler", "loader")}
        print(f"state's scheduler and loader entries are now: {kinds}")
        print("the load restored the scheduler and the loader" if not lost else "Fabric.load lost them: see above")
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
