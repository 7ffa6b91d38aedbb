"""What a DCP checkpoint physically holds for each tensor, read from its metadata alone: the
chunks, which rank wrote each one, and how many bytes they hold against one full copy.

A sharded save stores every element of a tensor exactly once, one chunk per rank; a tensor
that each rank saved as a plain local tensor shows up as a single chunk of the wrong size."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

WRITER_FILE = re.compile(r"^__(\d+)_\d+\.distcp$")


@dataclass(frozen=True)
class Chunk:
    """One stored block of a tensor: where it starts, its extent, and the rank (within the
    saving process group) whose file holds it, or None when the file name does not say."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    writer: int | None

    @property
    def numel(self) -> int:
        return math.prod(self.sizes)

    def overlaps(self, other: Chunk) -> bool:
        return all(
            a < b_end and b < a_end
            for a, a_end, b, b_end in zip(
                self.offsets,
                (o + s for o, s in zip(self.offsets, self.sizes)),
                other.offsets,
                (o + s for o, s in zip(other.offsets, other.sizes)),
            )
        )


@dataclass(frozen=True)
class TensorLayout:
    """How one checkpoint entry (e.g. "optim.state.w.exp_avg") is stored."""

    key: str
    size: tuple[int, ...]
    dtype: torch.dtype
    chunks: tuple[Chunk, ...]

    @property
    def stored_chunks(self) -> tuple[Chunk, ...]:
        """Chunks that hold at least one element (an empty shard writes nothing useful)."""
        return tuple(chunk for chunk in self.chunks if chunk.numel)

    @property
    def full_copy_bytes(self) -> int:
        return math.prod(self.size) * self.dtype.itemsize

    @property
    def stored_bytes(self) -> int:
        return sum(chunk.numel for chunk in self.chunks) * self.dtype.itemsize

    @property
    def writers(self) -> tuple[int | None, ...]:
        return tuple(chunk.writer for chunk in self.stored_chunks)

    def covers_exactly_once(self) -> bool:
        """True when the chunks lie inside the tensor, do not overlap and add up to it."""
        chunks = self.stored_chunks
        inside = all(
            o >= 0 and o + s <= dim for chunk in chunks for o, s, dim in zip(chunk.offsets, chunk.sizes, self.size)
        )
        disjoint = not any(a.overlaps(b) for i, a in enumerate(chunks) for b in chunks[i + 1 :])
        return inside and disjoint and sum(c.numel for c in chunks) == math.prod(self.size)

    def describe(self) -> str:
        """One line with the figures a reader needs to judge the layout."""
        pieces = ", ".join(f"rank {c.writer}: {list(c.sizes)} at {list(c.offsets)}" for c in self.stored_chunks)
        return (
            f"{self.key}: {list(self.size)} {self.dtype}, {len(self.stored_chunks)} chunk(s) "
            f"[{pieces}], {self.stored_bytes} B stored vs {self.full_copy_bytes} B for one full copy"
        )


def read_layouts(checkpoint_dir: str | Path) -> dict[str, TensorLayout]:
    """The layout of every tensor entry in the DCP checkpoint at `checkpoint_dir`."""
    metadata = dcp.FileSystemReader(str(checkpoint_dir)).read_metadata()
    writer_of = {}
    for index, info in metadata.storage_data.items():
        match = WRITER_FILE.match(Path(info.relative_path).name)
        writer_of[(index.fqn, tuple(index.offset or ()))] = int(match.group(1)) if match else None
    return {
        key: TensorLayout(
            key=key,
            size=tuple(entry.size),
            dtype=entry.properties.dtype,
            chunks=tuple(
                Chunk(
                    offsets=tuple(chunk.offsets),
                    sizes=tuple(chunk.sizes),
                    writer=writer_of.get((key, tuple(chunk.offsets))),
                )
                for chunk in entry.chunks
            ),
        )
        for key, entry in metadata.state_dict_metadata.items()
        if isinstance(entry, TensorStorageMetadata)
    }


def find_checkpoint(directory: str | Path) -> Path | None:
    """The one folder at or under `directory` holding a DCP `.metadata` file (a checkpointer may
    write into a subfolder, such as torchtitan's step-N), or None when there is not exactly one."""
    found = sorted(Path(directory).rglob(".metadata"))
    return found[0].parent if len(found) == 1 else None


def layouts_by_suffix(layouts: dict[str, TensorLayout], suffixes: list[str]) -> dict[str, list[TensorLayout]]:
    """Per suffix (a param's state key, "embed.weight.exp_avg"), the entries whose key is it or
    ends with "." + it, under whatever prefix the checkpointer nests it ("optimizer.state."); a key
    goes to the longest suffix it ends with, so "weight.exp_avg" does not claim "head.weight.exp_avg"."""
    found: dict[str, list[TensorLayout]] = {suffix: [] for suffix in suffixes}
    for key, layout in layouts.items():
        owners = [suffix for suffix in suffixes if key == suffix or key.endswith("." + suffix)]
        if owners:
            found[max(owners, key=len)].append(layout)
    return found


@dataclass(frozen=True)
class ExpectedState:
    """One param-shaped optimizer state the checkpoint should hold sharded: its key by parameter name
    (`layers.0.attn.weight.exp_avg`), by position in the optimizer's param order (`state.3.exp_avg`,
    as `optimizer.state_dict()` keys it; None when the order is not known), its param's global shape
    and, for a DTensor param, the distinct blocks (offsets, sizes) its ranks hold: on a 2-D mesh a
    replicated dim makes fewer blocks than ranks, which DCP stores once each. None: dim 0 split over
    every rank, as torch.chunk splits it (FSDP1's flat parameters)."""

    name_key: str
    position_key: str | None
    shape: tuple[int, ...]
    param_chunks: frozenset[tuple[tuple[int, ...], tuple[int, ...]]] | None = None


