"""What a compiled cell's caches save: compile seconds with a cold and with a warm cache, per backend.

Each measurement is a fresh Python process, as a cell's pytest process, a confirmation re-run or a
later suite's process is: it builds the reference decoder through the reference `parallelize` with
activation checkpointing and the cell's compile mode, runs the grad-ckpt suite's step (a forward, a
forward at another sequence length, the backward; --tiny leaves out the second forward, whose
dynamic-shape graphs are most of the compile time, and builds one layer a stack) and prints the
seconds Dynamo attributes to compiling (torchmatrix.ranks.compile_time) and the step's wall time. The first process of a pair
starts from an empty TORCHINDUCTOR_CACHE_DIR (cold), the second from what the first left (warm):
Inductor's FX graph and AOTAutograd caches live there, and aot_eager's graphs in AOTAutograd's, which a
process turns on for aot_eager as a cell's ranks do (torchmatrix.ranks.aot_eager_cache).

    pip install -e . && python bench/compile_cache.py [--backends aot_eager inductor]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

STEP = """
import json, sys, time

import torch

from torchmatrix.models.parallel import parallelize
from torchmatrix.models.transformer import DEPTH_AXIS, build_model, make_batch
from torchmatrix.ranks.aot_eager_cache import keep_aot_eager_graphs
from torchmatrix.ranks.compile_time import compile_seconds

cell = {"fsdp": "none", "attn": "sdpa", "compile": sys.argv[1], "compile_nesting": sys.argv[2]}
if sys.argv[4] != "as built":
    cell[DEPTH_AXIS] = int(sys.argv[4])
keep_aot_eager_graphs(sys.argv[1] == "aot_eager")
device = torch.device("cpu")
torch.manual_seed(0)
started = time.perf_counter()
model = parallelize(build_model(cell), cell, device=device, activation_checkpointing=True)
batch = make_batch(model, seed=1, device=device)
loss = model(**batch).loss
if sys.argv[3] == "grown":
    model(tokens=torch.cat((batch["tokens"], batch["tokens"]), dim=1))
loss.backward()
print(json.dumps({"compile_seconds": compile_seconds(), "wall_seconds": time.perf_counter() - started}))
"""


def measure(backend: str, nesting: str, cache: Path, sequence: str, depth: str) -> dict:
    """One fresh process's compile and wall seconds for the step, compiling into ``cache``, the decoder
    ``depth`` layers a stack ("as built": as the product builds the cell)."""
    done = subprocess.run(
        [sys.executable, "-c", STEP, backend, nesting, sequence, depth],
        env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache)},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", nargs="+", default=["aot_eager", "inductor"])
    parser.add_argument("--nestings", nargs="+", default=["outside", "inside"])
    parser.add_argument(
        "--tiny",
        action="store_true",
        help="aot_eager, outside, no forward at another length, one layer a stack (what CI runs)",
    )
    args = parser.parse_args()
    backends, nestings = (["aot_eager"], ["outside"]) if args.tiny else (args.backends, args.nestings)
    sequence = "fixed" if args.tiny else "grown"
    # A cache is saved or not whatever the depth; one layer a stack compiles a third as long as two.
    depth = "1" if args.tiny else "as built"
    print(
        "| backend | nesting | compile s, cold cache | compile s, warm cache | step wall s, cold | step wall s, warm |"
    )
    print("|---|---|---|---|---|---|")
    for backend in backends:
        for nesting in nestings:
            with tempfile.TemporaryDirectory(prefix="torchmatrix-compile-bench-") as cache:
                cold = measure(backend, nesting, Path(cache), sequence, depth)
                warm = measure(backend, nesting, Path(cache), sequence, depth)
            print(
                f"| {backend} | {nesting} | {cold['compile_seconds']:.1f} | {warm['compile_seconds']:.1f} "
                f"| {cold['wall_seconds']:.1f} | {warm['wall_seconds']:.1f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
