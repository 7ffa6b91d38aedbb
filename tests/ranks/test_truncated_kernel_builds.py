"""A rank killed while Inductor links a kernel leaves a 0-byte or truncated `.so` in the cell's shared
kernels folder (issue 61 item 6): the next test that needs that kernel builds it again instead of
loading it and failing "file too short". Two fresh processes compile the same function with the
cell's shared builds, the first's libraries truncated in between, as a killed rank leaves them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from torchmatrix.ranks.truncated_builds import is_whole_elf

from helpers.checkout import checkout_env

pytestmark = pytest.mark.slow

COMPILE = """
import sys
import torch
from torchmatrix.ranks.shared_builds import place, share_inductor_builds

share_inductor_builds("TORCHINDUCTOR_CACHE_DIR")
place(probe=sys.argv[1] + "/probe", kernels=sys.argv[1] + "/kernels")
compiled = torch.compile(lambda x: (x.sin() + 2 * x.cos()).sum(), backend="inductor")
x = torch.arange(8, dtype=torch.float32)
assert torch.allclose(compiled(x), (x.sin() + 2 * x.cos()).sum())
print("compiled")
"""


def compile_in_cell(cell: Path, rank: str) -> subprocess.CompletedProcess:
    env = {**checkout_env(), "TORCHINDUCTOR_CACHE_DIR": str(cell / rank)}
    return subprocess.run(
        [sys.executable, "-c", COMPILE, str(cell)], env=env, capture_output=True, text=True, timeout=600
    )


def test_a_truncated_shared_kernel_is_built_again_not_loaded(tmp_path):
    first = compile_in_cell(tmp_path, "rank0")
    assert first.returncode == 0, first.stderr[-3000:]
    libraries = sorted((tmp_path / "kernels").rglob("*.so"))
    assert libraries, "the kernel was not built in the shared folder"
    sizes = {}
    for number, library in enumerate(libraries):  # a rank killed while linking: empty, or cut short
        sizes[library] = library.stat().st_size
        library.write_bytes(b"" if number % 2 == 0 else library.read_bytes()[: sizes[library] // 3])
        assert not is_whole_elf(str(library))
    again = compile_in_cell(tmp_path, "rank0")  # its own graph cache hit: the kernel is only loaded
    assert again.returncode == 0, again.stderr[-3000:]
    assert "file too short" not in again.stderr
    assert all(is_whole_elf(str(library)) for library in libraries)
