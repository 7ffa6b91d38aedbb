"""Unit tests of the reference grad-ckpt model and its parallelize wrapper, in one process on CPU."""

from __future__ import annotations

import pytest
import torch

from torchmatrix.models.parallel import parallelize
from torchmatrix.models.transformer import (
    INDUCTOR_LAYERS_PER_STACK,
    LAYERS_PER_STACK,
    SHALLOW_LAYERS_PER_STACK,
    DecoderConfig,
    KVCache,
    build_model,
    lower_right_causal_mask,
    make_batch,
)

CPU = torch.device("cpu")


def trained_model(attn: str = "sdpa", checkpointing: bool = False, **cell):
    torch.manual_seed(0)
    model = build_model({"attn": attn, "fsdp": "none", **cell})
    batch = make_batch(model, seed=1, device=CPU)
    model = parallelize(model, {"fsdp": "none"}, device=CPU, activation_checkpointing=checkpointing)
    output = model(**batch)
    output.loss.backward()
    return model, output


def test_every_parameter_gets_a_nonzero_gradient():
    model, _ = trained_model()
    for name, param in model.named_parameters():
        assert param.grad is not None and param.grad.abs().sum() > 0, name


def test_prefix_layers_fill_one_cache_entry_each():
    model, output = trained_model()
    config = model.config
    head_dim = config.width // config.heads
    assert isinstance(output.past_key_values, KVCache)
    assert sorted(output.past_key_values) == list(range(config.layers_per_stack))
    for keys, values in output.past_key_values.values():
        assert keys.shape == values.shape == (config.batch_size, config.heads, config.prefix_len, head_dim)


@pytest.mark.parametrize(
    ("cell", "depth"),
    [
        ({}, LAYERS_PER_STACK),
        ({"compile": "none", "optimizer_impl": "default"}, LAYERS_PER_STACK),
        ({"compile": "none", "optimizer_impl": "fused"}, SHALLOW_LAYERS_PER_STACK),
        ({"compile": "aot_eager"}, SHALLOW_LAYERS_PER_STACK),
        ({"compile": "inductor", "optimizer_impl": "fused"}, INDUCTOR_LAYERS_PER_STACK),
        ({"compile": "none", "optimizer_impl": "compiled"}, SHALLOW_LAYERS_PER_STACK),
        ({"world_size": 4, "mesh": "flat"}, LAYERS_PER_STACK),
        ({"world_size": 4, "mesh": "hsdp"}, SHALLOW_LAYERS_PER_STACK),
        ({"world_size": 4, "mesh": "fsdp_tp"}, SHALLOW_LAYERS_PER_STACK),
        ({"world_size": 2, "pipeline": "gpipe"}, SHALLOW_LAYERS_PER_STACK),
    ],
)
def test_a_cell_that_compiles_steps_an_implementation_or_shards_2d_builds_the_shallower_decoder(cell, depth):
    model = build_model({"attn": "sdpa", "fsdp": "none", **cell})
    assert len(model.prefix_layers) == len(model.expert_layers) == model.config.layers_per_stack == depth
    assert SHALLOW_LAYERS_PER_STACK < LAYERS_PER_STACK


@pytest.mark.parametrize(
    ("cell", "depth"),
    [({"layers_per_stack": 1}, 1), ({"layers_per_stack": 1, "compile": "aot_eager"}, 1), ({"layers_per_stack": 4}, 4)],
)
def test_a_cell_naming_its_layers_per_stack_gets_that_depth_whatever_else_it_says(cell, depth):
    model = build_model({"attn": "sdpa", "fsdp": "none", **cell})
    assert len(model.prefix_layers) == len(model.expert_layers) == depth


@pytest.mark.parametrize("depth", [0, 1.5, True])
def test_a_depth_that_is_not_a_whole_number_of_layers_is_refused_saying_so(depth):
    with pytest.raises(ValueError, match=f"layers_per_stack={depth!r}: expected a whole number, 1 or more"):
        build_model({"attn": "sdpa", "layers_per_stack": depth})


def test_checkpointing_reruns_each_layer_body_once_in_backward():
    plain, _ = trained_model(checkpointing=False)
    checkpointed, _ = trained_model(checkpointing=True)
    assert set(plain.body_calls().values()) == {1}
    assert set(checkpointed.body_calls().values()) == {2}


def test_sdpa_and_eager_attention_agree():
    _, sdpa = trained_model("sdpa")
    _, eager = trained_model("eager")
    torch.testing.assert_close(sdpa.loss, eager.loss)


def test_a_named_sdpa_backend_is_used():
    _, math = trained_model("sdpa", sdpa_backend="math")
    _, eager = trained_model("eager")
    torch.testing.assert_close(math.loss, eager.loss)
    with pytest.raises(RuntimeError, match="scaled_dot_product_attention"):
        trained_model("sdpa", sdpa_backend="cudnn")


def test_mask_puts_the_queries_at_the_end_of_the_keys():
    mask = lower_right_causal_mask(2, 4, CPU)
    assert mask.tolist() == [[True, True, True, False], [True, True, True, True]]


def test_batches_are_reproducible_per_seed():
    model = build_model({"attn": "sdpa"})
    first, again, other = (make_batch(model, seed=s, device=CPU)["tokens"] for s in (3, 3, 4))
    assert torch.equal(first, again) and not torch.equal(first, other)


def test_unknown_attention_kind_names_the_choices():
    with pytest.raises(ValueError, match="expected one of sdpa, eager"):
        DecoderConfig(attn="flash")


def test_unknown_fsdp_value_names_the_choices():
    with pytest.raises(ValueError, match="expected one of none, fsdp1, fsdp2"):
        parallelize(build_model({"attn": "sdpa"}), {"fsdp": "ddp"}, device=CPU)
