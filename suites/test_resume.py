"""Resume exactness: a run checkpointed at step K and resumed must be bit-identical to one that
never stopped (shared/seeds/resume-optimizer-moments.txt).

Per cell, run A trains N steps straight. Run B trains K steps and checkpoints; then the model,
optimizer, scheduler, loader and RNG are all rebuilt from a different seed (so a load that
restores nothing cannot pass), loaded, and trained for the remaining N - K steps. Losses after
the resume, final parameters and every optimizer state tensor must be equal under torch.equal,
and the moments must be back before the first resumed step. Dropout, a warm-up LR schedule
and an on-disk dataset make the RNG, scheduler and loader position part of what must resume.

Components (matrix.toml `[components]`): `model`, `parallelize`, `optimizer_<optimizer axis>`,
`checkpointer`, `dataset`; swapping one for a mutant must turn this suite red.
"""

from __future__ import annotations

import random

import pytest
import torch

from suites.deterministic import deterministic_algorithms
from torchmatrix.components import load

DEFAULT_OPTIONS = {
    "steps": 8,
    "resume_step": 4,
    "warmup_steps": 6,
    "lr": 1e-2,
    "weight_decay": 0.1,
    "dropout": 0.1,
    "batch_size": 2,
    "vocab_size": 64,
    "seq_len": 16,
    "num_sequences": 64,
    "seed": 1234,
    "rebuild_seed": 98765,
    "bf16_param_optimizers": ["precision_aware"],
}

_experiments: dict[str, list[dict] | str] = {}


def options_for(suite_options: dict) -> dict:
    """`[suites.resume.options]` over DEFAULT_OPTIONS, checked for at least two resumed steps."""
    options = {**DEFAULT_OPTIONS, **suite_options}
    if not 1 <= options["resume_step"] <= options["steps"] - 2:
        raise pytest.UsageError(
            f"[suites.resume.options]: need 1 <= resume_step <= steps - 2 (two resumed steps at least), got steps={options['steps']}, resume_step={options['resume_step']}"
        )
    return options


def experiment(cell, ranks, suite_options, components, tmp_path) -> list[dict]:
    """Both runs of the cell, one record per rank; computed once per cell and shared by its tests
    (a failure too, so a broken or hung cell costs one deadline, not one per test)."""
    if cell.id not in _experiments:
        _experiments[cell.id] = f"{cell.id}: the training runs failed in an earlier test of this cell"
        options = options_for(suite_options)
        dataset = load(components["dataset"])
        data_path = str(tmp_path / "tokens.pt")
        dataset.write(
            data_path,
            vocab_size=options["vocab_size"],
            num_sequences=options["num_sequences"],
            seq_len=options["seq_len"],
            seed=0,
        )
        _experiments[cell.id] = ranks.run(
            straight_and_resumed, dict(cell), options, components, data_path, str(tmp_path / "checkpoint")
        )
    elif isinstance(_experiments[cell.id], str):
        pytest.fail(_experiments[cell.id])
    return _experiments[cell.id]


def test_rebuilt_run_starts_from_other_weights(cell, ranks, suite_options, components, tmp_path):
    """Guards the suite itself: the rebuilt run must differ before the load, or a no-op load would pass."""
    for rank, record in enumerate(experiment(cell, ranks, suite_options, components, tmp_path)):
        assert not record["rebuilt_equals_saved"], (
            f"{cell.id} rank {rank}: the rebuilt model already equals the checkpointed one; the rebuild seed has no effect"
        )


def test_moments_restored_before_first_step(cell, ranks, suite_options, components, tmp_path):
    """Right after load, before any step: every state tensor the optimizer had at save is back, in its dtype and value."""
    for rank, record in enumerate(experiment(cell, ranks, suite_options, components, tmp_path)):
        saved, loaded = record["state_at_save"], record["state_after_load"]
        assert saved, f"{cell.id} rank {rank}: the optimizer had no state at the checkpoint step"
        problems = state_mismatches(saved, loaded)
        listing = "\n".join(problems)
        assert not problems, f"{cell.id} rank {rank}, optimizer state right after load vs at save:\n{listing}"


