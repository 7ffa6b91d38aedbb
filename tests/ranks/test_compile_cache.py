"""Compiled graphs never cross cells, ranks or torch versions: each rank of each cell compiles into
its own TORCHINDUCTOR_CACHE_DIR under the run's directory for the version (`--cold-compile`; a key
folder of the compile store has the same layout), even when one long-lived rank process serves
both cells, and Inductor itself (which reads the variable at each cache access)
sees that directory; every suite of a cell reuses it. What Inductor builds from source alone is
built once: a cell's kernels by one of its ranks, the ISA probe once per version, and the ranks of a
process whose cells compile start with the compiler imported and probed. A test that compiled
records its compile seconds apart from its duration; one that did not records none."""

from __future__ import annotations

import json
import platform
import shutil
import sys

import pytest
from junitparser import JUnitXml

from helpers.matrix_files import matrix_toml

pytestmark = pytest.mark.slow

SUITE = """
import json, os

import torch
import torch.distributed as dist


def _where():
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return {"rank": dist.get_rank(), "pid": os.getpid(), "inductor": cache_dir(), "env": os.environ["TORCHINDUCTOR_CACHE_DIR"]}


def _compile_something():
    torch.compile(lambda x: (x * 2).sin(), backend="aot_eager")(torch.ones(3, requires_grad=True)).sum().backward()


def test_where_kernels_are_cached(cell, ranks):
    seen = ranks.run(_where)
    with open(os.path.join(os.environ["COMPILE_CACHE_OUT"], f"{os.path.basename(__file__)}-{cell.id}.json"), "w") as out:
        json.dump(seen, out)


def test_compiles(cell, ranks):
    ranks.run(_compile_something)
"""


def test_each_cell_compiles_into_its_own_cache_directory_of_its_torch_version(project, tmp_path, monkeypatch):
    out = tmp_path / "seen"
    out.mkdir()
    monkeypatch.setenv("COMPILE_CACHE_OUT", str(out))
    matrix = matrix_toml(axes={"world_size": [2], "flavor": ["a", "b"]}, suites={"where": {}, "again": {}})
    project.write_suites(matrix, test_where=SUITE, test_again=SUITE)
    done = project.torchmatrix(
        "run", "--torch", "system", "--reports", "out", "--slots", "2", "--run-id", "r1", "--cold-compile"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    a, b, again = (
        json.loads((out / f"{suite}-ws2-{flavor}.json").read_text())
        for suite, flavor in (("test_where.py", "a"), ("test_where.py", "b"), ("test_again.py", "a"))
    )
    assert [r["pid"] for r in a] == [r["pid"] for r in b], "both cells ran on the same rank processes"
    for seen in (a, b):
        assert all(r["inductor"] == r["env"] for r in seen), seen
        assert seen[0]["env"] != seen[1]["env"], "two ranks of one cell shared one compile cache directory"
    assert not {r["env"] for r in a} & {r["env"] for r in b}, "two cells shared one compile cache directory"
    assert [r["env"] for r in again] == [r["env"] for r in a], "two suites of one cell compiled into different caches"
    version_dir = (project.root / "out" / "r1" / "torch-system").resolve()
    assert [r["env"] for r in a] == [str(version_dir / "compile-cache" / "ws2-a" / f"rank{rank}") for rank in (0, 1)]

    properties = {}
    for suite in JUnitXml.fromfile(str(project.root / "out" / "r1" / "junit.xml")):
        properties.update({prop.name: prop.value for prop in suite.properties()})
    compiled = {name: float(value) for name, value in properties.items() if name.endswith("::compile_seconds")}
    assert sorted(compiled) == ["again::test_compiles::compile_seconds", "where::test_compiles::compile_seconds"], (
        properties
    )
    assert all(seconds > 0 for seconds in compiled.values()), compiled


BUILDS_SUITE = """
import torch
import torch.distributed as dist


def _pick():
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    return str(pick_vec_isa())


def _compile_with_inductor():
    return torch.compile(lambda x: (x * 2).sin() + x.cos())(torch.arange(5.0)).sum().item()


def test_picks_the_vector_isa(cell, ranks):
    picked = ranks.run(_pick)
    assert len(set(picked)) == 1, picked


def test_compiles_the_same_kernel_on_every_rank(cell, ranks):
    assert len(set(ranks.run(_compile_with_inductor))) == 1
"""


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.machine() != "x86_64" or not shutil.which("g++"),
    reason="Inductor builds its vector-ISA probe and CPU kernels on x86-64 Linux with a C++ compiler only",
)
def test_inductor_builds_its_isa_probe_once_per_version_and_a_kernel_once_per_cell(project):
    from torch._inductor.cpu_vec_isa import VecISA

    project.write_suites(
        matrix_toml(axes={"world_size": [2], "flavor": ["a", "b"]}, suites={"builds": {}}), test_builds=BUILDS_SUITE
    )
    done = project.torchmatrix("run", "--torch", "system", "--reports", "out", "--run-id", "r1", "--cold-compile")
    assert done.returncode == 0, done.stdout + done.stderr
    caches = (project.root / "out" / "r1" / "torch-system" / "compile-cache").resolve()
    isa_code = VecISA._avx_code
    probes = sorted(path.relative_to(caches).parts[0] for path in caches.rglob("*.cpp") if path.read_text() == isa_code)
    assert probes, "the ranks' ISA probe was built outside the run's compile caches"
    assert set(probes) == {".vec-isa-probe"}, f"a rank built Inductor's ISA probe in its cell's folder: {probes}"
    builds = sorted(
        path.relative_to(caches).parts[:2] for path in caches.glob("ws2-*/**/*.*") if path.suffix in (".cpp", ".so")
    )
    assert {folder for _, folder in builds} == {"kernels"}, f"a rank built a kernel in its own folder: {builds}"
    assert {cell for cell, _ in builds} == {"ws2-a", "ws2-b"}, (
        f"a cell's kernel sources are not in its folder: {builds}"
    )
    graph_caches = sorted(path.relative_to(caches).parts[:2] for path in caches.glob("ws2-*/*/fxgraph"))
    assert graph_caches == [(cell, f"rank{rank}") for cell in ("ws2-a", "ws2-b") for rank in (0, 1)], graph_caches


