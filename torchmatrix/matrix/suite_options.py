"""The options of each built-in suite as a typed dataclass: matrix.toml's `[suites.<name>.options]`
is checked against it at load, the suite receives an instance, the reference page lists its fields.

- A field's docstring (the string under it) is its reference text.
- A TOML array arrives as a tuple; a float field takes an integer too.
- `__post_init__` refuses values that type alone does not rule out, with an `OptionError`.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from torchmatrix.components.protocol import RESUME_BF16_PARAM_OPTIMIZERS
from torchmatrix.user_error import UserError

DTYPES = ("float32", "bfloat16")
REDUCE_DTYPES = ("float32", "bfloat16", "float16")
SEEDINGS = ("per_rank", "replicated")
TENSOR_PARALLEL_STYLES = ("colwise", "rowwise")


class OptionError(UserError, ValueError):
    """One option that cannot apply: its key, what is wrong, what to write instead."""

    def __init__(self, key: str, problem: str, fix: str):
        super().__init__(f"{key}: {problem}; {fix}")
        self.key, self.problem, self.fix = key, problem, fix


@dataclass(frozen=True)
class SuiteOptions:
    """The base of every built-in suite's options: reading a TOML table into them."""

    RUNNER_SET: typing.ClassVar[tuple[str, ...]] = ()  # fields the runner sets, never matrix.toml

    @classmethod
    def from_table(cls, table: Mapping[str, Any], *, user: bool = False) -> SuiteOptions:
        """The options a table sets, the others at their defaults; an unknown key or a value of the
        wrong type is an OptionError (`user` set: so is a field the runner sets)."""
        fields = {field.name: field for field in dataclasses.fields(cls)}
        hints = typing.get_type_hints(cls)
        values = {}
        for key, value in table.items():
            if key not in fields or (user and key in cls.RUNNER_SET):
                valid = [name for name in fields if name not in cls.RUNNER_SET]
                raise OptionError(
                    key,
                    "not an option of this suite",
                    f"use one of: {', '.join(valid)}" if valid else "this suite takes no options; remove the table",
                )
            values[key] = _typed(key, value, hints[key])
        return cls(**values)

    def to_table(self) -> dict[str, Any]:
        """The fields that differ from their defaults, as `from_table` reads them back: how the options
        cross to a pytest process in its group plan."""
        return {
            field.name: getattr(self, field.name)
            for field in dataclasses.fields(self)
            if getattr(self, field.name) != field.default
        }


@dataclass(frozen=True)
class CollectivesOptions(SuiteOptions):
    """`collectives` takes no options."""


@dataclass(frozen=True)
class GradCkptOptions(SuiteOptions):
    """`[suites.grad_ckpt.options]`."""

    dtype: str = "float32"
    """The parameters' dtype: "float32" is compared bit for bit, "bfloat16" within two bf16 ULPs."""
    compute_dtype: str | None = None
    """The dtype the model computes in when it differs from `dtype` (default: what the model declares)."""
    micro_batches: int = 2
    """Micro-batches that run forward before one backward, at least 2."""
    ignored_attributes: tuple[str, ...] = ()
    """Module attribute names the module-attribute check leaves out (a timer the layer keeps, say)."""

    def __post_init__(self):
        _one_of("dtype", self.dtype, DTYPES)
        if self.compute_dtype is not None:
            _one_of("compute_dtype", self.compute_dtype, DTYPES)
        _at_least("micro_batches", self.micro_batches, 2, "an integer of at least 2")


