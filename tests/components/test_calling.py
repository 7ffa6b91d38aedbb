"""build_optimizer, the one place the suites call an `optimizer_<value>` factory: `named_parameters`
(under the names the user's model spells), `model` and `implementation` go only to a factory whose
signature names them; and the reference factories' implementations."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper  # noqa: E402

from torchmatrix.models.optim import build_adamw, build_adamw_no_decay_on_norms, build_precision_aware  # noqa: E402
from torchmatrix.testing import UnavailableImplementation, accepts, build_optimizer  # noqa: E402

from helpers.matrix_files import REFERENCE_COMPONENTS, matrix_toml  # noqa: E402
from helpers.run_results import run_suites  # noqa: E402


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(4)
        self.proj = torch.nn.Linear(4, 4)


def wrapped_model() -> torch.nn.Module:
    """Checkpoint-wrapped layers under torch.compile: names carry `_orig_mod.` and `_checkpoint_wrapped_module.`."""
    model = torch.nn.Sequential(checkpoint_wrapper(Block()), Block())
    return torch.compile(model)


def test_named_parameters_arrive_without_wrapper_prefixes():
    received = {}

    def factory(params, *, lr, named_parameters=None):
        received["names"] = [name for name, _ in named_parameters]
        received["params"] = list(params)
        return torch.optim.SGD(received["params"], lr=lr)

    model = wrapped_model()
    assert any("_checkpoint_wrapped_module." in name for name, _ in model.named_parameters())
    build_optimizer(factory, model, lr=0.1)
    assert received["names"] == [
        "0.norm.weight",
        "0.norm.bias",
        "0.proj.weight",
        "0.proj.bias",
        "1.norm.weight",
        "1.norm.bias",
        "1.proj.weight",
        "1.proj.bias",
    ]
    assert len(received["params"]) == 8


def test_a_factory_without_the_keyword_or_with_only_kwargs_does_not_get_it():
    calls = []

    def plain(params, *, lr):
        calls.append("plain")
        return torch.optim.SGD(params, lr=lr)

    def forwarding(params, **kwargs):
        calls.append(sorted(kwargs))
        return torch.optim.SGD(params, **kwargs)

    build_optimizer(plain, wrapped_model(), lr=0.1)
    build_optimizer(forwarding, wrapped_model(), lr=0.1)
    assert calls == ["plain", ["lr"]]
    assert accepts(torch.optim.AdamW, "lr") and not accepts(forwarding, "named_parameters")


def test_a_factory_naming_model_gets_the_wrapped_model_itself():
    """For a stack whose optimizer is built from the model (torchtitan's OptimizersContainer)."""
    received = {}

    def factory(params, *, lr, model):
        received["model"] = model
        return torch.optim.SGD(model.parameters(), lr=lr)

    model = wrapped_model()
    build_optimizer(factory, model, lr=0.1)
    assert received["model"] is model


def test_the_reference_factory_keeps_weight_decay_off_the_norms():
    optimizer = build_optimizer(build_adamw_no_decay_on_norms, wrapped_model(), lr=1e-3, weight_decay=0.1)
    decayed, not_decayed = optimizer.param_groups
    assert (decayed["weight_decay"], not_decayed["weight_decay"]) == (0.1, 0.0)
    assert [tuple(p.shape) for p in not_decayed["params"]] == [(4,)] * 4  # both norms' weight and bias
    assert [tuple(p.shape) for p in decayed["params"]] == [(4, 4), (4,), (4, 4), (4,)]


@pytest.mark.slow
def test_param_groups_chosen_by_name_resume_and_reshard(tmp_path):
    """The reference factory that needs `named_parameters` (it raises without them) through resume
    and dtensor_optim at ws2-FSDP2: its two param groups save, load and reshard like one."""
    text = matrix_toml(
        axes={"world_size": [2], "fsdp": ["fsdp2"], "attn": ["sdpa"], "optimizer": ["adamw_norms"]},
        suites={
            name: {"timeout": 300, "axes": ["world_size", "fsdp", "optimizer"]} for name in ("resume", "dtensor_optim")
        },
        components={
            **REFERENCE_COMPONENTS,
            "batch": "torchmatrix.models.transformer:make_batch",
            "optimizer_adamw_norms": "torchmatrix.models.optim:build_adamw_no_decay_on_norms",
        },
    )
    done, outcomes = run_suites(tmp_path, text)
    assert done.returncode == 0, done.stdout + done.stderr
    tests = outcomes["ws2-fsdp2-sdpa-adamw_norms"]
    assert tests["test_state_restored_right_after_load[piece=param_groups]"] == "passed", tests
    assert tests["test_reshard_load_is_exact[model_kind=model,reshard=shrink]"] == "passed", tests


def test_implementation_goes_only_to_a_factory_that_names_it():
    received = []

    def naming(params, *, lr, implementation="default"):
        received.append(implementation)
        return torch.optim.SGD(params, lr=lr)

    def plain(params, *, lr):
        return torch.optim.SGD(params, lr=lr)

    build_optimizer(naming, wrapped_model(), lr=0.1)
    build_optimizer(naming, wrapped_model(), lr=0.1, implementation="foreach")
    build_optimizer(plain, wrapped_model(), lr=0.1, implementation="default")
    assert received == ["default", "foreach"]
    with pytest.raises(UnavailableImplementation, match="takes no `implementation` keyword"):
        build_optimizer(plain, wrapped_model(), lr=0.1, implementation="fused")


@pytest.mark.parametrize(
    ("implementation", "flags"),
    [("forloop", {"foreach": False, "fused": False}), ("foreach", {"foreach": True}), ("fused", {"fused": True})],
)
def test_the_reference_adamw_builds_each_kernel_and_keeps_it_across_a_load(implementation, flags):
    """torch's load_state_dict takes the kernel flags from the checkpoint; the reference puts its own back."""
    params = list(torch.nn.Linear(4, 4).parameters())
    optimizer = build_adamw(params, lr=1e-3, implementation=implementation)
    assert {key: optimizer.param_groups[0][key] for key in flags} == flags
    other = "fused" if implementation != "fused" else "forloop"
    for param in params:
        param.grad = torch.ones_like(param)
    saver = build_adamw(params, lr=1e-3, implementation=other)
    saver.step()
    optimizer.load_state_dict(saver.state_dict())
    assert {key: optimizer.param_groups[0][key] for key in flags} == flags
    assert all(torch.equal(optimizer.state[p]["exp_avg"], saver.state[p]["exp_avg"]) for p in params)


def test_the_compiled_adamw_is_an_optimizer_whose_groups_and_state_dict_hold_a_float_lr():
    """A tensor LR in the groups would go into the optimizer's and the scheduler's state dicts as a
    tensor, which DCP keys apart from a float: the eager implementations could not load them."""
    optimizer = build_adamw(torch.nn.Linear(4, 4).parameters(), lr=1e-3, implementation="compiled")
    assert isinstance(optimizer, torch.optim.Optimizer)
    assert type(optimizer.state_dict()["param_groups"][0]["lr"]) is float


def test_the_precision_aware_optimizer_has_only_its_default_implementation():
    params = [torch.nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))]
    build_precision_aware(params, lr=1e-3, implementation="default")
    for implementation in ("forloop", "foreach", "fused", "compiled"):
        with pytest.raises(UnavailableImplementation, match="PrecisionAwareAdamW has one implementation"):
            build_precision_aware(params, lr=1e-3, implementation=implementation)
    with pytest.raises(ValueError, match="expected one of default, forloop, foreach, fused, compiled"):
        build_precision_aware(params, lr=1e-3, implementation="fuzed")


def test_fused_adamw_on_cpu_before_torch_2_4_is_unavailable_saying_so(monkeypatch):
    monkeypatch.setattr(torch, "__version__", torch.torch_version.TorchVersion("2.3.1"))
    with pytest.raises(
        UnavailableImplementation, match=r"fused AdamW on CPU exists from torch 2.4; this is torch 2.3.1"
    ):
        build_adamw(torch.nn.Linear(2, 2).parameters(), lr=1e-3, implementation="fused")
