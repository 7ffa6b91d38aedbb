"""`[requires]`: each component's pip requirements install on their own; one that pip cannot
install is recorded with pip's reason in the venv (kept for `nox -R`), and the suites error the
cells that need it with that reason and the fix, or skip them where `[optional]` allows; never
silently. A component whose module imports a package that is not installed is held to the same rule."""

from __future__ import annotations

import json
from pathlib import Path

import nox
import pytest

from torchmatrix.env.component_requirements import RECORD_VARIABLE, install_requirements, read_record

from helpers.matrix_files import REFERENCE_COMPONENTS, matrix_toml
from helpers.run_results import run_suites

PIP_REASON = "ERROR: Could not find a version that satisfies the requirement torchao==99 (from versions: 0.18.0)"


class FakeVenv:
    def __init__(self, location: Path):
        self.location = str(location)


class FakeSession:
    """A nox session whose installs fail, with pip's ERROR line, for requirements in `failing`;
    `reused` is nox -R, where installs are skipped and the version probe returns None."""

    def __init__(self, venv: Path, failing: set[str] = frozenset(), reused: bool = False):
        self.virtualenv = FakeVenv(venv)
        self.env: dict[str, str] = {}
        self.failing, self.reused = failing, reused
        self.installed: list[tuple[str, ...]] = []

    def run_install(self, *args, silent=False, log=True, **kwargs):
        return None if self.reused else "Python 3.11.7"

    def install(self, *args, silent=False, stdout=None, stderr=None):
        requirements = tuple(a for a in args if not a.startswith("--") and not a.endswith(".txt"))
        self.installed.append(requirements)
        if self.failing & set(requirements):
            stdout.write(f"Looking in indexes: https://pypi.org/simple\n{PIP_REASON}\n")
            stdout.flush()
            raise nox.command.CommandFailed("Returned code 1")
        stdout.write("Successfully installed\n")
        stdout.flush()


REQUIRES = {
    "optimizer_ao_adamw8bit": ("torchao==99",),
    "optimizer_ao_adamw4bit": ("torchao==99",),
    "optimizer_optimi_adamw_kahan": ("torch-optimi",),
}


def test_a_requirement_pip_cannot_install_is_recorded_with_pips_reason_per_component(tmp_path):
    session = FakeSession(tmp_path / "venv", failing={"torchao==99"})
    (tmp_path / "venv").mkdir()
    failed = install_requirements(session, REQUIRES, ("torch-optimi==0.3.3",), tmp_path / "requires.log")
    assert session.installed == [("torchao==99",), ("torch-optimi",)], "one installer call per distinct list"
    assert failed == {"optimizer_ao_adamw8bit": PIP_REASON, "optimizer_ao_adamw4bit": PIP_REASON}
    record = session.env[RECORD_VARIABLE]
    assert Path(record).parent == tmp_path / "venv"
    assert read_record(record) == {
        "optimizer_ao_adamw8bit": f"torchao==99: {PIP_REASON}",
        "optimizer_ao_adamw4bit": f"torchao==99: {PIP_REASON}",
    }
    assert "torch-optimi==0.3.3" in (tmp_path / "requires-constraints.txt").read_text()
    assert PIP_REASON in (tmp_path / "requires.log").read_text()


def test_nox_reuse_installs_nothing_and_keeps_the_record(tmp_path):
    (tmp_path / "venv").mkdir()
    install_requirements(FakeSession(tmp_path / "venv", failing={"torchao==99"}), REQUIRES, (), tmp_path / "a.log")
    reused = FakeSession(tmp_path / "venv", reused=True)
    failed = install_requirements(reused, REQUIRES, (), tmp_path / "b.log")
    assert reused.installed == []
    assert set(failed) == {"optimizer_ao_adamw8bit", "optimizer_ao_adamw4bit"}
    assert reused.env[RECORD_VARIABLE] == str(tmp_path / "venv" / "torchmatrix-requires.json")


