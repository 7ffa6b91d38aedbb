"""The cross_version reproducer's note on which torch failed: printed when the script ran with other
torch releases or builds than the failure's, never when it ran with the very ones (whose
torch.__version__ carries a local label such as `+cu132` that matrix.toml's pin does not)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from torchmatrix.repro.cross_version import script_text

NOTE = "note: the failure was torch"


def _side(path: Path, version: str, code: int, last: str) -> str:
    """A stand-in interpreter for one side: prints the torch version first, as the real side does."""
    path.write_text(f"#!/bin/sh\necho 'torch {version}'\necho '{last}'\nexit {code}\n")
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize(
    "failure, writer_ran, reader_ran, noted",
    [
        (("2.15.0", "2.13.0"), "2.15.0+cu132", "2.13.0+cu132", False),
        (("2.15.0", "2.13.0"), "2.15.0", "2.13.0", False),
        (("2.15.0", "2.13.0"), "2.14.1+cu132", "2.13.0+cu132", True),
        (("2.15.0+cu132", "2.13.0"), "2.15.0+cpu", "2.13.0+cpu", True),
        (("2.15.0", "2.13.0"), "2.15.0a0+git1234", "2.13.0", True),
    ],
)
def test_the_note_is_printed_only_when_other_torch_ran(tmp_path, failure, writer_ran, reader_ran, noted):
    writer, reader = failure
    script = tmp_path / "repro.py"
    script.write_text(script_text({"writer": writer, "reader": reader, "test": "t", "cell": "c", "root_cause": "r"}))
    writer_python = _side(tmp_path / "writer", writer_ran, 0, "wrote it")
    reader_python = _side(tmp_path / "reader", reader_ran, 1, "root cause: KeyError: 'step'")
    done = subprocess.run(
        [sys.executable, str(script), "--writer", writer_python, "--reader", reader_python],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert f"written by torch {writer_ran}, loaded by torch {reader_ran}: FAILED" in done.stdout
    assert (NOTE in done.stdout) == noted, done.stdout
