"""`torchmatrix github-matrix`: the job matrix for a GitHub Actions fan-out, for `fromJSON`.

One job per (torch version, shard) with the nox session to run, the arguments to pass after
`--`, and the GPU count the shard needs so the workflow can pick a runner label.
"""

from __future__ import annotations

import shlex

from torchmatrix.matrix.config import Matrix
from torchmatrix.matrix.selection import CellSelection, SelectionError, Shard

GITHUB_JOB_LIMIT = 256


def github_matrix(matrix: Matrix, shards: int, selection: CellSelection) -> dict:
    """`{"include": [...]}` with one entry per non-empty (version, shard); never empty, which GitHub refuses."""
    if shards < 1:
        raise SelectionError(f"--shards {shards}: use a positive number of shards per torch version")
    versions = [v for v in matrix.versions if v != "system"]
    if not versions:
        raise SelectionError(
            f"[torch].versions of {matrix.path.name} lists only 'system'; each job installs one pinned torch version, "
            "so list them there (GitHub refuses an empty job matrix)"
        )
    jobs = len(versions) * shards
    if jobs > GITHUB_JOB_LIMIT:
        most = GITHUB_JOB_LIMIT // max(len(versions), 1)
        raise SelectionError(
            f"--shards {shards} x {len(versions)} torch versions = {jobs} jobs, over GitHub's limit of {GITHUB_JOB_LIMIT} per matrix; use --shards {most} or fewer"
        )
    include = []
    for version in versions:
        for index in range(1, shards + 1):
            shard = Shard(index, shards)
            job = selection.sharded(shard)
            cells = matrix.select(job)
            if not cells:
                continue
            include.append(
                {
                    "name": f"torch {version} shard {shard}",
                    "torch": version,
                    "session": f"gpu_matrix(torch='{version}')",
                    "shard": str(shard),
                    "args": shlex.join(job.arguments()),
                    "gpus": max(cell.world_size for cell in cells),
                    "cells": len(cells),
                }
            )
    return {"include": include}
