"""A user's training stack that follows the component protocol, as text for a throwaway package
`userstack`, and the one resume cell the component-check tests run it in."""

from __future__ import annotations

from helpers.matrix_files import matrix_toml

GOOD = {
    "model": "userstack.stack:build_model",
    "parallelize": "userstack.stack:parallelize",
    "optimizer_adamw": "userstack.stack:build_optimizer",
    "checkpointer": "userstack.stack:Checkpointer",
    "dataset": "userstack.stack:Dataset",
}


def resume_matrix(components: dict[str, str], optional: str = "") -> str:
    """One resume cell whose components are exactly these, and an `[optional]` table's text."""
    text = matrix_toml(axes={"fsdp": ["none"], "optimizer": ["adamw"]}, suites={"resume": {}}, components=components)
    return text + (f"\n[optional]\n{optional}\n" if optional else "")


USER_STACK = """
def build_model(cell, *, dtype, dropout=0.0):
    return None


def build_model_without_dropout(cell, *, dtype):
    return None


def build_model_positional_dtype(cell, dtype, dropout=0.0):
    return None


def build_optimizer(params, *, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
    import torch

    return torch.optim.AdamW(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


def build_optimizer_by_name(params, *, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, named_parameters=None):
    import torch

    assert [name for name, _ in named_parameters] == ["weight"], named_parameters
    return torch.optim.AdamW([param for _, param in named_parameters], lr=lr)


def build_optimizer_needing_names(params, *, lr, named_parameters, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
    import torch

    return torch.optim.AdamW(named_parameters, lr=lr)


class OptimizersContainer:  # like torchtitan's before it subclassed Optimizer: one optimizer per model part

    def __init__(self, params, *, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        self.optimizers = [build_optimizer(params, lr=lr)]

    def step(self):
        for optimizer in self.optimizers:
            optimizer.step()

    def zero_grad(self):
        for optimizer in self.optimizers:
            optimizer.zero_grad()

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def build_container_from_the_model(params, *, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, model):
    # like torchtitan's OptimizersContainer: an Optimizer built from the model whose own param group
    # has no lr and whose state stays empty, the state and lr on its inner optimizers
    import torch

    class ModelOptimizersContainer(torch.optim.Optimizer):
        def __init__(self):
            self.optimizers = [build_optimizer(model.parameters(), lr=lr)]
            super().__init__(list(model.parameters()), {})

    return ModelOptimizersContainer()


def build_groups_without_lr(params, *, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
    optimizer = build_optimizer(params, lr=lr)
    del optimizer.param_groups[0]["lr"]
    return optimizer


def build_optimizer_that_needs_a_gpu(params, *, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
    raise RuntimeError("this factory only runs on a GPU")


class Sharding:  # for long annotations, as torchtitan's ParallelDims and JobConfig make them
    pass


def parallelize_with_long_annotations(
    model: "dict[str, list[tuple[Sharding, Sharding, Sharding, Sharding, Sharding, Sharding, Sharding]]]",
    parallel_dims: "dict[str, list[tuple[Sharding, Sharding, Sharding, Sharding, Sharding, Sharding, Sharding]]]",
    job_config: "dict[str, list[tuple[Sharding, Sharding, Sharding, Sharding, Sharding, Sharding, Sharding]]]" = None,
):
    return model


def parallelize(model, cell, *, device, activation_checkpointing=False):
    return model


class Checkpointer:
    def save(self, directory, *, model, optimizer, scheduler, loader, step):
        pass

    def load(self, directory, *, model, optimizer, scheduler, loader):
        return 0


class CheckpointerWithoutLoad:
    def save(self, directory, **pieces):
        pass


class Dataset:
    def __init__(self, path):
        self.path = path

    @classmethod
    def write(cls, path, *, vocab_size, num_sequences, seq_len, seed):
        pass

    def loader(self, *, batch_size, rank, world_size):
        return iter(())


NOT_A_FACTORY = 3
"""
