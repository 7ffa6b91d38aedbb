"""A compile store key changes with everything a cached graph depends on that the cell id does not
say: the torch build, the compiler, the device, the sources of the suites and of the components'
packages, and the matrix's components and suite options; and with nothing else."""

from __future__ import annotations

import sys

import pytest
import torch

from torchmatrix.messages import compile_keys, compile_store
from torchmatrix.messages.compile_store import matrix_digest


@pytest.fixture
def sources(tmp_path, monkeypatch):
    """A user's component package and suite folder, importable as a matrix names them."""
    package = tmp_path / "stack"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "model.py").write_text("from stack.layers import Block\n")
    (package / "layers.py").write_text("class Block: pass\n")
    suites = tmp_path / "suites"
    suites.mkdir()
    (suites / "test_mine.py").write_text("def test_it(cell, ranks): pass\n")
    (suites / "reference.py").write_text("STEPS = 3\n")
    (suites / "__init__.py").write_text("")  # a package, as the built-in suites are, its helpers in sub-packages
    (suites / "comparison").mkdir()
    (suites / "comparison" / "__init__.py").write_text("")
    (suites / "comparison" / "bounds.py").write_text("RTOL = 0.0\n")
    mapped = tmp_path / "elsewhere"  # a subpackage an editable install maps to a folder outside its parent
    mapped.mkdir()
    (mapped / "__init__.py").write_text("")
    (mapped / "blocks.py").write_text("class Block: pass\n")
    (package / "models").mkdir()
    (package / "models" / "__init__.py").write_text(f"__path__ = [{str(mapped)!r}]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [name for name in sys.modules if name == "stack" or name.startswith("stack.")]:
        monkeypatch.delitem(sys.modules, name)  # another test's stack, from its own folder
    return tmp_path


def _key(sources, **changed):
    arguments = {
        "matrix_digest": matrix_digest({"model": "stack.model:build"}, {"mine": {"steps": 3}}),
        "device": {"device_type": "cpu"},
        "components": {"model": "stack.model:build", "block": "stack.models.blocks:Block"},
        "suite_files": [sources / "suites" / "test_mine.py"],
    }
    return compile_store.key_folder(sources / "store", compile_keys.key_facts(**{**arguments, **changed})).name


def test_the_same_facts_give_the_same_folder_and_write_them_beside_it(sources):
    assert _key(sources) == _key(sources)
    assert '"torch"' in (sources / "store" / _key(sources) / compile_store.KEY_FACTS).read_text()


@pytest.mark.parametrize(
    "edited",
    ["stack/layers.py", "suites/reference.py", "suites/comparison/bounds.py", "elsewhere/blocks.py"],
    ids=[
        "a module the component imports",
        "a suite's neighbour",
        "a helper in the suites' sub-package",
        "a subpackage mapped elsewhere",
    ],
)
def test_an_edited_source_changes_the_key(sources, edited):
    before = _key(sources)
    (sources / edited).write_text((sources / edited).read_text() + "# edited\n")
    assert _key(sources) != before


def test_another_torch_build_compiler_or_device_changes_the_key(sources, monkeypatch):
    before = _key(sources)
    monkeypatch.setattr(torch.version, "git_version", "0" * 40)
    assert _key(sources) != before
    monkeypatch.undo()
    monkeypatch.syspath_prepend(str(sources))
    monkeypatch.setattr(compile_keys, "compiler_version", lambda: "g++: g++ (GCC) 99.1")
    assert _key(sources) != before
    monkeypatch.undo()
    monkeypatch.syspath_prepend(str(sources))
    assert _key(sources, device={"device_type": "cuda", "gpu_name": "NVIDIA H100"}) != before


def test_other_components_or_suite_options_change_the_matrix_part(sources):
    reference = matrix_digest({"model": "stack.model:build"}, {"mine": {"steps": 3}})
    assert matrix_digest({"model": "stack.model:build_mutant"}, {"mine": {"steps": 3}}) != reference
    assert matrix_digest({"model": "stack.model:build"}, {"mine": {"steps": 4}}) != reference
    assert matrix_digest({"model": "stack.model:build"}, {"mine": {"steps": 3}}) == reference
