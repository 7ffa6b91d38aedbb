"""Optimizer axis values backed by the ecosystem's precision-aware optimizers: torchao's quantized
AdamW (8-bit, 4-bit, FP8 state) and its AdamW with bf16 stochastic rounding, torch-optimi's AdamW
with Kahan summation, and bitsandbytes' 8-bit AdamW.

Every factory has the signature of torchmatrix.models.optim.build_adamw and imports its package when called,
so a package that is not installed fails only the cells that use it (examples/optimizers/matrix.toml
lists each one's pip requirement). `build_model` is the reference decoder made wide enough for
the quantizers to engage: torchao and bitsandbytes keep a state of under 4096 elements (per
rank) in plain fp32.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .transformer import DecoderConfig, PrefixExpertDecoder

QUANTIZABLE = DecoderConfig(width=96, mlp_width=96)
"""Every attention and MLP weight 96x96, quantized up to 2 ranks (4608 elements per rank); the embedding
and head 64x96, quantized on 1 rank and plain on 2 (3072). torchao compiles its step once per shard
shape and dtype, so three shapes per world size (with the norms') where a 64x256 MLP made four."""


def build_model(cell: Mapping[str, object], *, dropout: float = 0.0, dtype: torch.dtype = torch.float32):
    """torchmatrix.models.transformer.build_model at QUANTIZABLE's sizes."""
    config = DecoderConfig(
        attn=str(cell["attn"]), dropout=dropout, width=QUANTIZABLE.width, mlp_width=QUANTIZABLE.mlp_width
    )
    return PrefixExpertDecoder(config).to(dtype)


def build_ao_adamw8bit(params, *, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
    """torchao AdamW8bit: moments as OptimState8bit (int8 codes, one fp32 scale per 256 elements)."""
    from torchao.optim import AdamW8bit

    return AdamW8bit(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


def build_ao_adamw4bit(params, *, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
    """torchao AdamW4bit: moments as OptimState4bit (packed 4-bit codes, one scale per 128 elements)."""
    from torchao.optim import AdamW4bit

    return AdamW4bit(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


def build_ao_adamwfp8(params, *, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
    """torchao AdamWFp8: moments as OptimStateFp8 (float8_e4m3 codes, one scale per 256 elements)."""
    from torchao.optim import AdamWFp8

    return AdamWFp8(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


def build_ao_adamw_bf16sr(params, *, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
    """torchao's AdamW on bf16 params with stochastic rounding of the update, which draws from
    torch's RNG every step: a resume is exact only if that RNG is restored."""
    from torchao.optim import _AdamW

    return _AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, bf16_stochastic_round=True)


def build_optimi_adamw_kahan(params, *, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
    """torch-optimi's AdamW with Kahan summation (a `kahan_comp` state per bf16 param), the
    for-loop implementation, which runs on CPU and on DTensor shards."""
    import optimi

    return optimi.AdamW(
        params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, kahan_sum=True, foreach=False, triton=False
    )


def build_bnb_adamw8bit(params, *, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
    """bitsandbytes AdamW8bit, blockwise: moments as uint8 codes `state1`/`state2` with fp32 block
    scales `absmax1`/`absmax2` and the code books `qmap1`/`qmap2`."""
    import bitsandbytes

    return bitsandbytes.optim.AdamW8bit(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


BNB_MOMENTS = {"state1": ("exp_avg", "absmax1", "qmap1"), "state2": ("exp_avg_sq", "absmax2", "qmap2")}


def bnb_plain_state(state: dict) -> dict:
    """The `plain_state_bnb_adamw8bit` adapter: bitsandbytes keeps each moment as three state
    entries (codes, block scales, code book), so it is dequantized from the three together; the
    step and any other entry pass through as the default adapter gives them."""
    import bitsandbytes.functional

    from torchmatrix.suites.state.optimizer_state import plain_state

    plain = plain_state(state)
    for codes_key, (name, scale_key, book_key) in BNB_MOMENTS.items():
        codes = plain.get(codes_key)
        if codes is None or codes.dtype != torch.uint8:
            continue
        plain[name] = bitsandbytes.functional.dequantize_blockwise(
            codes, absmax=plain.pop(scale_key), code=plain.pop(book_key), blocksize=256
        )
        del plain[codes_key]
    return plain
