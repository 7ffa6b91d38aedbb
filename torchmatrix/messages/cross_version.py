"""Where the cross_version suite's checkpoints and reads live in a run directory, and who reads whose.

The writing suite, the read pass, merge and the reports all find them here, so one layout serves
every process and every machine the run directory travels to (torchmatrix/run/cross_version.py
says how the pieces run).
"""

from __future__ import annotations

import re
from pathlib import Path

from torchmatrix.matrix.config import Matrix

SUITE = "cross_version"
READS_FILE = "cross_version_reads.py"
CHECKPOINTS_DIR = "checkpoints"
READS_DIR = "reads"
EXPECTED_FILE = "expected.json"
READ_TEST = "test_loads_checkpoint_written_by"
_READ = re.compile(rf"^{READ_TEST}\[writer=([^\]]+)\]$")


def peers(matrix: Matrix, version: str) -> list[str]:
    """The versions whose writes `version` reads: every candidate for the baseline, the baseline for a candidate."""
    if version == matrix.baseline:
        return [v for v in matrix.versions if v != version]
    return [matrix.baseline] if version in matrix.versions else []


def writes_dir(run_dir: Path, writer: str, cell_id: str) -> Path:
    """Where torch `writer` puts one cell's checkpoint and expected values."""
    return run_dir / f"torch-{writer}" / CHECKPOINTS_DIR / cell_id


def reads_dir(run_dir: Path, reader: str) -> Path:
    """Where torch `reader`'s read pass writes its per-cell JUnit files, plan and logs."""
    return run_dir / f"torch-{reader}" / READS_DIR


def writer_of_read(suite: str, test: str) -> str | None:
    """The version whose checkpoint a cross_version read test loads (`...[writer=W]`), or None for any other test."""
    match = _READ.match(test) if suite == SUITE else None
    return match[1] if match else None