WARMED_SUITE = """
import subprocess
import sys


def _prepared_compiler():
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    started = []

    def refuse(*args, **kwargs):
        started.append(str(args[0] if args else kwargs.get("args")))
        raise subprocess.CalledProcessError(1, "refused: the rank must not start a process")

    run, popen = subprocess.run, subprocess.Popen
    subprocess.run = subprocess.Popen = refuse
    try:
        isa = str(pick_vec_isa()) if "torch._inductor.compile_fx" in sys.modules else ""
    finally:
        subprocess.run, subprocess.Popen = run, popen
    return {"compiler_imported": "torch._inductor.compile_fx" in sys.modules, "isa": isa, "started": started}


def test_prepared(cell, ranks):
    import json, os

    with open(os.path.join(os.environ["WARMUP_OUT"], cell.id + ".json"), "w") as out:
        json.dump(ranks.run(_prepared_compiler), out)
"""


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.machine() != "x86_64" or not shutil.which("g++"),
    reason="Inductor probes vector ISAs on x86-64 Linux with a C++ compiler only",
)
def test_ranks_of_a_compiling_cell_start_with_the_compiler_imported_and_the_isa_probed(project, tmp_path, monkeypatch):
    out = tmp_path / "seen"
    out.mkdir()
    monkeypatch.setenv("WARMUP_OUT", str(out))
    matrix = matrix_toml(
        axes={"world_size": [1, 2], "compile": ["none", "inductor"]},
        exclude=[{"world_size": 1, "compile": "inductor"}, {"world_size": 2, "compile": "none"}],
        suites={"warmed": {}},
    )
    project.write_suites(matrix, test_warmed=WARMED_SUITE)
    done = project.torchmatrix("run", "--torch", "system", "--reports", "out", "--run-id", "r1", "--cold-compile")
    assert done.returncode == 0, done.stdout + done.stderr
    eager, compiling = (json.loads((out / f"{cell}.json").read_text()) for cell in ("ws1-none", "ws2-inductor"))
    assert [rank["compiler_imported"] for rank in eager] == [False], "a process of eager cells imported the compiler"
    assert all(rank["compiler_imported"] and rank["isa"] for rank in compiling), compiling
    assert not any(rank["started"] for rank in compiling), f"a rank probed the ISA itself: {compiling}"
    caches = (project.root / "out" / "r1" / "torch-system" / "compile-cache").resolve()
    assert list((caches / ".vec-isa-probe").rglob("*.so")), "the probe was not built in the version's probe folder"
