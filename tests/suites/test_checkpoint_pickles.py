"""suites/checkpoints/checkpoint_pickles.py: a checkpoint another run wrote is judged by the globals its pickles
would import, before anything loads it; real DCP checkpoints pass, code in them is named and never runs."""

from __future__ import annotations

import os
import pickle
import sys
import warnings

import numpy
import torch
import torch.distributed.checkpoint as dcp

from suites.checkpoints.checkpoint_pickles import pickled_globals, unsafe_globals
from suites.cross_version_reads import not_loaded

SYSTEM = f"{os.system.__module__}.system"  # how a pickle names os.system: posix.system on Linux


class TouchesAFile:
    """Unpickling it runs a shell command: what a hostile checkpoint carries."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def saved(directory, state):
    """A DCP checkpoint as one process writes it (no process group: DCP says so in a warning)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.save(state, checkpoint_id=str(directory))
    return directory


def test_a_real_dcp_checkpoint_with_byte_items_and_numpy_rng_state_is_data(tmp_path):
    state = {
        "weight": torch.randn(3, 4),
        "bf16": torch.ones(2, dtype=torch.bfloat16),
        "step": 7,
        "rng": {"numpy": numpy.random.get_state(), "torch": torch.get_rng_state()},
        "note": "scheduler",
    }
    assert unsafe_globals(saved(tmp_path / "checkpoint", state)) == {}


def test_metadata_that_would_run_a_command_is_named_and_nothing_runs(tmp_path):
    checkpoint = saved(tmp_path / "checkpoint", {"weight": torch.zeros(2)})
    marker = tmp_path / "ran"
    (checkpoint / ".metadata").write_bytes(pickle.dumps(TouchesAFile(marker)))
    assert unsafe_globals(checkpoint) == {".metadata": [SYSTEM]}
    assert not marker.exists()


def test_a_byte_item_that_would_run_a_command_is_named_with_its_key(tmp_path):
    marker = tmp_path / "ran"
    checkpoint = saved(tmp_path / "checkpoint", {"weight": torch.zeros(2), "extra": TouchesAFile(marker)})
    ((where, names),) = unsafe_globals(checkpoint).items()
    assert where.endswith(".distcp (extra)") and names == [SYSTEM]
    assert not marker.exists()


def test_a_stack_trick_that_shows_data_names_but_imports_others_reads_computed():
    """Push "os", "system", then "torch", "Size", pop those two: STACK_GLOBAL imports os.system."""
    strings = [b"\x8c" + bytes([len(text)]) + text for text in (b"os", b"system", b"torch", b"Size")]
    trick = b"\x80\x04" + b"".join(strings) + b"00" + b"\x93" + b")R."
    assert pickled_globals(trick) == ["<computed>"]
    assert pickled_globals(pickle.dumps(torch.Size([2]), protocol=4)) == ["torch.Size"]


def test_the_stacks_own_classes_pass_only_where_named_and_its_functions_never(tmp_path, monkeypatch):
    package = tmp_path / "code" / "mystack"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "state.py").write_text(
        "class Counter:\n    def __init__(self, n=0):\n        self.n = n\n\ndef reset():\n    return 0\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path / "code"))
    from mystack.state import Counter, reset

    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "extra.pkl").write_bytes(pickle.dumps({"counter": Counter(3)}))
    assert unsafe_globals(checkpoint) == {"extra.pkl": ["mystack.state.Counter"]}
    assert unsafe_globals(checkpoint, frozenset({"mystack"})) == {}
    (checkpoint / "extra.pkl").write_bytes(pickle.dumps({"reset": reset}))
    assert unsafe_globals(checkpoint, frozenset({"mystack"})) == {"extra.pkl": ["mystack.state.reset"]}
    sys.modules.pop("mystack.state", None)


def test_a_module_outside_the_allowed_packages_is_never_imported_to_judge_it(tmp_path, monkeypatch):
    package = tmp_path / "code" / "importbomb"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f"open({str(tmp_path / 'imported')!r}, 'w').close()\nclass Thing: pass\n")
    monkeypatch.syspath_prepend(str(tmp_path / "code"))
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "state.pkl").write_bytes(b"\x80\x04\x8c\nimportbomb\x8c\x05Thing\x93)\x81.")
    assert unsafe_globals(checkpoint) == {"state.pkl": ["importbomb.Thing"]}
    assert not (tmp_path / "imported").exists()


def test_a_torch_save_archive_is_judged_by_torchs_weights_only_rules(tmp_path):
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    torch.save({"weight": torch.ones(2), "rng": numpy.random.get_state()}, checkpoint / "extra.pt")
    assert unsafe_globals(checkpoint) == {}
    torch.save({"hook": TouchesAFile(tmp_path / "ran")}, checkpoint / "extra.pt")
    assert unsafe_globals(checkpoint) == {"extra.pt": [SYSTEM]}


def test_the_refusal_is_one_line_naming_the_writer_file_and_globals(tmp_path):
    line = not_loaded("ws1-none", "2.15.0", {".metadata": ["posix.system"], "__0_0.distcp (extra)": ["builtins.exec"]})
    assert "\n" not in line
    assert line.startswith("ws1-none: not loaded: the checkpoint torch 2.15.0 wrote would import code")
    assert "(.metadata: posix.system; __0_0.distcp (extra): builtins.exec)" in line