def test_losses_identical_after_resume(cell, ranks, suite_options, components, tmp_path):
    options = options_for(suite_options)
    first = options["resume_step"] + 1
    for rank, record in enumerate(experiment(cell, ranks, suite_options, components, tmp_path)):
        straight, resumed = record["straight"]["losses"][first - 1 :], record["resumed"]["losses"]
        for step, (a, b) in enumerate(zip(straight, resumed), start=first):
            assert torch.equal(a, b), (
                f"{cell.id} rank {rank}: loss at step {step} (resumed at {first - 1}): straight {a.item()!r}, resumed {b.item()!r}, diff {(b - a).item():+.3e}"
            )


def test_final_parameters_identical(cell, ranks, suite_options, components, tmp_path):
    for rank, record in enumerate(experiment(cell, ranks, suite_options, components, tmp_path)):
        straight, resumed = record["straight"]["parameters"], record["resumed"]["parameters"]
        problems = [
            f"  {name}: {problem}" for name in straight if (problem := tensor_mismatch(straight[name], resumed[name]))
        ]
        listing = "\n".join(problems)
        assert not problems, f"{cell.id} rank {rank}, final parameters, straight vs resumed:\n{listing}"


def test_final_optimizer_state_identical(cell, ranks, suite_options, components, tmp_path):
    for rank, record in enumerate(experiment(cell, ranks, suite_options, components, tmp_path)):
        problems = state_mismatches(record["straight"]["optimizer_state"], record["resumed"]["optimizer_state"])
        listing = "\n".join(problems)
        assert not problems, f"{cell.id} rank {rank}, final optimizer state, straight vs resumed:\n{listing}"


def tensor_mismatch(expected: torch.Tensor, actual: torch.Tensor) -> str | None:
    """None when bit-identical, else what differs: dtype, shape, or how many elements and by how much."""
    if expected.dtype != actual.dtype:
        return f"dtype {actual.dtype}, expected {expected.dtype}"
    if expected.shape != actual.shape:
        return f"shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    if torch.equal(expected, actual):
        return None
    difference = (actual.double() - expected.double()).abs()
    return f"{int((difference > 0).sum())}/{difference.numel()} elements differ, max abs diff {difference.max().item():.3e}"


def value_mismatch(expected, actual) -> str | None:
    """tensor_mismatch for tensors; plain equality for the other values a state may hold."""
    if isinstance(expected, torch.Tensor) and isinstance(actual, torch.Tensor):
        return tensor_mismatch(expected, actual)
    return None if expected == actual else f"{actual!r}, expected {expected!r}"


def state_mismatches(expected: dict, actual: dict) -> list[str]:
    """Per parameter and state key: what is missing, extra or not bit-identical."""
    problems = []
    for name, expected_state in expected.items():
        actual_state = actual.get(name)
        if actual_state is None:
            problems.append(f"  {name}: no state at all (expected {sorted(expected_state)})")
            continue
        for key, value in expected_state.items():
            problem = "missing" if key not in actual_state else value_mismatch(value, actual_state[key])
            if problem:
                problems.append(f"  {name}.{key}: {problem}")
    problems += [f"  {name}: state present, none expected" for name in actual.keys() - expected.keys()]
    return problems


def straight_and_resumed(cell: dict, options: dict, components: dict, data_path: str, checkpoint_dir: str) -> dict:
    """Rank function: run A (N steps straight) and run B (K steps, save, rebuild, load, N - K steps)."""
    import torch.distributed as dist

    with deterministic_algorithms():
        return _straight_and_resumed(
            cell, options, components, data_path, checkpoint_dir, dist.get_rank(), dist.get_world_size()
        )


