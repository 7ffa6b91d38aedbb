"""Known-bad checkpointers for quantized and compensated optimizer state, one per library family:
each restores the codes (or the moments) but loses what they mean without, and the resume suite
must fail on every one of them through the state adapter alone.

Point `[components] checkpointer` at one of these (tests/suites/test_third_party_optim.py does, per cell
through tests/suites/resume_variants.py).
"""

from __future__ import annotations

import torch

from ..checkpoint import Checkpointer


class StateDroppedCheckpointer(Checkpointer):
    """Restores the optimizer, then puts back as a freshly built optimizer has them the state
    entries (or tensor-subclass attributes) named in `dropped`: what a checkpoint that never
    saved them resumes with."""

    dropped: tuple[str, ...] = ()

    def restore_optimizer(self, model, optimizer, state: dict) -> None:
        super().restore_optimizer(model, optimizer, state)
        from torch.distributed.tensor import DTensor

        with torch.no_grad():
            for param_state in optimizer.state.values():
                for key, value in param_state.items():
                    local = value.to_local() if isinstance(value, DTensor) else value
                    if key in self.dropped and isinstance(local, torch.Tensor):
                        local.zero_()
                    for attribute in self.dropped:
                        if isinstance(getattr(local, attribute, None), torch.Tensor):
                            getattr(local, attribute).zero_()


class TorchaoScaleDroppedCheckpointer(StateDroppedCheckpointer):
    """torchao: the block scales of OptimState8bit/4bit/Fp8 come back as zeros, as
    `OptimState8bit.zeros` makes them, so every dequantized moment reads as zero."""

    dropped = ("scale",)


class BnbAbsmaxDroppedCheckpointer(StateDroppedCheckpointer):
    """bitsandbytes: `absmax1`/`absmax2`, the block scales of the uint8 moments, come back as zeros."""

    dropped = ("absmax1", "absmax2")


class KahanCompensationDroppedCheckpointer(StateDroppedCheckpointer):
    """torch-optimi: the Kahan compensation `kahan_comp` of each bf16 param comes back as zeros,
    so the low bits the bf16 params could not hold are lost at the resume."""

    dropped = ("kahan_comp",)
