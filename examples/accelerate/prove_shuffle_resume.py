"""accelerate 1.16.0, without torchmatrix: a shuffled DataLoader prepared with
`DataLoaderConfiguration(use_stateful_dataloader=True)` and saved by `save_state` mid-epoch reads
another order after `load_state` than the run that never stopped, whatever seed the rebuilt run set.
`prepare` rebuilds the loader as a StatefulDataLoader around the original's torch `RandomSampler`,
whose permutation is drawn when an epoch starts and kept in no state: the loaded loader skips the
batches already read of a new permutation. The control, torchdata's StatefulDataLoader with
`shuffle=True` and no accelerate, swaps in torchdata's stateful sampler and resumes exactly.

    python examples/accelerate/prove_shuffle_resume.py                   # exits 1 while the bug is there
    python examples/accelerate/prove_shuffle_resume.py --rebuild-seed 0  # the straight run's seed: still 1
"""

from __future__ import annotations

import argparse
import itertools
import tempfile

import torch
from accelerate import Accelerator, DataLoaderConfiguration
from accelerate.state import AcceleratorState
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

SEQUENCES, SAVE_AT, READ = 32, 4, 8  # items (16 batches of 2 an epoch), the batch the save follows, batches compared


def prepared(seed: int):
    """An Accelerator and its prepared, shuffled, stateful DataLoader, built after `manual_seed(seed)`."""
    torch.manual_seed(seed)
    AcceleratorState._reset_state(reset_partial_state=True)
    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True))
    return accelerator, accelerator.prepare(DataLoader(torch.arange(SEQUENCES), batch_size=2, shuffle=True))


def batches(loader, count: int) -> list:
    """The next `count` batches as a training loop reads them, one epoch after another."""
    return list(itertools.islice((batch.tolist() for _ in itertools.count() for batch in loader), count))


def accelerate_resumes(rebuild_seed: int) -> tuple[list, list]:
    """The straight run's batches, and those of a run saved by `save_state` and loaded by `load_state`."""
    straight = batches(prepared(0)[1], READ)
    accelerator, loader = prepared(0)
    reading = iter(loader)
    resumed = [next(reading).tolist() for _ in range(SAVE_AT)]
    with tempfile.TemporaryDirectory() as directory:
        accelerator.save_state(directory)
        accelerator, loader = prepared(rebuild_seed)
        accelerator.load_state(directory)
        return straight, resumed + batches(loader, READ - SAVE_AT)


def torchdata_resumes(rebuild_seed: int) -> tuple[list, list]:
    """The control: torchdata's StatefulDataLoader alone, through its own state_dict / load_state_dict."""
    torch.manual_seed(0)
    straight = batches(StatefulDataLoader(torch.arange(SEQUENCES), batch_size=2, shuffle=True), READ)
    torch.manual_seed(0)
    loader = StatefulDataLoader(torch.arange(SEQUENCES), batch_size=2, shuffle=True)
    reading = iter(loader)
    resumed = [next(reading).tolist() for _ in range(SAVE_AT)]
    state = loader.state_dict()
    torch.manual_seed(rebuild_seed)
    loader = StatefulDataLoader(torch.arange(SEQUENCES), batch_size=2, shuffle=True)
    loader.load_state_dict(state)
    return straight, resumed + batches(loader, READ - SAVE_AT)


def report(name: str, straight: list, resumed: list) -> bool:
    """Print where `resumed` first leaves `straight`; whether it never does."""
    differing = next((i for i, (a, b) in enumerate(zip(straight, resumed)) if a != b), None)
    if differing is None:
        print(f"{name}: the resumed run read the straight run's {READ} batches")
        return True
    print(
        f"{name}: batch {differing} after the resume is {resumed[differing]}, the straight run's {straight[differing]}"
    )
    return False


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--rebuild-seed", type=int, default=1, help="torch.manual_seed before the rebuilt run's prepare"
    )
    rebuild_seed = parser.parse_args().rebuild_seed
    report("torchdata alone (control)", *torchdata_resumes(rebuild_seed))
    return 0 if report("accelerate save_state / load_state", *accelerate_resumes(rebuild_seed)) else 1


if __name__ == "__main__":
    raise SystemExit(main())
