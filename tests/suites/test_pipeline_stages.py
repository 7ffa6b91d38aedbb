"""The reference decoder split into pipeline stages (models/pipeline_stages.py), in one process on CPU: the
stages chained compute the whole model's loss and gradients, bit for bit, and hold every parameter once."""

from __future__ import annotations

import pytest
import torch

from torchmatrix.models.pipeline_stages import split_decoder
from torchmatrix.models.transformer import build_model, make_batch

CPU = torch.device("cpu")


def gradients(model) -> dict[str, torch.Tensor]:
    return {name: param.grad.clone() for name, param in model.named_parameters()}


@pytest.mark.parametrize(("depth", "stages"), [(1, 2), (2, 2), (2, 4), (3, 4)])
def test_the_stages_chained_compute_the_whole_models_loss_bit_for_bit(depth, stages):
    torch.manual_seed(0)
    model = build_model({"attn": "sdpa", "layers_per_stack": depth})
    batch = make_batch(model, seed=3, device=CPU)
    whole = model(**batch).loss
    split = split_decoder(model, stages=stages)
    assert len(split.stages) == stages
    sent = split.inputs(batch)
    for stage in split.stages:
        received = tuple(tensor.detach().requires_grad_(tensor.is_floating_point()) for tensor in sent)
        sent = stage(*received)
        sent = sent if isinstance(sent, tuple) else (sent,)
        assert all(tensor.is_contiguous() for tensor in sent)
    loss = split.loss(sent[0], split.target(batch))
    assert torch.equal(loss, whole)
    held = [id(param) for stage in split.stages for param in stage.parameters()]
    assert sorted(held) == sorted(id(param) for param in model.parameters())


def test_the_stages_backward_one_after_another_give_the_whole_models_gradients():
    """Each stage's backward fed the next stage's input gradients, as a schedule sends them."""
    torch.manual_seed(0)
    model = build_model({"attn": "sdpa", "layers_per_stack": 2})
    batch = make_batch(model, seed=3, device=CPU)
    model(**batch).loss.backward()
    expected = gradients(model)
    model.zero_grad(set_to_none=True)
    split = split_decoder(model, stages=4)
    inputs, outputs, sent = [], [], split.inputs(batch)
    for stage in split.stages:
        received = tuple(tensor.detach().requires_grad_(tensor.is_floating_point()) for tensor in sent)
        inputs.append(received)
        result = stage(*received)
        sent = result if isinstance(result, tuple) else (result,)
        outputs.append(sent)
    loss = split.loss(outputs[-1][0], split.target(batch))
    loss.backward()
    for stage_inputs, stage_outputs in zip(reversed(inputs[1:]), reversed(outputs[:-1])):
        torch.autograd.backward(stage_outputs, grad_tensors=[tensor.grad for tensor in stage_inputs])
    assert all(torch.equal(gradients(model)[name], grad) for name, grad in expected.items())


def test_more_stages_than_layers_is_refused_saying_so():
    model = build_model({"attn": "sdpa", "layers_per_stack": 1})
    with pytest.raises(ValueError, match="2 decoder layers cannot fill 4 pipeline stages"):
        split_decoder(model, stages=4)
