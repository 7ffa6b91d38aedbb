"""The reproducer of a cross_version read failure: a checkpoint torch W wrote that torch R could not
load. One torch-only script runs both sides, each in its own version's interpreter, which is what
an upstream report can ask a maintainer to run (torchmatrix.repro.checkpoint_script)."""

from __future__ import annotations

import importlib.util
import pprint
import shlex
from pathlib import Path

from torchmatrix.messages.cross_version import writer_of_read
from torchmatrix.reports.records import TestRecord
from torchmatrix.repro.output_directory import MARK, SCRIPT_NAME

NEEDS = "two Pythons, each with torch (the writing version's and the reading version's); nothing else, no pytest, no torchmatrix"


def pair_of(record: TestRecord) -> tuple[str, str] | None:
    """(writer, reader) when `record` is a failed cross_version read, else None."""
    writer = writer_of_read(record.suite, record.test)
    return (writer, record.torch) if writer else None


def script_text(failure: dict) -> str:
    """repro.py: what it reproduces (FAILURE, data only), then the two-sided runtime."""
    runtime = Path(importlib.util.find_spec("torchmatrix.repro.checkpoint_script").origin).read_text()
    body = runtime[runtime.index('"""', 3) + 3 :]
    body = "\n".join(line for line in body.splitlines() if not line.startswith("FAILURE: dict = {}"))
    return "\n".join(
        [
            "#!/usr/bin/env python3",
            MARK,
            '"""A checkpoint one torch version wrote that another cannot load, standalone: FAILURE says which.',
            "",
            f"Run: python {SCRIPT_NAME} --writer PYTHON_OF_THE_WRITING_TORCH --reader PYTHON_OF_THE_READING_TORCH",
            f"Needs {NEEDS}.",
            "It writes a torch.distributed.checkpoint of a small model and its AdamW state with the writer and loads",
            "it with the reader; exit 1 and a `root cause:` line when the load fails or differs, 0 when it loads",
            "exactly, 2 when a side could not run (torch does not import, a crash): never counted as reproducing.",
            '"""',
            "",
            f"FAILURE = {pprint.pformat(failure, width=100, sort_dicts=False)}",
            body.rstrip("\n"),
            "",
            "",
            'if __name__ == "__main__":',
            "    main()",
            "",
        ]
    )


def command(writer_python: str, reader_python: str) -> str:
    return shlex.join(["python", SCRIPT_NAME, "--writer", writer_python, "--reader", reader_python])


def readme(record: TestRecord, writer: str, info, cell_id: str, run_command: str, collect_env: str) -> str:
    """README.md laid out as an upstream bug report, saying what the script checks and what it does not."""
    reader = info.build or record.torch
    return "\n".join(
        [
            f"# A checkpoint written by torch {writer} cannot be loaded by torch {reader}",
            "",
            "## What was expected",
            "",
            f"torch {reader} loads a torch.distributed.checkpoint written by torch {writer}, and every value equals what was saved.",
            "",
            "## What happened",
            "",
            f"In cell `{cell_id}` the load failed on torch {reader} ({info.device}), and failed again when re-read alone. Root cause:",
            "",
            "```",
            record.message,
            "```",
            "",
            "## Reproduce",
            "",
            f"Needs {NEEDS}:",
            "",
            "```shell",
            run_command,
            "```",
            "",
            f"The script saves a small model and its AdamW state with torch {writer}'s DCP and loads them with torch {reader}'s,",
            "without a process group. It checks the checkpoint format alone: the run loaded through its own checkpointer",
            "component, so if this script loads exactly on both, the break is in what that checkpointer adds.",
            "",
            "## Versions",
            "",
            f"- writes: torch {writer}",
            f"- fails to read it: torch {reader}, git {info.git_version or 'unknown'}, CUDA {info.cuda_version or 'none'}",
            "",
            "## Environment of the reading torch",
            "",
            "```",
            collect_env.strip(),
            "```",
            "",
        ]
    )
