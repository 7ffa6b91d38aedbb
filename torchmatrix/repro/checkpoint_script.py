"""The runtime of the script `torchmatrix repro` writes for a checkpoint one torch version wrote and
another could not load (a cross_version read failure), copied into it below FAILURE.

It needs torch alone: run with two interpreters (`--writer`, `--reader`), it runs itself in the
first to train a small model with AdamW a few steps and save model and optimizer moments with
torch.distributed.checkpoint (no process group), then in the second to load that checkpoint into a
model rebuilt from another seed and compare every tensor exactly. Exit 1 only when the load fails
or differs; a side that cannot import torch or crashes is "did not run" (exit 2), never a reproduction.
"""

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

FAILURE: dict = {}  # replaced in the script: the read that failed (writer, reader, cell, root cause)

CANNOT_IMPORT = 3  # a side's exit code when torch does not import there
EXPECTED = "expected.json"


def _build(seed):
    import torch

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = torch.Generator().manual_seed(seed)
    for _ in range(3):
        loss = model(torch.randn(5, 8, generator=data)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model, optimizer


def _state(model, optimizer):
    """Parameters and AdamW's state by parameter name: the tensors DCP saves and loads in place."""
    names = {id(parameter): name for name, parameter in model.named_parameters()}
    moments = {
        f"{names[id(parameter)]}.{key}": value
        for parameter, state in optimizer.state.items()
        for key, value in state.items()
        if hasattr(value, "shape")
    }
    return {"model": model.state_dict(), "optimizer": moments}


def _flat(state):
    return {f"{group}/{key}": tensor for group, tensors in state.items() for key, tensor in tensors.items()}


def write_side(directory):
    import torch.distributed.checkpoint as dcp

    state = _state(*_build(seed=0))
    dcp.save(state, checkpoint_id=str(Path(directory) / "checkpoint"))
    expected = {
        key: {
            "dtype": str(tensor.dtype).split(".")[1],
            "shape": list(tensor.shape),
            "values": tensor.flatten().tolist(),
        }
        for key, tensor in _flat(state).items()
    }
    (Path(directory) / EXPECTED).write_text(json.dumps(expected))
    print(f"wrote {directory}/checkpoint")


def read_side(directory):
    import torch
    import torch.distributed.checkpoint as dcp

    state = _state(*_build(seed=1))
    dcp.load(state, checkpoint_id=str(Path(directory) / "checkpoint"))
    expected = json.loads((Path(directory) / EXPECTED).read_text())
    differing = [
        key
        for key, tensor in _flat(state).items()
        if not torch.equal(
            tensor,
            torch.tensor(expected[key]["values"], dtype=getattr(torch, expected[key]["dtype"])).reshape(
                expected[key]["shape"]
            ),
        )
    ]
    if differing:
        raise AssertionError(f"loaded values differ from the saved ones: {', '.join(differing)}")
    print("loaded it exactly")


def side(role, directory):
    """One side, in the interpreter of its version: exit 0, 1 with `root cause:` last, or CANNOT_IMPORT."""
    try:
        import torch
    except BaseException:
        traceback.print_exc()
        sys.exit(CANNOT_IMPORT)
    print(f"torch {torch.__version__}", flush=True)
    try:
        (write_side if role == "write" else read_side)(directory)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as error:  # DCP's CheckpointException is a BaseException
        traceback.print_exc()
        print(f"root cause: {root_cause(error)}")
        sys.exit(1)


def root_cause(error):
    """One line: the exception, or for DCP's CheckpointException (which names only the ranks) the first rank's own."""
    failures = getattr(error, "failures", None)
    if isinstance(failures, dict) and failures:
        error = next(iter(failures.values()))
        error = error[0] if isinstance(error, tuple) else error  # (exception, its stack) per rank
    name = type(error).__qualname__
    module = type(error).__module__
    text = f"{name if module == 'builtins' else module + '.' + name}: {error}"
    return " ".join(text.split())


def _run(role, python, directory):
    """Run one side; its exit code, the torch version it printed first, and its last line."""
    done = subprocess.run([python, __file__, role, directory], capture_output=True, text=True)
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    lines = done.stdout.strip().splitlines()
    version = lines[0].split()[1] if lines and lines[0].startswith("torch ") else "(unknown)"
    return done.returncode, version, lines[-1] if lines else ""


def _is_torch(ran, named):
    """Whether `ran` (a torch.__version__, `2.15.0+cu132`) is the torch `named`: the same release, and
    the same build where `named` has a local label (`2.15.0+cpu` is not `2.15.0+cu132`)."""
    return ran == named if "+" in named else ran.split("+", 1)[0] == named


def main():
    if len(sys.argv) == 3 and sys.argv[1] in ("write", "read"):
        side(sys.argv[1], sys.argv[2])
        return
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--writer", required=True, help=f"a Python with torch {FAILURE['writer']}")
    parser.add_argument("--reader", required=True, help=f"a Python with torch {FAILURE['reader']}")
    args = parser.parse_args()
    directory = tempfile.mkdtemp(prefix="torch-checkpoint-repro-")
    try:
        code, written_by, _ = _run("write", args.writer, directory)
        if code != 0:
            print(f"\nthe writer ({args.writer}) exited {code}: did not run; this is not the failure")
            sys.exit(2)
        code, read_by, last = _run("read", args.reader, directory)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    what = f"a checkpoint written by torch {written_by}, loaded by torch {read_by}"
    if not (_is_torch(written_by, FAILURE["writer"]) and _is_torch(read_by, FAILURE["reader"])):
        print(f"\nnote: the failure was torch {FAILURE['writer']} writing and torch {FAILURE['reader']} reading")
    if code == 0:
        print(f"\n{what}: passed")
        sys.exit(0)
    if code == 1 and last.startswith("root cause: "):
        print(f"\n{what}: FAILED\n{last}")
        sys.exit(1)
    print(f"\nthe reader ({args.reader}) exited {code}: did not run; this is not the failure")
    sys.exit(2)
