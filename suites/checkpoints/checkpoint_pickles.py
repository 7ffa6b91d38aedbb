"""Whether a checkpoint from another torch version's run loads without running code it carries.

- DCP `pickle.load`s `.metadata` and `torch.load`s each byte item with `weights_only=False`, so a
  run directory from elsewhere (a CI artifact handed to `cross-read`) could run anything on load.
- Every global a pickle in the checkpoint would import must be data: DCP's metadata classes, torch's
  sizes, dtypes and layouts, paths, numpy arrays (the RNG state), what torch's weights-only loader
  allows, or a class of the stack's own packages (its code runs in the ranks anyway).
- Modules outside those are never imported to decide: a name is judged before anything runs.
"""

from __future__ import annotations

import collections
import importlib
import io
import pickle
import pickletools
import zipfile
from pathlib import Path

import torch
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex

METADATA_FILE = ".metadata"
DCP_DATA_SUFFIX = ".distcp"
"""DCP's data files: raw tensor bytes and byte items back to back, read through `.metadata`'s offsets."""
STRING_OPCODES = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING", "BINSTRING", "STRING"}
"""Opcodes that push a string, which STACK_GLOBAL may take as its module and name."""
TRANSPARENT_OPCODES = {"MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT", "FRAME"}
"""Opcodes that leave the stack as it is (a memo store, a frame header)."""
NUMPY_ARRAY_GLOBALS = {
    "numpy.ndarray",
    "numpy.dtype",
    "numpy.core.multiarray._reconstruct",
    "numpy._core.multiarray._reconstruct",
}
"""What a pickled numpy array (numpy's RNG state) imports; torch's weights-only loader refuses them by default."""
DATA_FUNCTIONS = {"torch.serialization._get_layout"}
"""Functions DCP's metadata calls on load that only look a value up."""


def pickled_globals(data: bytes) -> list[str]:
    """The `module.name` of every global the pickle `data` imports, up to where the bytes stop being a
    pickle (the unpickler stops there too).

    STACK_GLOBAL's operands are known only where the two opcodes right before it (memo stores and
    frames aside) pushed strings; anything else reads `<computed>`, so no stack trick passes as data."""
    found, memo, pushed = [], {}, []
    try:
        for opcode, argument, _ in pickletools.genops(data):
            name = opcode.name
            if name in TRANSPARENT_OPCODES:
                if name != "FRAME":
                    memo[len(memo) if name == "MEMOIZE" else argument] = pushed[-1] if pushed else None
                continue
            if name in ("GLOBAL", "INST"):
                found.append(argument.replace(" ", "."))
            elif name == "STACK_GLOBAL":
                operands = pushed[-2:]
                known = len(operands) == 2 and all(isinstance(operand, str) for operand in operands)
                found.append(".".join(operands) if known else "<computed>")
            elif name.startswith("EXT"):
                found.append("<extension registry>")
            if name in STRING_OPCODES:
                pushed.append(argument)
            elif name in ("GET", "BINGET", "LONG_BINGET"):
                pushed.append(memo.get(argument))
            else:
                pushed = []
    except ValueError:
        pass
    return found


def is_data_global(qualified: str, own_packages: frozenset[str]) -> bool:
    """Whether importing `qualified` and calling it with pickled arguments can only build data."""
    if qualified in NUMPY_ARRAY_GLOBALS or qualified in DATA_FUNCTIONS:
        return True
    module, _, attribute = qualified.rpartition(".")
    top = module.partition(".")[0]
    if top not in {"torch", "pathlib", "collections", *own_packages}:
        return False
    try:
        value = getattr(importlib.import_module(module), attribute)
    except (ImportError, AttributeError):
        return False
    if top == "torch":
        return (
            value is torch.Size
            or isinstance(value, torch.dtype)
            or (module.startswith("torch.distributed.checkpoint") and isinstance(value, type))
        )
    if top == "collections":
        return value is collections.OrderedDict
    return isinstance(value, type)


def torch_saved_globals(data: bytes) -> list[str]:
    """The globals of a torch.save archive that torch's weights-only loader would refuse; none where it
    is no readable archive (torch.load fails on it before unpickling anything)."""
    try:
        return list(torch.serialization.get_unsafe_globals_in_checkpoint(io.BytesIO(data)))
    except Exception:  # noqa: BLE001 - the suite's load reports it with its root cause
        return []


def byte_items(metadata_path: Path):
    """(where, bytes) of each byte item of the DCP checkpoint whose `.metadata` is at `metadata_path`;
    none where this torch cannot read the metadata (DCP's own load then fails on it before any item)."""
    try:
        with metadata_path.open("rb") as file:
            metadata = pickle.load(file)
    except Exception:  # noqa: BLE001 - the suite's load reports it with its root cause
        return
    for fqn, item in metadata.state_dict_metadata.items():
        if isinstance(item, BytesStorageMetadata):
            storage = metadata.storage_data[MetadataIndex(fqn)]
            if getattr(storage, "transform_descriptors", None):
                yield f"{storage.relative_path} ({fqn})", None
                continue
            with (metadata_path.parent / storage.relative_path).open("rb") as file:
                file.seek(storage.offset)
                yield f"{storage.relative_path} ({fqn})", file.read(storage.length)


def unsafe_globals(directory: Path, own_packages: frozenset[str] = frozenset()) -> dict[str, list[str]]:
    """Per file (relative to `directory`; a byte item with its key), the globals that are not data."""
    unsafe: dict[str, list[str]] = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file() and p.suffix != DCP_DATA_SUFFIX):
        where, data = str(path.relative_to(directory)), path.read_bytes()
        if zipfile.is_zipfile(path):
            found = torch_saved_globals(data)
        elif path.name == METADATA_FILE or data[:1] == pickle.PROTO:
            found = pickled_globals(data)
        else:
            continue
        if refused := sorted({name for name in found if not is_data_global(name, own_packages)}):
            unsafe[where] = refused
        elif path.name == METADATA_FILE:
            for item, item_data in byte_items(path):
                names = (
                    ["<transformed (compressed) byte item>"] if item_data is None else torch_saved_globals(item_data)
                )
                if refused := sorted({name for name in names if not is_data_global(name, own_packages)}):
                    unsafe[str(path.parent.relative_to(directory) / item)] = refused
    return unsafe