def _straight_and_resumed(
    cell: dict, options: dict, components: dict, data_path: str, checkpoint_dir: str, rank: int, world_size: int
) -> dict:
    steps, resume_step = options["steps"], options["resume_step"]
    checkpointer = load(components["checkpointer"])()

    run_a = TrainingRun(cell, options, components, data_path, rank, world_size, seed=options["seed"])
    straight_losses = [run_a.train_step() for _ in range(steps)]

    run_b = TrainingRun(cell, options, components, data_path, rank, world_size, seed=options["seed"])
    for _ in range(resume_step):
        run_b.train_step()
    saved_parameters = run_b.parameters()
    state_at_save = run_b.optimizer_state()
    checkpointer.save(checkpoint_dir, step=resume_step, **run_b.checkpointables())

    rebuilt = TrainingRun(cell, options, components, data_path, rank, world_size, seed=options["rebuild_seed"])
    rebuilt_equals_saved = all(torch.equal(p, saved_parameters[n]) for n, p in rebuilt.parameters().items())
    loaded_step = checkpointer.load(checkpoint_dir, **rebuilt.checkpointables())
    if loaded_step != resume_step:
        raise AssertionError(f"checkpointer.load returned step {loaded_step}, saved at step {resume_step}")
    state_after_load = rebuilt.optimizer_state()
    resumed_losses = [rebuilt.train_step() for _ in range(steps - resume_step)]

    return {
        "straight": {
            "losses": straight_losses,
            "parameters": run_a.parameters(),
            "optimizer_state": run_a.optimizer_state(),
        },
        "resumed": {
            "losses": resumed_losses,
            "parameters": rebuilt.parameters(),
            "optimizer_state": rebuilt.optimizer_state(),
        },
        "state_at_save": state_at_save,
        "state_after_load": state_after_load,
        "rebuilt_equals_saved": rebuilt_equals_saved,
    }


class TrainingRun:
    """Model, optimizer, warm-up scheduler and loader built from the cell's components and one seed.

    The model is initialised from `seed` (identically on every rank); dropout then draws from
    `seed + 1 + rank`, so ranks mask differently, as they do in real data-parallel training.
    """

    def __init__(
        self, cell: dict, options: dict, components: dict, data_path: str, rank: int, world_size: int, *, seed: int
    ):
        from torchmatrix.worker import current_device

        self.device = current_device()
        param_dtype = torch.bfloat16 if cell["optimizer"] in options["bf16_param_optimizers"] else torch.float32
        torch.manual_seed(seed)
        model = load(components["model"])(cell, dropout=options["dropout"], dtype=param_dtype)
        self.model = load(components["parallelize"])(model, cell, device=self.device)
        self.optimizer = load(components[f"optimizer_{cell['optimizer']}"])(
            self.model.parameters(), lr=options["lr"], betas=(0.9, 0.95), eps=1e-8, weight_decay=options["weight_decay"]
        )
        warmup = options["warmup_steps"]
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda step: min(1.0, (step + 1) / warmup))
        dataset = load(components["dataset"])(data_path)
        self.loader = dataset.loader(batch_size=options["batch_size"], rank=rank, world_size=world_size)
        torch.manual_seed(seed + 1 + rank)
        random.seed(seed + 1 + rank)

    def train_step(self) -> torch.Tensor:
        """One optimizer step; returns this rank's loss as a CPU fp32 scalar."""
        self.model.train()
        loss = self.model(next(self.loader).to(self.device)).loss
        loss.backward()
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss.detach().float().cpu()

    def checkpointables(self) -> dict:
        return {"model": self.model, "optimizer": self.optimizer, "scheduler": self.scheduler, "loader": self.loader}

    def parameters(self) -> dict[str, torch.Tensor]:
        """This rank's shard of every parameter, by name, copied to the CPU."""
        return {name: local_shard(param) for name, param in self.model.named_parameters()}

    def optimizer_state(self) -> dict[str, dict]:
        """This rank's shard of every optimizer state value, by parameter name, copied to the CPU."""
        names = {id(param): name for name, param in self.model.named_parameters()}
        return {
            names[id(param)]: {
                key: local_shard(value) if isinstance(value, torch.Tensor) else value for key, value in state.items()
            }
            for param, state in self.optimizer.state.items()
        }


def local_shard(tensor: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return local.detach().to("cpu", copy=True)