@dataclass(frozen=True)
class ResumeOptions(SuiteOptions):
    """`[suites.resume.options]`."""

    steps: int = 8
    """Training steps of the straight run."""
    resume_step: int = 4
    """The step the second run saves at, rebuilds and loads: 1 <= resume_step <= steps - 2."""
    warmup_steps: int = 6
    """The LR scheduler's warm-up, so that its position is part of what must resume."""
    lr: float = 1e-2
    """The optimizer's learning rate."""
    weight_decay: float = 0.1
    """The optimizer's weight decay."""
    dropout: float = 0.1
    """The model's dropout, so that the RNG is part of what must resume."""
    batch_size: int = 2
    """Sequences per rank and step."""
    vocab_size: int = 64
    """Tokens in the on-disk dataset's vocabulary."""
    seq_len: int = 16
    """Tokens per sequence of the dataset."""
    num_sequences: int = 64
    """Sequences in the dataset."""
    seed: int = 1234
    """The seed both runs build and train from."""
    rebuild_seed: int = 98765
    """The seed the run is rebuilt from before the load, so that a load that restores nothing fails."""
    bf16_param_optimizers: tuple[str, ...] = RESUME_BF16_PARAM_OPTIMIZERS
    """Optimizer values whose params are bf16 (the rest fp32)."""
    quantized_state_optimizers: tuple[str, ...] = ()
    """Optimizer values whose state must be stored quantized at the checkpoint."""
    loader_batches: int | None = None
    """Batches the loader must yield alike after the load (default: one epoch and one more)."""
    batch_keywords: tuple[str, ...] = ()
    """Keyword names a loader's tensor batch is passed to the model as, e.g. ["input_ids", "labels"]."""
    seeding: str = "per_rank"
    """How ranks seed dropout: "per_rank" (each its own) or "replicated" (all alike)."""
    async_save: tuple[str, ...] = ()
    """Cells (globs over cell ids) that save with `checkpointer_async` while the next step runs."""

    def __post_init__(self):
        _at_least("steps", self.steps, 3, "a number of steps, at least 3")
        if not 1 <= self.resume_step <= self.steps - 2:
            raise OptionError(
                "resume_step",
                f"{self.resume_step} with steps = {self.steps}",
                "need 1 <= resume_step <= steps - 2 (two resumed steps at least)",
            )
        if self.loader_batches is not None:
            _at_least("loader_batches", self.loader_batches, 1, "a number of batches, at least 1, or leave it out")
        _one_of("seeding", self.seeding, SEEDINGS)
        bad = [name for name in self.batch_keywords if not name.isidentifier()]
        if bad:
            raise OptionError(
                "batch_keywords", f"{bad[0]!r} is not a keyword name", 'list the model\'s keywords, e.g. ["input_ids"]'
            )


@dataclass(frozen=True)
class CrossVersionOptions(ResumeOptions):
    """`[suites.cross_version.options]`: the resume suite's, and what the runner adds."""

    RUNNER_SET: typing.ClassVar[tuple[str, ...]] = ("run_dir", "torch", "peers")

    run_dir: str = ""
    """Set by the runner: the run directory the writes go under."""
    torch: str = ""
    """Set by the runner: this version's pin."""
    peers: tuple[str, ...] = ()
    """Set by the runner: the versions that read these writes."""
    checkpoint_classes_from: tuple[str, ...] = ()
    """Top-level packages whose classes a checkpoint read from another version may carry in its pickles
    (e.g. `torchao` for its optimizer state), besides those of `[components]` (suites/checkpoints/checkpoint_pickles.py)."""

    def __post_init__(self):
        super().__post_init__()
        if self.async_save:
            raise OptionError(
                "async_save", "cross_version saves synchronously", "set async_save under [suites.resume.options]"
            )


@dataclass(frozen=True)
class CheckpointArchiveOptions(SuiteOptions):
    """`[suites.checkpoint_archive.options]`."""

    archive: str = ""
    """The archive directory `torchmatrix archive write --to` wrote, relative to matrix.toml's directory
    (default: the archive of this torchmatrix's checkout, `archive/checkpoints`)."""
    writers: tuple[str, ...] = ()
    """The releases whose checkpoints are read (default: every release in the archive)."""


@dataclass(frozen=True)
class DtensorOptimOptions(SuiteOptions):
    """`[suites.dtensor_optim.options]`."""

    bf16_param_optimizers: tuple[str, ...] = ("precision_aware", "te_fused_adam")
    """Optimizer values whose params are bf16, as a mixed-precision stack gives its precision-aware optimizer."""
    tensor_parallel_plan: dict | None = None
    """{colwise = [...], rowwise = [...]}: the module names `parallelize` shards on a mesh with a tp dim (default: the reference decoder's)."""

    def __post_init__(self):
        plan = self.tensor_parallel_plan or {}
        for style, modules in plan.items():
            _one_of("tensor_parallel_plan", style, TENSOR_PARALLEL_STYLES)
            if not isinstance(modules, list) or not all(isinstance(name, str) for name in modules):
                raise OptionError(f"tensor_parallel_plan.{style}", f"{modules!r}", "list module names as strings")


