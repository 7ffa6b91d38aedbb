"""`torchmatrix slurm`: sbatch scripts that run the matrix as Slurm array jobs, then merge.

Slurm does the scheduling: one array task per (torch version, shard) of the cells that fit on a
node, one job per (torch version, world size) for cells wider than a node (torchrun multi-node
rendezvous under srun), and a merge job that runs `afterany` of them all, so failed tasks
still end up in the report as errored cells.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from torchmatrix import file_writes
from torchmatrix.matrix.config import Matrix
from torchmatrix.matrix.selection import CellSelection, SelectionError

# --restart: a requeued task reruns with its run id, and starts clean instead of being refused.
NOX_RUN = "nox -R -s \"gpu_matrix(torch='$VERSION')\" -- --restart "
SHARD_ARG = '--shard "$SHARD"'
PARTITION = re.compile(r"^[A-Za-z0-9_.-]+(,[A-Za-z0-9_.-]+)*$")
TIME_LIMIT = re.compile(r"^([0-9]+(-[0-9]+)?(:[0-9]+){0,2}|UNLIMITED|INFINITE|infinite|unlimited)$")
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
MULTINODE_LAUNCHER = (
    "srun --nodes={{nnodes}} --ntasks-per-node=1 torchrun --nnodes={{nnodes}} --nproc-per-node={{nproc_per_node}}"
    " --rdzv-backend=c10d --rdzv-endpoint=$head:{port} --rdzv-id=$SLURM_JOB_ID"
)


@dataclass(frozen=True)
class SlurmOptions:
    """What the cluster looks like and how to split the work."""

    shards: int
    gpus_per_node: int
    partition: str | None = None
    time: str = "04:00:00"
    rdzv_port: int = 29500

    def check(self) -> None:
        """Values land in `#SBATCH` lines, which no shell quoting protects: only plain spellings pass."""
        if self.shards < 1 or self.gpus_per_node < 1:
            raise SelectionError("slurm: --shards and --gpus-per-node must be positive")
        if self.partition is not None and not PARTITION.match(self.partition):
            raise SelectionError(
                f"slurm: --partition {self.partition!r} is not a partition name; use letters, digits, '_', '.', '-' (comma-separated for several)"
            )
        if not TIME_LIMIT.match(self.time):
            raise SelectionError(
                f"slurm: --time {self.time!r} is not a Slurm time limit; write e.g. 04:00:00, 90 or 1-12:00:00"
            )
        if not 1 <= self.rdzv_port <= 65535:
            raise SelectionError(f"slurm: --rdzv-port {self.rdzv_port} is not a TCP port (1-65535)")


def directive_value(text: str) -> str:
    """A value as one #SBATCH directive reads it back: as is when plain, else in double quotes with
    backslashes before the characters sbatch's own parser gives meaning (a space would end the
    value, `#` would start a comment)."""
    if "\n" in text or "\r" in text:
        raise SelectionError(
            f"{text!r} holds a line break, which no #SBATCH line can carry; move the project to a plain path"
        )
    if re.fullmatch(r"[\w./+:,=@%-]+", text):
        return text
    return '"' + re.sub(r'([\\"#])', r"\\\1", text) + '"'


def _header(job_name: str, options: SlurmOptions, root: Path, *, nodes: int = 1, array: str | None = None) -> list[str]:
    lines = [
        "#!/usr/bin/env bash",
        f"#SBATCH --job-name={job_name}",
        f"#SBATCH --chdir={directive_value(str(root))}",
        f"#SBATCH --nodes={nodes}",
        f"#SBATCH --time={options.time}",
        "#SBATCH --output=reports/slurm-logs/%x-%A_%a.out",
    ]
    if options.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={options.gpus_per_node}")
    if options.partition:
        lines.append(f"#SBATCH --partition={options.partition}")
    if array:
        lines.append(f"#SBATCH --array={array}")
    return lines + ["set -euo pipefail", ""]


def _posargs(*parts: str) -> str:
    return " ".join(part for part in parts if part)


def _versions_array(versions: list[str]) -> str:
    return "VERSIONS=(" + " ".join(shlex.quote(v) for v in versions) + ")"


def write_slurm(matrix: Matrix, options: SlurmOptions, out: Path, selection: CellSelection) -> list[Path]:
    """Write the scripts into `out` and return them; `out/submit.sh` submits the whole chain."""
    options.check()
    if CONTROL.search(str(matrix.root)):
        raise SelectionError(
            f"slurm: the project path {str(matrix.root)!r} holds a control character (a newline?), which would break the #SBATCH lines; move the project"
        )
    versions = [v for v in matrix.versions if v != "system"]
    if not versions:
        raise SelectionError("slurm: matrix.toml lists no installable torch version (only 'system')")
    cells = matrix.select(selection)
    node_sizes = sorted({c.world_size for c in cells if c.world_size <= options.gpus_per_node})
    wide_sizes = sorted({c.world_size for c in cells if c.world_size > options.gpus_per_node})
    root = matrix.root
    filters = shlex.join(selection.arguments())
    run_id = '"$TORCHMATRIX_SUBMISSION/$SLURM_JOB_NAME-${SLURM_ARRAY_TASK_ID:-0}"'
    out.mkdir(parents=True, exist_ok=True)
    scripts = {}

    scripts["setup.sbatch"] = _header("torchmatrix-setup", options, root) + [
        "# Build one virtualenv per torch version once, so the array tasks can reuse them (-R).",
        "nox --install-only -s gpu_matrix",
    ]
    if node_sizes:
        sizes = ",".join(map(str, node_sizes))
        scripts["cells.sbatch"] = _header(
            "torchmatrix-cells", options, root, array=f"0-{len(versions) * options.shards - 1}"
        ) + [
            _versions_array(versions),
            f"SHARDS={options.shards}",
            'VERSION="${VERSIONS[$((SLURM_ARRAY_TASK_ID / SHARDS))]}"',
            'SHARD="$((SLURM_ARRAY_TASK_ID % SHARDS + 1))/$SHARDS"',
            f"export TORCHMATRIX_RUN_ID={run_id}",
            NOX_RUN + _posargs(filters, f"--only world_size={sizes}", SHARD_ARG),
        ]
    for size in wide_sizes:
        nodes = -(-size // options.gpus_per_node)
        launcher = MULTINODE_LAUNCHER.format(port=options.rdzv_port)
        scripts[f"wide-ws{size}.sbatch"] = _header(
            f"torchmatrix-ws{size}", options, root, nodes=nodes, array=f"0-{len(versions) - 1}"
        ) + [
            f"# World size {size} spans {nodes} nodes of {options.gpus_per_node} GPUs: torchrun rendezvous under srun.",
            _versions_array(versions),
            'VERSION="${VERSIONS[$SLURM_ARRAY_TASK_ID]}"',
            'head="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
            f"export TORCHMATRIX_RUN_ID={run_id}",
            NOX_RUN
            + _posargs(
                filters,
                f"--only world_size={size}",
                f"--gpus-per-node {options.gpus_per_node}",
                f'--multinode-launcher "{launcher}"',
            ),
        ]
    scripts["merge.sbatch"] = _header("torchmatrix-merge", options, root) + [
        "# Runs after every task (afterany): a task that died leaves errored cells, not a gap.",
        'nox -s merge -- "reports/$TORCHMATRIX_SUBMISSION" --out "reports/$TORCHMATRIX_SUBMISSION-merged" ' + filters,
    ]
    work = [name for name in scripts if name not in ("setup.sbatch", "merge.sbatch")]
    submit = [
        "#!/usr/bin/env bash",
        "# Submit the torchmatrix matrix: setup, then the cells, then the merge (afterany).",
        "set -euo pipefail",
        f"cd {shlex.quote(str(root))}",
        'export TORCHMATRIX_SUBMISSION="${TORCHMATRIX_SUBMISSION:-slurm-$(date +%Y%m%d-%H%M%S)}"',
        "mkdir -p reports/slurm-logs",
        f'setup="$(sbatch --parsable {shlex.quote(str(out / "setup.sbatch"))})"',
    ]
    for index, name in enumerate(work):
        submit.append(f'job{index}="$(sbatch --parsable --dependency=afterok:$setup {shlex.quote(str(out / name))})"')
    after = ":".join(f"$job{index}" for index in range(len(work)))
    submit += [
        f'merge="$(sbatch --parsable --dependency=afterany:{after} {shlex.quote(str(out / "merge.sbatch"))})"',
        'echo "submitted $TORCHMATRIX_SUBMISSION: merged report will be in reports/$TORCHMATRIX_SUBMISSION-merged (merge job $merge)"',
    ]
    scripts["submit.sh"] = submit
    written = []
    for name, lines in scripts.items():
        path = out / name
        file_writes.write_text(path, "\n".join(lines) + "\n")
        path.chmod(0o755)
        written.append(path)
    return written