@pytest.mark.slow
def test_a_missing_package_errors_its_cells_unless_optional_where_they_skip(tmp_path, monkeypatch):
    """adamw's module imports a package nobody installed and is not optional: its cells error with
    the fix, the run exits 1; precision_aware's requirement failed to install and it is optional
    on this device: its cells skip with pip's reason. Both are warned about before any cell."""
    record = tmp_path / "record.json"
    record.write_text(json.dumps({"optimizer_precision_aware": {"requires": ["torchao==99"], "reason": PIP_REASON}}))
    monkeypatch.setenv(RECORD_VARIABLE, str(record))
    project = tmp_path / "project"
    project.mkdir()
    (project / "heavy_optim.py").write_text(
        "import a_package_nobody_installed\n\ndef build(params, *, lr):\n    pass\n"
    )
    text = matrix_toml(
        axes={"world_size": [1], "fsdp": ["none"], "attn": ["sdpa"], "optimizer": ["adamw", "precision_aware"]},
        suites={"resume": {"timeout": 120, "axes": ["world_size", "fsdp", "optimizer"]}},
        components={**REFERENCE_COMPONENTS, "optimizer_adamw": "heavy_optim:build"},
    )
    done, outcomes = run_suites(project, text + '\n[optional]\noptimizer_precision_aware = { device = ["cpu"] }\n')
    assert done.returncode == 1, done.stdout + done.stderr
    assert set(outcomes["ws1-none-sdpa-adamw"].values()) == {"error"}, outcomes
    assert set(outcomes["ws1-none-sdpa-precision_aware"].values()) == {"skipped"}, outcomes
    junit = {
        cell: (project / "reports" / "latest" / "torch-system" / f"{cell}.xml")
        .read_text()
        .replace("&gt;", ">")
        .replace("&quot;", '"')
        .replace("&apos;", "'")
        for cell in ("ws1-none-sdpa-adamw", "ws1-none-sdpa-precision_aware")
    }
    assert (
        "optimizer_adamw = heavy_optim:build needs 'a_package_nobody_installed', which is not installed here; "
        'install it, or declare the component optional: [optional] optimizer_adamw = { device = ["cpu"] }'
    ) in junit["ws1-none-sdpa-adamw"]
    assert f"optimizer_precision_aware needs torchao==99: {PIP_REASON}" in junit["ws1-none-sdpa-precision_aware"]
    warnings = [line for line in done.stderr.splitlines() if line.startswith("torchmatrix: warning: ")]
    assert len(warnings) == 2, done.stderr
    assert "components.optimizer_adamw: " in warnings[1] and "its cells will error" in warnings[1], warnings
    assert "components.optimizer_precision_aware: " in warnings[0] and "its cells will skip" in warnings[0], warnings


@pytest.mark.slow
def test_an_optional_component_skips_the_cross_version_write_too(tmp_path):
    """The cross_version suite trains with what resume trains with, so `[optional]` holds for it too:
    an optimizer whose package is missing skips its write with that reason (not "No module named"),
    while the other optimizer's cell writes its checkpoint for the peer version."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "heavy_optim.py").write_text(
        "import a_package_nobody_installed\n\ndef build(params, *, lr):\n    pass\n"
    )
    text = matrix_toml(
        torch=("system", "2.14.1"),
        baseline="system",
        axes={"world_size": [1], "fsdp": ["none"], "attn": ["sdpa"], "optimizer": ["adamw", "heavy"]},
        suites={"cross_version": {"timeout": 120, "path": None, "options": {"steps": 3, "resume_step": 1}}},
        components={**REFERENCE_COMPONENTS, "optimizer_heavy": "heavy_optim:build"},
    )
    done, outcomes = run_suites(project, text + '\n[optional]\noptimizer_heavy = { device = ["cpu"] }\n')
    assert done.returncode == 0, done.stdout + done.stderr
    assert set(outcomes["ws1-none-sdpa-adamw"].values()) == {"passed"}, outcomes
    assert set(outcomes["ws1-none-sdpa-heavy"].values()) == {"skipped"}, outcomes
    junit = (project / "reports" / "latest" / "torch-system" / "ws1-none-sdpa-heavy.xml").read_text()
    assert "optimizer_heavy = heavy_optim:build needs 'a_package_nobody_installed'" in junit, junit