@dataclass(frozen=True)
class ParallelEquivalenceOptions(SuiteOptions):
    """`[suites.parallel_equivalence.options]`."""

    steps: int = 4
    """Training steps compared, at least 1."""
    lr: float = 1e-2
    """The optimizer's learning rate."""
    weight_decay: float = 0.1
    """The optimizer's weight decay."""
    seed: int = 0
    """The seed the model is built from."""
    batch_seed: int = 1000
    """The first seed of the global batches."""
    clip_fraction: float = 0.9
    """max_norm as this fraction of the first step's gradient norm (so that step clips), between 0 and 1."""
    reduce_dtype: str = "float32"
    """The dtype your mixed-precision policy declares for gradient reductions."""
    micro_batches: int = 2
    """Micro-batches per step in a cell whose `accumulation` is not none (all but the last with gradient sync off),
    and per schedule step in one whose `pipeline` is not none (each a slice of the shard's batch)."""

    def __post_init__(self):
        _at_least("steps", self.steps, 1, "a number of training steps, at least 1")
        _at_least("micro_batches", self.micro_batches, 2, "an integer of at least 2")
        if not 0 < self.clip_fraction < 1:
            raise OptionError("clip_fraction", f"{self.clip_fraction!r}", "write a number between 0 and 1")
        _one_of("reduce_dtype", self.reduce_dtype, REDUCE_DTYPES)


@dataclass(frozen=True)
class PeakMemoryOptions(SuiteOptions):
    """`[suites.peak_memory.options]`."""

    warmup_steps: int = 1
    """Steps before the measured one, at least 1: the optimizer's state exists by then, as in a long run."""
    activation_checkpointing: bool = True
    """Whether `parallelize` is asked to checkpoint activations, as the stack trains."""
    lr: float = 1e-2
    """The optimizer's learning rate."""
    weight_decay: float = 0.1
    """The optimizer's weight decay."""
    seed: int = 0
    """The seed the model is built from."""
    batch_seed: int = 1000
    """The first seed of the batches."""

    def __post_init__(self):
        _at_least("warmup_steps", self.warmup_steps, 1, "a number of steps, at least 1")


def field_docs(cls: type) -> dict[str, str]:
    """Each field's docstring (the string under it), by name, through the class and its bases."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not (dataclasses.is_dataclass(klass) and klass.__module__ == __name__):
            continue
        body = ast.parse(inspect.getsource(klass)).body[0].body
        for statement, following in zip(body, body[1:]):
            if (
                isinstance(statement, ast.AnnAssign)
                and isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
            ):
                docs[statement.target.id] = " ".join(following.value.value.split())
    return docs


def toml_value(value: Any) -> str:
    """A default as matrix.toml would write it."""
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, tuple):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    return repr(value)


SCALARS = {bool: "true or false", int: "an integer", float: "a number", str: "a string", dict: "a table"}
"""The field types an options table fills, as the error names them; also `X | None` and `tuple[X, ...]` of each."""


def _typed(key: str, value: Any, hint: Any) -> Any:
    """`value` as the field's type (a list as a tuple, an int as a float), or an OptionError."""
    hint = _without_none(hint)
    if _fits(value, hint):
        return _converted(value, hint)
    expected = _described(hint)
    raise OptionError(key, f"{value!r} is not {expected}", f"write {expected}")


def _without_none(hint: Any) -> Any:
    """`X` of `X | None` (a None default is never read from TOML, which has no null)."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        (hint,) = [arg for arg in args if arg is not type(None)]
    return hint


def _item_type(hint: Any) -> Any | None:
    """X of `tuple[X, ...]`, else None."""
    args = typing.get_args(hint)
    return args[0] if typing.get_origin(hint) is tuple and len(args) == 2 and args[1] is Ellipsis else None


def _fits(value: Any, hint: Any) -> bool:
    """Whether a TOML value can fill a field of type `hint` (a bool is no number, an int is a float)."""
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint in (str, dict):
        return isinstance(value, hint)
    item = _item_type(hint)
    return item is not None and isinstance(value, list) and all(_fits(entry, item) for entry in value)


def _converted(value: Any, hint: Any) -> Any:
    if hint is float:
        return float(value)
    item = _item_type(hint)
    return tuple(_converted(entry, item) for entry in value) if item is not None else value


def _described(hint: Any) -> str:
    """What a field of type `hint` takes, in words ("a list of integers")."""
    if hint in SCALARS:
        return SCALARS[hint]
    item = _item_type(hint)
    if item in SCALARS and item is not dict:
        plural = {bool: "booleans", int: "integers", float: "numbers", str: "strings"}[item]
        return f"a list of {plural}"
    return f"a value of type {getattr(hint, '__name__', hint)} (options take bool, int, float, str, a table, or tuple[X, ...] of one)"


def _one_of(key: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise OptionError(key, f"{value!r}", f"write one of {', '.join(repr(a) for a in allowed)}")


def _at_least(key: str, value: int, lowest: int, what: str) -> None:
    if value < lowest:
        raise OptionError(key, f"{value!r}", f"write {what}")