@dataclass
class StorageFindings:
    """What the checkpoint shows of the expected states: per state found, what is wrong with its
    layout (`problems`); per state not found, why the lookup failed (`unfound`: a naming problem, not
    a layout fault); and two separate verdicts over all of them (`lines`): stored sharded or not,
    keyed by name or by position."""

    problems: list[str]
    unfound: list[str]
    lines: list[str]
    stored_bytes: int
    full_copy_bytes: int
    keyed_by: dict[str, tuple[str, str]]  # name key -> ("parameter name" or "position", the key found)


def storage_findings(
    layouts: dict[str, TensorLayout], expected: list[ExpectedState], world_size: int
) -> StorageFindings:
    """Find each expected state under its parameter name, else under its position, else under the
    longest tail of its name that one key alone ends with (a checkpointer that saves a module inside
    the one the suite holds drops the outer names), and judge whether it is stored once at its
    param's global shape, one chunk per rank that holds a piece of it."""
    by_name = layouts_by_suffix(layouts, [state.name_key for state in expected])
    by_position = layouts_by_suffix(layouts, [state.position_key for state in expected if state.position_key])
    findings = StorageFindings([], [], [], 0, 0, {})
    sharded, unsharded = [], []
    for state in sorted(expected, key=lambda state: state.name_key):
        found, keyed_by = by_name[state.name_key], "parameter name"
        if not found and state.position_key:
            found, keyed_by = by_position[state.position_key], "position"
        if not found:
            found = found_by_name_tail(layouts, state.name_key)
        if len(found) != 1:
            what = "no key" if not found else f"{len(found)} keys ({', '.join(sorted(f.key for f in found))})"
            where = f" or with {state.position_key}" if state.position_key else ""
            findings.unfound.append(f"{state.name_key}: {what} in the checkpoint ending with it{where}")
            continue
        layout = found[0]
        findings.keyed_by[state.name_key] = (keyed_by, layout.key)
        findings.stored_bytes += layout.stored_bytes
        findings.full_copy_bytes += layout.full_copy_bytes
        problem = sharding_problem(layout, state.shape, world_size, state.param_chunks)
        (unsharded if problem else sharded).append(layout.key)
        if problem:
            findings.problems.append(f"{layout.describe()}; {problem}")
    total = len(expected)
    if sharded:
        findings.lines.append(f"stored sharded: {len(sharded)} of {total} param-shaped states (e.g. {sharded[0]})")
    if unsharded:
        findings.lines.append(
            f"not stored sharded: {len(unsharded)} of {total} param-shaped states (e.g. {unsharded[0]})"
        )
    for keyed_by, meaning in KEYED_BY.items():
        keys = [layout_key for name, (how, layout_key) in findings.keyed_by.items() if how == keyed_by]
        if keys:
            findings.lines.append(
                f"keyed by {keyed_by}: {len(keys)} of {total} param-shaped states (e.g. {keys[0]}){meaning}"
            )
    return findings


def found_by_name_tail(layouts: dict[str, TensorLayout], name_key: str) -> list[TensorLayout]:
    """The one entry whose key ends with the longest tail of `name_key` (its leading dotted names
    dropped one by one, keeping at least the names of its module, its param and the state) that only one key ends with."""
    parts = name_key.split(".")
    for start in range(1, len(parts) - 2):
        tail = ".".join(parts[start:])
        found = [layout for key, layout in layouts.items() if key == tail or key.endswith("." + tail)]
        if len(found) == 1:
            return found
        if found:
            return []
    return []


KEYED_BY = {
    "parameter name": "",
    "position": (
        ", their place in the optimizer's param order as optimizer.state_dict() numbers it, not their parameter's name: "
        "a load into a model whose params are ordered or grouped otherwise puts each state into another param"
    ),
}


def sharding_problem(
    layout: TensorLayout, shape: tuple[int, ...], world_size: int, param_chunks: frozenset | None = None
) -> str | None:
    """Why `layout` is not its param's state stored sharded, or None when it is."""
    wanted_chunks = nonempty_shards(shape, world_size) if param_chunks is None else len(param_chunks)
    if layout.size != tuple(shape):
        return f"the param is {list(shape)}"
    if not layout.covers_exactly_once():
        return "chunks do not cover the tensor exactly once"
    if len(layout.stored_chunks) != wanted_chunks or len(set(layout.writers)) != wanted_chunks:
        if wanted_chunks == world_size or param_chunks is None:
            return f"expected {wanted_chunks} chunks, one per rank"
        return f"expected {wanted_chunks} chunks, one per block its param is split into (replicas store theirs once)"
    stored = {(chunk.offsets, chunk.sizes) for chunk in layout.stored_chunks}
    if param_chunks is not None and stored != param_chunks:
        blocks = ", ".join(f"{list(sizes)} at {list(offsets)}" for offsets, sizes in sorted(param_chunks))
        return f"chunks cut otherwise than its param, whose blocks are {blocks}"
    return None


def nonempty_shards(shape: tuple[int, ...], world_size: int) -> int:
    """How many ranks hold a non-empty piece when dim 0 is split the way torch.chunk does."""
    if not shape:
        return 1
    per_rank = math.ceil(shape[0] / world_size)
    return math.ceil(shape[0] / per_rank) if per_rank else 0
