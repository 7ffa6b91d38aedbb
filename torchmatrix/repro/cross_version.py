"""The reproducer of a cross_version read failure: a checkpoint torch W wrote that torch R could not
load. One torch-only script runs both sides, each in its own version's interpreter, which is what
an upstream report can ask a maintainer to run (torchmatrix.repro.checkpoint_script)."""

from __future__ import annotations

import importlib.util
import pprint
import shlex
from dataclasses import dataclass
from pathlib import Path

from torchmatrix.messages.cross_version import writer_of_read
from torchmatrix.reports.records import TestRecord, VersionInfo
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


@dataclass(frozen=True)
class Side:
    """One side of the read: the torch version, what the run recorded of it, and its environment's lines."""

    torch: str
    recorded: VersionInfo
    environment: list[str]

    @property
    def build(self) -> str:
        return self.recorded.environment.torch or self.torch

    def version_line(self, role: str) -> str:
        environment = self.recorded.environment
        return (
            f"- {role}: torch {self.build}, git {environment.git_version or 'unknown'}, "
            f"CUDA {environment.cuda_version or 'none'}, device {environment.description or 'unknown'}"
        )


def readme(record: TestRecord, writer: Side, reader: Side, run_command: str) -> str:
    """README.md laid out as an upstream bug report, saying what the script checks and what it does not,
    with the build, git version and environment of both sides."""
    return "\n".join(
        [
            f"# A checkpoint written by torch {writer.build} cannot be loaded by torch {reader.build}",
            "",
            "## What was expected",
            "",
            f"torch {reader.build} loads a torch.distributed.checkpoint written by torch {writer.build}, and every value equals what was saved.",
            "",
            "## What happened",
            "",
            f"In cell `{record.run_cell}` the load failed on torch {reader.build} ({reader.recorded.environment.description or 'device unknown'}), "
            "and failed again when re-read alone. Root cause:",
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
            "(the interpreters' paths are relative to the project that ran it: pass your own)",
            "",
            f"The script saves a small model and its AdamW state with torch {writer.torch}'s DCP and loads them with torch {reader.torch}'s,",
            "without a process group. It checks the checkpoint format alone: the run loaded through its own checkpointer",
            "component, so if this script loads exactly on both, the break is in what that checkpointer adds.",
            "",
            "## Versions",
            "",
            writer.version_line("writes"),
            reader.version_line("fails to read it"),
            "",
            "## Environment of the writing torch",
            "",
            "```",
            *writer.environment,
            "```",
            "",
            "## Environment of the reading torch",
            "",
            "```",
            *reader.environment,
            "```",
            "",
            "`python -m torch.utils.collect_env` of the reading torch in full: collect_env.txt.",
            "",
        ]
    )
