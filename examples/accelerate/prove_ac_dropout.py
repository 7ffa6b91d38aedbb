"""accelerate 1.16.0, without torchmatrix: `FullyShardedDataParallelPlugin(fsdp_version=2,
activation_checkpointing=True)` wraps each layer in `checkpoint_wrapper(layer, preserve_rng_state=False)`
(accelerate/utils/fsdp_utils.py, `fsdp2_apply_ac`), so the backward's recompute draws new dropout
masks: with dropout the gradients are not those of the loss the forward computed. One process, the
same seed and batch, FSDP2 through `accelerator.prepare` with and without the plugin's checkpointing;
with `--dropout 0` the gradients agree bit for bit.

    python examples/accelerate/prove_ac_dropout.py              # exits 1 while the bug is there
    python examples/accelerate/prove_ac_dropout.py --dropout 0  # exits 0

It starts as a one-process `torchrun` would (the launcher's variables set where unset).

On a CPU, accelerate keeps the FSDP plugin off (its FSDP path is for accelerators) and wraps in DDP
instead; the script then switches the state to FSDP itself (two lines, marked), as the torchmatrix
example does, so the FSDP2 path that a GPU takes runs on gloo.
"""

from __future__ import annotations

import argparse
import os

import torch
from accelerate import Accelerator, FullyShardedDataParallelPlugin
from accelerate.state import AcceleratorState, PartialState
from accelerate.utils import DistributedType
from torch import nn


class Block(nn.Module):
    def __init__(self, width: int, dropout: float):
        super().__init__()
        self.linear, self.dropout = nn.Linear(width, width), nn.Dropout(dropout)

    def forward(self, hidden):
        return hidden + self.dropout(torch.tanh(self.linear(hidden)))


def gradients(activation_checkpointing: bool, dropout: float) -> dict[str, torch.Tensor]:
    """Each parameter's gradient after one forward and backward of the prepared model."""
    torch.manual_seed(0)
    model = nn.Sequential(*(Block(16, dropout) for _ in range(3)))
    AcceleratorState._reset_state(reset_partial_state=True)
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2,
        auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=["Block"],
        activation_checkpointing=activation_checkpointing,
    )
    accelerator = Accelerator(fsdp_plugin=plugin)
    if accelerator.device.type == "cpu":  # CPU only: accelerate leaves FSDP off there
        PartialState().distributed_type = accelerator.state.distributed_type = DistributedType.FSDP
        accelerator.state.fsdp_plugin = plugin
    model, _ = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    torch.manual_seed(1)
    accelerator.backward(model(torch.randn(4, 16, device=accelerator.device)).square().mean())
    return {
        name.replace("_checkpoint_wrapped_module.", ""): param.grad.full_tensor().cpu()
        for name, param in model.named_parameters()
    }


def main() -> int:
    for name, value in {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29512",
    }.items():
        os.environ.setdefault(name, value)
    parser = argparse.ArgumentParser()
    parser.add_argument("--dropout", type=float, default=0.1)
    dropout = parser.parse_args().dropout
    checkpointed, plain = gradients(True, dropout), gradients(False, dropout)
    differ = [name for name in plain if not torch.equal(checkpointed[name], plain[name])]
    if differ:
        print(
            f"dropout {dropout}: activation checkpointing changed the gradients of {len(differ)} of {len(plain)} parameters: {differ[:3]}"
        )
        return 1
    print(f"dropout {dropout}: the gradients with the plugin's activation checkpointing equal those without")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
