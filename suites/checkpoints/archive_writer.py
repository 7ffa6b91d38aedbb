"""Write the checkpoint archive's forms with the torch release this interpreter runs:
`python -m torchmatrix.suites.checkpoints.archive_writer --to DIR [--release V]` (what `torchmatrix archive
write` runs in the release's venv).

Each form trains SAVE_STEP steps, saves through DCP, keeps beside the checkpoint what a load must
restore (version-neutral JSON), then trains CONTINUE_STEPS more without stopping and keeps that
too, so a reader compares its load and its continuation with no torch format in between.
`manifest.json` records the release, its git commit, and each form it could not write with why.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import shutil
import sys
import tempfile
import traceback
import warnings
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from .archive_stack import CONTINUE_STEPS, FORMS, SAVE_STEP, Stack, missing
from .neutral_state import neutral

SEED = 1234
EXPECTED_FILE = "expected.json"
MANIFEST_FILE = "manifest.json"


def write_form(form, directory: Path) -> str | None:
    """Rank function: train, save, continue and record one form; the reason it failed, or None."""
    if reason := missing(form):
        return reason
    try:
        stack = Stack(form, SEED)
        for _ in range(SAVE_STEP):
            stack.train_step()
        restored = stack.capture()
        stack.save(str(directory / "checkpoint"))
        losses = [stack.train_step() for _ in range(CONTINUE_STEPS)]
        continued = stack.capture()
        continued.pop("rank")  # the continuation is compared by parameters, optimizer state and losses
    except Exception as error:  # a release that lacks what the form needs fails here, named
        traceback.print_exc()
        return failure_reason(error)
    per_rank = [None] * dist.get_world_size()
    dist.all_gather_object(
        per_rank,
        neutral({"restored": restored.pop("rank"), "losses": torch.stack(losses)}),
    )
    if dist.get_rank() == 0:
        record = {
            **release(),
            "form": form.name,
            "world_size": form.world_size,
            "save_step": SAVE_STEP,
            "continue_steps": CONTINUE_STEPS,
            "restored": neutral(restored),
            "continued": neutral(continued),
            "ranks": per_rank,
        }
        (directory / EXPECTED_FILE).write_text(json.dumps(record, sort_keys=True))
    return None


def failure_reason(error: BaseException) -> str:
    """The exception's first line and the torch.distributed function it came from, in one line."""
    first = (str(error).strip().splitlines() or [""])[0][:200]
    frames = [frame for frame in traceback.extract_tb(error.__traceback__) if "/torch/distributed/" in frame.filename]
    where = f" (in {frames[-1].filename.rpartition('/torch/')[2]}:{frames[-1].name})" if frames else ""
    return f"{type(error).__name__}: {first}{where}"


def release() -> dict:
    return {"version": torch.__version__, "git_version": getattr(torch.version, "git_version", "unknown")}


def rank_main(rank: int, world: int, names: list[str], out: str, init_file: str) -> None:
    """One rank of a world size: write its forms in order, rank 0 keeping each outcome."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world, timeout=timedelta(seconds=120)
    )
    outcomes = {}
    for form in (form for form in FORMS if form.name in names):
        directory = Path(out) / form.directory
        if rank == 0:
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(parents=True)
        dist.barrier()
        with warnings.catch_warnings():
            warnings.simplefilter(
                "ignore"
            )  # the ranks' logs stay readable: a release's deprecations are not the archive's
            outcomes[form.name] = write_form(form, directory)
        dist.barrier()
        if outcomes[form.name] and rank == 0:
            shutil.rmtree(directory, ignore_errors=True)
    if rank == 0:
        (Path(out) / f".outcomes-{world}.json").write_text(json.dumps(outcomes))
    dist.destroy_process_group()


def write_release(out: Path, release_name: str, pattern: str = "*") -> dict:
    """Write the forms `pattern` matches into `out` (one spawn per world size) and the manifest; return the manifest."""
    out.mkdir(parents=True, exist_ok=True)
    outcomes = {}
    chosen = [form for form in FORMS if fnmatch.fnmatchcase(form.name, pattern)]
    exits = {}
    for world in sorted({form.world_size for form in chosen}):
        names = [form.name for form in chosen if form.world_size == world]
        with tempfile.TemporaryDirectory() as scratch:
            try:
                torch.multiprocessing.spawn(
                    rank_main, args=(world, names, str(out), str(Path(scratch) / "init")), nprocs=world
                )
            except Exception as error:
                exits[str(world)] = str(error).strip().splitlines()[-1]
        found = out / f".outcomes-{world}.json"
        if found.is_file():  # rank 0 recorded every form before a rank died on its way out
            outcomes.update(json.loads(found.read_text()))
            found.unlink()
        else:
            outcomes.update({name: f"the ranks failed: {exits[str(world)]}" for name in names})
            exits.pop(str(world))
    manifest = {
        "torch": release_name,
        **release(),
        "written": [name for name, reason in outcomes.items() if reason is None],
        "not_written": {name: reason for name, reason in outcomes.items() if reason is not None},
        "died_after_writing": exits,
    }
    (out / MANIFEST_FILE).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--to", type=Path, required=True, help="the archive directory; the release's forms go under <to>/<release>"
    )
    parser.add_argument("--release", default=torch.__version__.split("+")[0], help="the release's name in the archive")
    parser.add_argument("--forms", default="*", help="a glob over form names, e.g. 'fsdp2/*' (default: every form)")
    args = parser.parse_args(argv)
    manifest = write_release(args.to / args.release, args.release, args.forms)
    print(json.dumps(manifest, indent=1))
    return 0 if manifest["written"] else 1


if __name__ == "__main__":
    sys.exit(main())
