"""The runtime of every script `torchmatrix repro` writes, copied into it below CHECK and SOURCES.

It writes the inlined modules (SOURCES) to a temporary directory, starts the cell's ranks with
torch.multiprocessing.spawn on gloo (nccl for CUDA tensors), and runs the one suite test under
pytest with the fixtures torchmatrix's plugin would give it, then prints the root cause line: exit 1
only when the test itself failed; an import, collection or fixture error is "did not run", exit 2.
It imports nothing from an installed torchmatrix: the script runs where torchmatrix never was.
"""

import os
import queue
import shutil
import socket
import sys
import tempfile
import traceback
from pathlib import Path

import pytest

CHECK: dict = {}  # replaced in the script: the test, its cell, options, components, world size, device
SOURCES: dict = {}  # replaced in the script: relative path -> source of every inlined module


class RankFailure(Exception):
    """A rank raised; the message carries its traceback, `root_cause` its innermost exception line."""

    def __init__(self, rank, text, cause):
        super().__init__(f"rank {rank} failed: {cause}\n{text}")
        self.root_cause = cause


def rank_main(rank, world, port, device, tasks, results):
    """One rank: join the process group, then run each (fn, args) it is sent until None."""
    import torch
    import torch.distributed as dist

    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), TORCHMATRIX_DEVICE=device)
    if device == "cuda":
        torch.cuda.set_device(rank)
    backend = "cpu:gloo,cuda:nccl" if device == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    from torchmatrix.messages.root_cause import root_cause

    while (task := tasks[rank].get()) is not None:
        fn, args = task
        try:
            results.put((rank, True, fn(*args), ""))
        except BaseException as error:
            results.put((rank, False, traceback.format_exc(), root_cause(error)))
    dist.destroy_process_group()


class Ranks:
    """`ranks.run(fn, *args)`: fn on every rank of the cell, one value per rank, as in torchmatrix;
    `ranks.in_world(n)`: n ranks of their own, whose default process group is exactly them (and
    `ranks.beside(n)`: those ranks and no reason, since spawned ranks can always open one)."""

    def __init__(self, world, device, timeout):
        import torch.multiprocessing as mp

        context = mp.get_context("spawn")
        self.world, self.device, self.timeout = world, device, timeout
        self.worlds = {}
        self.tasks = [context.Queue() for _ in range(world)]
        self.results = context.Queue()
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        self.processes = mp.spawn(
            rank_main, args=(world, port, device, self.tasks, self.results), nprocs=world, join=False
        )

    @property
    def world_size(self):
        return self.world

    def in_world(self, world_size):
        if world_size == self.world:
            return self
        if world_size not in self.worlds:
            self.worlds[world_size] = Ranks(world_size, self.device, self.timeout)
        return self.worlds[world_size]

    def beside(self, world_size):
        return self.in_world(world_size), ""

    def run(self, fn, *args):
        for tasks in self.tasks:
            tasks.put((fn, args))
        answers = {}
        try:
            while len(answers) < self.world:
                rank, ok, value, cause = self.results.get(timeout=self.timeout)
                answers[rank] = (ok, value, cause)
        except queue.Empty:
            raise TimeoutError(
                f"ranks {sorted(set(range(self.world)) - set(answers))} did not answer in {self.timeout:.0f}s"
            ) from None
        for rank in sorted(answers):
            ok, value, cause = answers[rank]
            if not ok:
                raise RankFailure(rank, value, cause)
        return [answers[rank][1] for rank in range(self.world)]

    def close(self):
        """Stop the ranks (and those of the worlds of their own); one still busy (a hang the deadline
        caught) is terminated."""
        for other in self.worlds.values():
            other.close()
        for tasks in self.tasks:
            tasks.put(None)
        for process in self.processes.processes:
            process.join(timeout=30)
            if process.is_alive():
                process.terminate()


class Fixtures:
    """The fixtures a suite test takes (cell, ranks, components, suite_options, once_per_cell) and
    the hooks that keep only the reproduced test and record its root cause."""

    def __init__(self):
        self.pool = None
        self.shared = {}
        self.root_cause = None

    def pytest_collection_modifyitems(self, config, items):
        kept = [item for item in items if _test_name(item) == CHECK["test"]]
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = kept

    def pytest_runtest_makereport(self, item, call):
        if call.when == "call" and call.excinfo is not None and not call.excinfo.errisinstance(pytest.skip.Exception):
            from torchmatrix.messages.root_cause import root_cause

            self.root_cause = root_cause(call.excinfo.value)

    @pytest.fixture
    def cell(self):
        from torchmatrix.matrix.cells import Cell

        return Cell(CHECK["cell"])

    @pytest.fixture
    def ranks(self):
        if self.pool is None:
            self.pool = Ranks(CHECK["world_size"], CHECK["device"], CHECK["timeout"])
        return self.pool

    @pytest.fixture
    def components(self):
        return dict(CHECK["components"])

    @pytest.fixture
    def suite_options(self, request):
        """As the plugin's: the options read into the dataclass the suite module names as `OPTIONS` (every
        built-in suite's tests read them as attributes), else the table as it is."""
        declared = getattr(request.module, "OPTIONS", None)
        return declared.from_table(CHECK["options"]) if declared else dict(CHECK["options"])

    @pytest.fixture
    def once_per_cell(self):
        def shared(name, compute):
            if name not in self.shared:
                self.shared[name] = compute()
            return self.shared[name]

        return shared


def _test_name(item):
    """The test's name as torchmatrix reports it: the function, then its parameters other than the cell."""
    spec = getattr(item, "callspec", None)
    params = dict(spec.params) if spec else {}
    return item.originalname + (f"[{','.join(f'{k}={v}' for k, v in params.items())}]" if params else "")


def main():
    root = Path(tempfile.mkdtemp(prefix="torch-repro-"))
    for relative, text in SOURCES.items():
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(text)
    sys.path.insert(0, str(root))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [os.environ.get("PYTHONPATH")])])
    if CHECK["device"] == "cuda":
        import torch

        if torch.cuda.device_count() < CHECK["world_size"]:
            sys.exit(f"this check needs {CHECK['world_size']} CUDA GPUs; {torch.cuda.device_count()} are visible")
    fixtures = Fixtures()
    try:
        code = pytest.main(
            [str(root / CHECK["suite_file"]), "-p", "no:cacheprovider", "-q", "--tb=short", "--rootdir", str(root)],
            plugins=[fixtures],
        )
    finally:
        if fixtures.pool is not None:
            fixtures.pool.close()
        shutil.rmtree(root, ignore_errors=True)
    print(f"\n{CHECK['suite']}::{CHECK['test']} in cell {CHECK['cell_id']}: ", end="")
    if code == 0:
        print("passed")
        sys.exit(0)
    if fixtures.root_cause is not None:
        print(f"FAILED\nroot cause: {fixtures.root_cause}")
        sys.exit(1)
    print(f"did not run (pytest exit {code}: an import, collection or fixture error above); this is not the failure")
    sys.exit(2)
