"""The component protocol: per `[components]` name, what the suites pass to the factory and what
they expect back, written down once as data so that the docs' reference table and the pre-run signature
check (torchmatrix.run.component_check) read the same thing.

It is derived from the calls the suites make. An argument is `always` passed, passed by `some`
suites only (the factory needs a default for it), or `optional` (passed only where the factory's
signature names it, torchmatrix.components.calling; left out, the suites skip what needs it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

ALWAYS, SOME, OPTIONAL = "always", "some", "optional"
OPTIONAL_NOTE = " (only where the signature names it)"


@dataclass(frozen=True)
class Argument:
    """One argument a suite passes; positional ones come first, in order."""

    name: str
    meaning: str
    passed: str = ALWAYS
    positional: bool = False


@dataclass(frozen=True)
class Member:
    """A method the suites call: on the component itself, or on what calling it returns."""

    name: str
    arguments: tuple[Argument, ...]
    returns: str
    on_instance: bool = True
    optional: bool = False  # the suites call their own default where the object has no such method

    def call_text(self, owner: str) -> str:
        return f"{owner}.{self.name}({parameters_text(self.arguments)})"


@dataclass(frozen=True)
class Component:
    """What one `[components]` entry must be: a callable taking `arguments`, returning `returns`."""

    name: str
    arguments: tuple[Argument, ...]
    returns: str
    suites: tuple[str, ...]
    members: tuple[Member, ...] = ()
    default: str | None = None  # the import path the suites use when [components] has no entry
    form: str = ""  # which of a component's forms this entry describes, where it has several (the checkpointer's)

    def call_text(self, callee: str | None = None) -> str:
        """The call as the suites make it, e.g. `model(cell, *, dtype, dropout=...)`."""
        return f"{callee or self.name}({parameters_text(self.arguments)})"

    def owner_text(self, member: Member) -> str:
        """How the suites reach a member: `dataset.write`, or `checkpointer().save` on what the factory returns."""
        return self.call_text() if member.on_instance else self.name


def parameters_text(arguments: tuple[Argument, ...]) -> str:
    """Arguments as a signature reads: positional names, then `*` and the keywords (`=...` when not always passed)."""
    positional = [a.name for a in arguments if a.positional]
    keywords = [a.name if a.passed == ALWAYS else f"{a.name}=..." for a in arguments if not a.positional]
    return ", ".join(positional + (["*", *keywords] if keywords else []))


GRAD_CKPT, RESUME, DTENSOR_OPTIM = "grad_ckpt", "resume", "dtensor_optim"
CROSS_VERSION = "cross_version"  # writes and reads through what resume trains with
PARALLEL_EQUIVALENCE, PEAK_MEMORY = "parallel_equivalence", "peak_memory"
RESUME_BF16_PARAM_OPTIMIZERS = ("precision_aware",)
"""The `optimizer` axis values whose model the resume suite builds with bf16 params unless
`[suites.resume.options] bf16_param_optimizers` names others; every other optimizer gets fp32."""

SAVE_RETURNS = (
    "None, or a mapping of extra state it wrote (`tokens_seen`, ...), which `load` must return equal; or, saving "
    "asynchronously, a future (`result()`, resolving to None or that mapping) or an object with `staging_completion` "
    "and `upload_completion` futures (DCP's `AsyncSaveResponse`)"
)
LOAD_RETURNS = 'the step that was saved, or a mapping with "step" and the extra state `save` returned'

CELL = Argument(
    "cell", 'the cell: a read-only mapping of axis -> value (`cell["attn"]`, `cell.world_size`)', positional=True
)

COMPONENTS: tuple[Component, ...] = (
    Component(
        name="model",
        arguments=(
            CELL,
            Argument("dtype", "torch.dtype of the parameters (float32, or bfloat16 for bf16 suites and optimizers)"),
            Argument("dropout", "dropout probability; dtensor_optim leaves it out, so default it to 0.0", SOME),
        ),
        returns=(
            "an nn.Module on the CPU, its parameters drawn from the global RNG (the suites seed it first); "
            "`model(tokens)` (resume, the loader's batch) and `model(**batch)` return the loss as a tensor, a "
            "tuple's first element, a dict's `\"loss\"` or `.loss`. grad_ckpt finds the KV cache, any pytree of "
            "tensors and plain values (dicts, lists, dataclasses, transformers' `DynamicCache`), on the output's "
            "`past_key_values`, else through the cache hook: the containers forward hands to its checkpointed "
            "units (`checkpoint(self._run_layer, i, hidden, cache)`) and then writes tensors into, so the cache "
            "need not be returned. Optional: "
            "`body_calls()` (layer -> how often its body ran; without it grad_ckpt counts each checkpoint unit's "
            "runs by instrumenting `torch.utils.checkpoint.checkpoint`), `compute_dtype` (the torch.dtype it "
            "computes in when that is not its parameters', e.g. bf16 under autocast: grad_ckpt compares and labels "
            "at that precision), `decoder_layers()` (the checkpointing and sharding units; only the reference "
            "`parallelize` needs it)"
        ),
        suites=(GRAD_CKPT, RESUME, CROSS_VERSION, DTENSOR_OPTIM, PARALLEL_EQUIVALENCE, PEAK_MEMORY),
    ),
    Component(
        name="batch",
        arguments=(
            Argument(
                "model",
                "the user's model, below any wrapper `parallelize` put on it: read sizes from it, do not call it",
                positional=True,
            ),
            Argument("seed", "seed for this rank's batch; use a torch.Generator, not the global RNG"),
            Argument("device", "torch.device of this rank"),
        ),
        returns=(
            "a dict of keyword arguments for `model(**batch)`; grad_ckpt also takes a tuple (`model(*batch)`) "
            "or a tensor (`model(batch)`)"
        ),
        suites=(GRAD_CKPT, DTENSOR_OPTIM, PARALLEL_EQUIVALENCE, PEAK_MEMORY),
    ),
    Component(
        name="parallelize",
        arguments=(
            Argument(
                "model", "what `model` built, or dtensor_optim's probe (it has `decoder_layers()`)", positional=True
            ),
            CELL,
            Argument("device", "torch.device of this rank (cpu with gloo, cuda with nccl)"),
            Argument("activation_checkpointing", "checkpoint every decoder layer; only grad_ckpt passes it", SOME),
            Argument(
                "mesh",
                "the DeviceMesh to shard over: the cell's (`torchmatrix.testing.cell_mesh`: 1-D over every rank for "
                '`mesh = "flat"`, 2-D with dims ("dp_replicate", "dp_shard") for `hsdp` and ("dp_shard", "tp") for '
                "`fsdp_tp`), or dtensor_optim's reshard worlds (1-D); without it the reshard tests skip",
                OPTIONAL,
            ),
        ),
        returns=(
            'the model on `device`, wrapped as `cell["fsdp"]` says (none | fsdp1 | fsdp2), checkpointing switched '
            "as asked, in the stack's own way (its flag, `checkpoint_wrapper`, `torch.utils.checkpoint` in forward): "
            'grad_ckpt counts the checkpoint units itself; parallel_equivalence also calls it with `fsdp` "none", '
            '`mesh` "flat" and `world_size` 1 for its single-process reference, the plain model on `device`, in a '
            "world of one rank of its own (the default group is that rank alone: docs, which world)"
        ),
        suites=(GRAD_CKPT, RESUME, CROSS_VERSION, DTENSOR_OPTIM, PARALLEL_EQUIVALENCE, PEAK_MEMORY),
    ),
    Component(
        name="optimizer_<value>",
        arguments=(
            Argument("params", "the wrapped model's parameters()", positional=True),
            Argument("lr", "learning rate"),
            Argument("betas", "Adam betas; dtensor_optim leaves it out", SOME),
            Argument("eps", "Adam epsilon; dtensor_optim leaves it out", SOME),
            Argument("weight_decay", "decoupled weight decay; dtensor_optim leaves it out", SOME),
            Argument(
                "named_parameters",
                "a list of (name, param) of the wrapped model, named as the user's model names them "
                "(components/wrapper_chain.py): no slot of a wrapper above it (a trainer's `_forward_module.`, DDP's "
                "and FSDP1's `module.`, `_orig_mod.`) and no prefix of one inside (`_fsdp_wrapped_module.`, "
                "`_checkpoint_wrapped_module.`); for param groups chosen by name (no weight decay on norms)",
                OPTIONAL,
            ),
            Argument(
                "model",
                "the wrapped model, for an optimizer built from it (torchtitan's `OptimizersContainer`)",
                OPTIONAL,
            ),
            Argument(
                "implementation",
                "the cell's `optimizer_impl` (`default` where the matrix has no such axis): `default` (the factory's "
                "own choice), `forloop`, `foreach`, `fused` or `compiled` (the step under `torch.compile`); raise "
                "`torchmatrix.testing.UnavailableImplementation(reason)` for one it cannot build here, and the cell's "
                "optimizer tests skip with the reason. A factory without it skips in a cell asking for a non-default one",
                OPTIONAL,
            ),
        ),
        returns=(
            "a torch.optim.Optimizer, or an object with what the suites use of one: `.state` (a mapping "
            "param -> state), `.param_groups` (a list of dicts, each with `lr`), `step`, `zero_grad`, "
            "`state_dict`, `load_state_dict`; or a container of such optimizers in a list `.optimizers` whose own "
            "`.state` is empty (state and `lr` are read from those); one component per value of the `optimizer` axis"
        ),
        suites=(RESUME, CROSS_VERSION, DTENSOR_OPTIM, PARALLEL_EQUIVALENCE, PEAK_MEMORY),
    ),
    Component(
        name="plain_state_<value>",
        arguments=(
            Argument(
                "state",
                "one param's optimizer state as this rank holds it (`optimizer.state[param]`, or its entry in a "
                "full optimizer state dict): values may be DTensors, tensor subclasses, codes beside their scales",
                positional=True,
            ),
        ),
        returns=(
            "a dict name -> plain torch.Tensor (this rank's values, dequantized) or other value, which the suites "
            "compare; optional: without an entry, `torchmatrix.suites.state.optimizer_state:plain_state` takes each DTensor's local "
            "shard and calls `dequantize()` on a tensor subclass that has it"
        ),
        suites=(RESUME, CROSS_VERSION, DTENSOR_OPTIM),
        default="torchmatrix.suites.state.optimizer_state:plain_state",
    ),
    Component(
        name="clip_grad_norm",
        arguments=(
            Argument("model", "the wrapped model after backward, its gradients reduced", positional=True),
            Argument("max_norm", "the largest total 2-norm the gradient may keep"),
            Argument(
                "cell", CELL.meaning + "; for a clip that depends on the parallelism (torchtitan's pp_mesh)", OPTIONAL
            ),
        ),
        returns=(
            "the total 2-norm of the whole model's gradient, across every rank (a tensor, a DTensor, read as its full "
            "tensor, or a number), having scaled every gradient in place by min(1, max_norm / (norm + 1e-6)); "
            "optional: without an entry, `torchmatrix.suites.components.gradient_clipping:clip_grad_norm` (FSDP1's own "
            "`clip_grad_norm_`, else `torch.nn.utils.clip_grad_norm_`, per device mesh where parameters live on several)"
        ),
        suites=(PARALLEL_EQUIVALENCE,),
        default="torchmatrix.suites.components.gradient_clipping:clip_grad_norm",
    ),
    Component(
        name="no_sync",
        arguments=(
            Argument("model", "the wrapped model, before a micro-batch's forward", positional=True),
            Argument("cell", CELL.meaning, OPTIONAL),
        ),
        returns=(
            "a context manager under which a forward and backward leave the gradients unreduced (a cell whose "
            "`accumulation` is not none runs every micro-batch but the last under it); optional: without an entry, "
            "`torchmatrix.suites.references.accumulation:gradient_sync_off` (FSDP2's `set_requires_gradient_sync(False)`, "
            "FSDP1's and DDP's `no_sync()`)"
        ),
        suites=(PARALLEL_EQUIVALENCE,),
        default="torchmatrix.suites.references.accumulation:gradient_sync_off",
    ),
    Component(
        name="pipeline_split",
        arguments=(
            Argument("model", "the `model` component's model, built from the suite's seed", positional=True),
            Argument("stages", "how many pipeline stages to split it into (2 x the stages a rank holds)"),
            Argument("cell", CELL.meaning, OPTIONAL),
        ),
        returns=(
            "an object with `stages` (a list of nn.Modules in order, made of the model's own modules: each takes the "
            "previous stage's output tensors, the first the batch's `inputs`), `inputs(batch)` (a tuple of tensors), "
            "`target(batch)` (a tensor) and `loss(output, target)` (one micro-batch's loss of the last stage's "
            "output, equal to the whole model's loss on it); optional: without an entry, "
            "`torchmatrix.models.pipeline_stages:split_decoder` (the reference decoder)"
        ),
        suites=(PARALLEL_EQUIVALENCE,),
        default="torchmatrix.models.pipeline_stages:split_decoder",
    ),
    Component(
        name="pipeline_schedule",
        arguments=(
            Argument("stages", "this rank's `torch.distributed.pipelining.PipelineStage`s, in order", positional=True),
            Argument("n_microbatches", "micro-batches per step ([suites.parallel_equivalence.options] micro_batches)"),
            Argument("loss_fn", "the split's `loss`"),
            Argument("cell", CELL.meaning + "; its `pipeline` names the schedule", OPTIONAL),
        ),
        returns=(
            "a pipeline schedule: `step(*inputs, target=..., losses=[...])` runs one step's forward and backward, "
            "and `scale_grads` says whether it divided the accumulated gradients by the micro-batch count (the "
            "step's loss is then the micro-batch losses' mean, else their sum); optional: without an entry, "
            "`torchmatrix.suites.references.pipelining:build_schedule` (gpipe, 1f1b or interleaved_1f1b, `scale_grads` at its "
            "default)"
        ),
        suites=(PARALLEL_EQUIVALENCE,),
        default="torchmatrix.suites.references.pipelining:build_schedule",
    ),
    Component(
        name="checkpointer",
        form="per-call",
        arguments=(),
        returns=(
            "an object with `save` and `load`, both collectives called on every rank (dtensor_optim, where "
            "[components] has one, checks the layout of what its `save` writes)"
        ),
        suites=(RESUME, CROSS_VERSION),
        members=(
            Member(
                "save",
                (
                    Argument("directory", "checkpoint directory, the same on every rank", positional=True),
                    Argument("model", "the wrapped model"),
                    Argument("optimizer", "the optimizer"),
                    Argument("scheduler", "the `scheduler` component's scheduler"),
                    Argument("loader", "the dataset's loader (state_dict / load_state_dict)"),
                    Argument("step", "the step being saved"),
                ),
                SAVE_RETURNS,
            ),
            Member(
                "load",
                (
                    Argument("directory", "checkpoint directory, the same on every rank", positional=True),
                    Argument("model", "a freshly built wrapped model"),
                    Argument("optimizer", "a fresh optimizer, no step taken yet"),
                    Argument("scheduler", "a fresh scheduler"),
                    Argument("loader", "a fresh loader"),
                ),
                LOAD_RETURNS,
            ),
        ),
    ),
    Component(
        name="checkpointer",
        form="bound",
        arguments=(
            Argument("directory", "checkpoint directory, the same on every rank", positional=True),
            Argument("model", "the wrapped model (freshly built for a load)"),
            Argument("optimizer", "the optimizer"),
            Argument("scheduler", "the `scheduler` component's scheduler"),
            Argument("loader", "the dataset's loader (state_dict / load_state_dict)"),
            Argument("process_group", "the group to save and load over (a reshard's: a smaller world)", OPTIONAL),
            Argument("mesh", "the cell's DeviceMesh, or a reshard world's 1-D one, over `process_group`", OPTIONAL),
        ),
        returns=(
            "a checkpoint manager built once per training run (told apart from the per-call form by its signature "
            "naming `model`); with `process_group` or `mesh` dtensor_optim's reshard goes through it over "
            "sub-worlds of the cell's ranks, without them in a world of its own per side, whose default group is "
            'that side\'s ranks (`reshard_source = "checkpointer"`)'
        ),
        suites=(RESUME, CROSS_VERSION),
        members=(
            Member("save", (Argument("step", "the step being saved", positional=True),), SAVE_RETURNS),
            Member("load", (), LOAD_RETURNS),
        ),
    ),
    Component(
        name="checkpointer_async",
        form="either form",
        arguments=(),
        returns=(
            "a `checkpointer` (per-call or bound, called as above) whose `save` returns a future; resume saves with it "
            "in the cells option `async_save` names, steps the optimizer before the future resolves (after "
            "`staging_completion`, where it has one) and calls its `close()`, where it has one, after the run's last save"
        ),
        suites=(RESUME,),
        default="torchmatrix.models.async_checkpoint:AsyncCheckpointer",
    ),
    Component(
        name="scheduler",
        arguments=(
            Argument("optimizer", "the optimizer", positional=True),
            Argument("warmup_steps", "option `warmup_steps`", OPTIONAL),
            Argument("total_steps", "the training steps of a straight run (option `steps`)", OPTIONAL),
            Argument("cell", CELL.meaning, OPTIONAL),
        ),
        returns=(
            "an LR scheduler: `step()`, `state_dict()`, `load_state_dict()`, and `get_last_lr()` where it has it; "
            "optional: without an entry, a linear warm-up over `warmup_steps` (torch's LambdaLR)"
        ),
        suites=(RESUME, CROSS_VERSION, DTENSOR_OPTIM),
        default="torchmatrix.suites.components.scheduler_component:warmup_scheduler",
    ),
    Component(
        name="training_step",
        arguments=(
            Argument("model", "the wrapped model, as `parallelize` returned it"),
            Argument("optimizer", "the optimizer, as its factory returned it (None in grad_ckpt, which takes no step)"),
            Argument("cell", CELL.meaning, OPTIONAL),
        ),
        returns=(
            "the stack's own training step, built once per training run (one component rather than three, as its "
            "members share what the stack builds once: the Fabric that set up the model, a loss scaler whose scale "
            "carries from backward to the step), with any of the three methods below: each one it leaves out is the "
            "suites' own. Per step the suites call `loss`, then `backward`, then `optimizer_step`, then the scheduler's "
            "`step` and the optimizer's `zero_grad` themselves; grad_ckpt calls `loss` per micro-batch and `backward` "
            "once, and no `optimizer_step`; parallel_equivalence builds one for the cell's model and one for its "
            "single-process reference, in a world of one rank of its own (docs: which world). dtensor_optim calls its `loss` on the stack's model "
            "only, not on its probe model. Optional: without an entry, `torchmatrix.suites.components.training_step:PlainStep`"
        ),
        suites=(GRAD_CKPT, RESUME, CROSS_VERSION, DTENSOR_OPTIM, PARALLEL_EQUIVALENCE, PEAK_MEMORY),
        members=(
            Member(
                "loss",
                (
                    Argument(
                        "batch",
                        "the batch as the loader (resume) or the `batch` component (the other suites) made it, "
                        "on this rank's device",
                        positional=True,
                    ),
                ),
                "the loss tensor to back-propagate: the model called with the batch and the stack's loss function "
                "applied to its output (default: the model called as `model(**batch)`, `model(*batch)` or "
                "`model(batch)`, the loss read from its output as the `model` row says)",
                optional=True,
            ),
            Member(
                "backward",
                (Argument("loss", "what `loss` returned", positional=True),),
                "nothing; gradients in the parameters' `.grad`, as the stack's backward leaves them "
                "(`fabric.backward(loss)`, a scaler's `scale(loss).backward()`; default: `loss.backward()`)",
                optional=True,
            ),
            Member(
                "optimizer_step",
                (),
                "nothing; the parameters updated as the stack steps its optimizer (a scaler's `step(optimizer)` and "
                "`update()`; default: `optimizer.step()`)",
                optional=True,
            ),
        ),
        default="torchmatrix.suites.components.training_step:PlainStep",
    ),
    Component(
        name="dataset",
        arguments=(
            Argument("path", "the file `write` created", positional=True),
            Argument("seq_len", "tokens per sequence the suite trains on (option `seq_len`)", OPTIONAL),
            Argument("vocab_size", "token ids are below this (option `vocab_size`; no tokenizer)", OPTIONAL),
            Argument("cell", CELL.meaning, OPTIONAL),
        ),
        returns="a dataset with `loader(...)`",
        suites=(RESUME, CROSS_VERSION),
        members=(
            Member(
                "write",
                (
                    Argument("path", "file to create (the suite's main process calls this once)", positional=True),
                    Argument("vocab_size", "token ids are below this; the model must accept them"),
                    Argument("num_sequences", "how many sequences"),
                    Argument("seq_len", "tokens per sequence"),
                    Argument("seed", "seed of the data"),
                ),
                "anything (ignored)",
                on_instance=False,
            ),
            Member(
                "loader",
                (
                    Argument("batch_size", "sequences per rank and step"),
                    Argument("rank", "this rank"),
                    Argument("world_size", "ranks of the cell"),
                ),
                "the loader the stack builds (a DataLoader, torchdata's StatefulDataLoader, any iterable; an iterator "
                "is read as its own): read through `iter()` once per epoch and anew after a checkpointer's load; its "
                "`state_dict()`/`load_state_dict()` hold its position (the suites keep none). Batches: token-id "
                "tensors (batch_size, seq_len), passed as `model(tokens)` or, with option `batch_keywords`, as each "
                "keyword (`model(input_ids=tokens, labels=tokens)`); a mapping as `model(**batch)`, a tuple as "
                "`model(*batch)`",
            ),
        ),
    ),
)

PER_OPTIMIZER = re.compile(r"^(optimizer|plain_state)_([a-z0-9_.+]+)$", re.IGNORECASE)


def component_for(name: str) -> Component | None:
    """The protocol entry for a `[components]` key (`optimizer_adamw` -> `optimizer_<value>`), or None."""
    if match := PER_OPTIMIZER.match(name):
        name = f"{match[1]}_<value>"
    return next((component for component in COMPONENTS if component.name == name), None)


def required_names(suite_names: list[str], optimizer_values: list[str]) -> dict[str, list[str]]:
    """Component key -> the registered suites that need it (`optimizer_<value>` expanded per axis value)."""
    needed: dict[str, list[str]] = {}
    for component in COMPONENTS:
        users = [suite for suite in component.suites if suite in suite_names]
        if not users or component.default:
            continue
        keys = (
            [f"optimizer_{value}" for value in optimizer_values]
            if component.name == "optimizer_<value>"
            else [component.name]
        )
        for key in keys:
            needed[key] = users
    return needed


def markdown_table() -> str:
    """The protocol as docs/reference/components.md shows it: one row per component and per method."""
    rows = ["| component | called as | receives | returns | used by |", "|---|---|---|---|---|"]
    for component in COMPONENTS:
        name = f"{component.name} ({component.form})" if component.form else component.name
        rows.append(_row(name, component.call_text(), component.arguments, component.returns, component.suites))
        for member in component.members:
            rows.append(_row("", member.call_text(component.owner_text(member)), member.arguments, member.returns, ()))
    return "\n".join(rows)


def _row(name: str, call: str, arguments: tuple[Argument, ...], returns: str, suites: tuple[str, ...]) -> str:
    receives = "; ".join(f"`{a.name}`{OPTIONAL_NOTE * (a.passed == OPTIONAL)}: {a.meaning}" for a in arguments)
    cells = [f"`{name}`" if name else "", f"`{call}`", receives or "nothing", returns, ", ".join(suites)]
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"
