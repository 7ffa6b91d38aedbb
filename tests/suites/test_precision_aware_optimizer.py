"""Unit tests of models.optim.PrecisionAwareAdamW against torch.optim.AdamW.

With fp32 params and fp32 moments it is AdamW, bit for bit. With bf16 moments the only change
is the rounding of the stored moments, so the params must stay close to fp32 AdamW: within
MOMENT_ROUNDING_BOUND after STEPS steps (each step moves a param by at most about lr, so the
bound is a fraction of the distance a param can travel). The measured deviations are printed
and recorded as JUnit properties.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torchmatrix.models.optim import PrecisionAwareAdamW, build_adamw, build_precision_aware  # noqa: E402

HYPERPARAMETERS = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
STEPS = 100
MOMENT_ROUNDING_BOUND = 0.02 * HYPERPARAMETERS["lr"] * STEPS
BF16_PARAMS_BOUND = 0.1 * HYPERPARAMETERS["lr"] * STEPS


def regression_model(dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).to(dtype)


def train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> float:
    """Fit a fixed random linear map from one seeded input stream; returns the last loss."""
    generator = torch.Generator().manual_seed(1)
    target_map = torch.randn(32, 8, generator=generator)
    dtype = next(model.parameters()).dtype
    loss = torch.zeros(())
    for _ in range(steps):
        inputs = torch.randn(16, 32, generator=generator)
        loss = (model(inputs.to(dtype)).float() - inputs @ target_map).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return loss.item()


def max_abs_deviation(expected: torch.nn.Module, actual: torch.nn.Module) -> float:
    return max(
        (a.detach().double() - b.detach().double()).abs().max().item()
        for a, b in zip(expected.parameters(), actual.parameters())
    )


def test_fp32_params_and_moments_match_torch_adamw_step_for_step():
    reference_model, model = regression_model(torch.float32), regression_model(torch.float32)
    reference = torch.optim.AdamW(reference_model.parameters(), foreach=False, **HYPERPARAMETERS)
    optimizer = PrecisionAwareAdamW(model.parameters(), moment_dtype=torch.float32, **HYPERPARAMETERS)
    for step in range(1, 21):
        inputs = torch.randn(16, 32, generator=torch.Generator().manual_seed(step))
        for one_model, one_optimizer in ((reference_model, reference), (model, optimizer)):
            one_optimizer.zero_grad()
            one_model(inputs).pow(2).mean().backward()
            one_optimizer.step()
        for (name, expected), actual in zip(reference_model.named_parameters(), model.parameters()):
            assert torch.equal(expected, actual), (
                f"step {step}, {name}: max abs diff {(expected - actual).abs().max().item():.3e}"
            )
            for key in ("exp_avg", "exp_avg_sq"):
                assert torch.equal(reference.state[expected][key], optimizer.state[actual][key]), (
                    f"step {step}, {name}.{key} differs"
                )


def test_bf16_moments_stay_within_bound_of_fp32_adamw(record_property):
    reference_model, model = regression_model(torch.float32), regression_model(torch.float32)
    reference_loss = train(
        reference_model, torch.optim.AdamW(reference_model.parameters(), foreach=False, **HYPERPARAMETERS), STEPS
    )
    loss = train(model, PrecisionAwareAdamW(model.parameters(), moment_dtype=torch.bfloat16, **HYPERPARAMETERS), STEPS)
    deviation = max_abs_deviation(reference_model, model)
    record_property("bf16_moments_max_abs_param_deviation", deviation)
    print(
        f"fp32 params, bf16 moments, {STEPS} steps: max |param - fp32 AdamW| = {deviation:.3e} (bound {MOMENT_ROUNDING_BOUND:.1e}); loss {loss:.5f} vs {reference_loss:.5f}"
    )
    assert 0 < deviation <= MOMENT_ROUNDING_BOUND


def test_bf16_params_and_moments_stay_within_bound_of_fp32_adamw(record_property):
    """The configuration the resume suite runs: most of this deviation comes from the bf16 forward, not the optimizer."""
    reference_model, model = regression_model(torch.float32), regression_model(torch.bfloat16)
    reference_loss = train(
        reference_model, torch.optim.AdamW(reference_model.parameters(), foreach=False, **HYPERPARAMETERS), STEPS
    )
    optimizer = build_precision_aware(model.parameters(), **HYPERPARAMETERS)
    loss = train(model, optimizer, STEPS)
    masters = [optimizer.state[param]["master"] for param in model.parameters()]
    deviation = max(
        (a.detach().double() - m.double()).abs().max().item() for a, m in zip(reference_model.parameters(), masters)
    )
    record_property("bf16_params_bf16_moments_max_abs_master_deviation", deviation)
    print(
        f"bf16 params, bf16 moments, {STEPS} steps: max |master - fp32 AdamW| = {deviation:.3e} (bound {BF16_PARAMS_BOUND:.1e}); loss {loss:.5f} vs {reference_loss:.5f}"
    )
    assert deviation <= BF16_PARAMS_BOUND


def test_state_is_created_lazily_in_its_dtypes():
    model = regression_model(torch.bfloat16)
    optimizer = build_precision_aware(model.parameters(), **HYPERPARAMETERS)
    assert not optimizer.state
    train(model, optimizer, 1)
    for param in model.parameters():
        state = optimizer.state[param]
        assert state["master"].dtype == torch.float32 and torch.equal(
            state["master"].to(torch.bfloat16), param.detach()
        )
        assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.bfloat16
        assert state["step"].item() == 1


def test_state_dict_widens_state_to_fp32_losslessly():
    """Like TransformerEngine's FusedAdam; FSDP1 needs one state dtype per parameter."""
    model = regression_model(torch.bfloat16)
    optimizer = build_precision_aware(model.parameters(), **HYPERPARAMETERS)
    train(model, optimizer, 2)
    saved = optimizer.state_dict()["state"]
    for param_id, param in enumerate(model.parameters()):
        for key, value in optimizer.state[param].items():
            assert saved[param_id][key].dtype == torch.float32, key
            assert torch.equal(saved[param_id][key].to(value.dtype), value), key


@pytest.mark.parametrize("moment_dtype", [torch.bfloat16, torch.float32])
def test_load_state_dict_keeps_state_dtypes_and_values(moment_dtype):
    model = regression_model(torch.bfloat16)
    optimizer = build_precision_aware(model.parameters(), moment_dtype=moment_dtype, **HYPERPARAMETERS)
    train(model, optimizer, 3)
    fresh = build_precision_aware(model.parameters(), moment_dtype=moment_dtype, **HYPERPARAMETERS)
    fresh.load_state_dict(optimizer.state_dict())
    for param in model.parameters():
        for key, value in optimizer.state[param].items():
            loaded = fresh.state[param][key]
            assert loaded.dtype == value.dtype and torch.equal(loaded, value), key
            assert loaded.data_ptr() != value.data_ptr(), f"{key} shares storage with the state dict it was loaded from"


def test_adamw_factory_prefers_fused():
    optimizer = build_adamw(regression_model(torch.float32).parameters(), **HYPERPARAMETERS)
    assert optimizer.defaults["fused"] or optimizer.defaults["foreach"]


@pytest.fixture
def single_rank_group():
    """A one-rank gloo group in this process, for building DTensors."""
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_dtensor_params_get_dtensor_state_with_their_layout(single_rank_group):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (1,))
    param = torch.nn.Parameter(distribute_tensor(torch.randn(8, 4, dtype=torch.bfloat16), mesh, [Shard(0)]))
    optimizer = build_precision_aware([param], **HYPERPARAMETERS)
    param.grad = distribute_tensor(torch.randn(8, 4, dtype=torch.bfloat16), mesh, [Shard(0)])
    optimizer.step()
    for key in ("master", "exp_avg", "exp_avg_sq"):
        value = optimizer.state[param][key]
        assert isinstance(value, DTensor), key
        assert (value.device_mesh, value.placements, value.shape, value.stride()) == (
            mesh,
            param.placements,
            param.shape,
            param.stride(),
        ), key
