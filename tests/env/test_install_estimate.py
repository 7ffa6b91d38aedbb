"""The install phases of the ETA: what pip's dry-run report says a version fetches, downloads only
what its wheelhouse lacks, unpacks everything, and a size nobody can tell makes it unknown."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from torchmatrix.env.install_estimate import (
    COPY_BYTES_PER_S,
    CPU_S,
    DOWNLOAD_BYTES_PER_S,
    UNPACK_BYTES_PER_S,
    InstallEstimate,
    InstallPace,
    estimate_from_report,
    estimate_install,
    url_size,
    wheelhouse_files,
)

TORCH_URL = "https://files.example/packages/torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl"
NUMPY_URL = "file:///opt/pypi/files/numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl"
SIZES = {TORCH_URL: 900_000_000, NUMPY_URL: 17_000_000}


def pip_report(*urls: str) -> dict:
    """What `pip install --dry-run --report -` writes, reduced to what the estimate reads."""
    return {"version": "1", "install": [{"download_info": {"url": url}, "metadata": {"name": "x"}} for url in urls]}


def test_a_wheel_in_the_wheelhouse_downloads_nothing_but_still_unpacks():
    fresh = estimate_from_report(pip_report(TORCH_URL, NUMPY_URL), cached=[], size_of=SIZES.get)
    assert fresh == InstallEstimate(download_bytes=900_000_000, unpack_bytes=917_000_000, copy_bytes=17_000_000)
    cached = estimate_from_report(
        pip_report(TORCH_URL, NUMPY_URL),
        cached=["torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl"],
        size_of=SIZES.get,
    )
    assert cached == InstallEstimate(download_bytes=0, unpack_bytes=917_000_000, copy_bytes=17_000_000)
    assert cached.seconds == pytest.approx(CPU_S + 17e6 / COPY_BYTES_PER_S + 917e6 / UNPACK_BYTES_PER_S)
    assert fresh.seconds - cached.seconds == pytest.approx(900e6 / DOWNLOAD_BYTES_PER_S)
    assert estimate_from_report(pip_report(), cached=[], size_of=SIZES.get).seconds == CPU_S, (
        "a venv costs its CPU part"
    )


def test_a_size_nobody_can_tell_makes_the_estimate_unknown_not_smaller():
    unknown = "https://files.example/packages/mystery-1.0-py3-none-any.whl"
    assert estimate_from_report(pip_report(NUMPY_URL, unknown), cached=[], size_of=SIZES.get) is None
    assert estimate_from_report({"error": "not a report"}, cached=[], size_of=SIZES.get) is None
    assert estimate_from_report(pip_report(NUMPY_URL), cached=[], size_of=SIZES.get) is not None


def test_describe_says_what_downloads_and_unpacks():
    assert InstallEstimate(2_800_000_000, 2_900_000_000).describe() == "2.8 GB to download, 2.9 GB to unpack"
    assert InstallEstimate(0, 200_000_000).describe() == "nothing to download, 0.2 GB to unpack"
    assert InstallEstimate(0, 3_000_000_000, 3_000_000_000).describe() == (
        "3.0 GB to copy from a local index, 3.0 GB to unpack"
    )


def test_a_local_files_size_is_read_from_disk_and_other_schemes_are_unknown(tmp_path):
    wheel = tmp_path / "demo pkg-1.0-py3-none-any.whl"
    wheel.write_bytes(b"x" * 1234)
    assert url_size(wheel.as_uri()) == 1234
    assert url_size((tmp_path / "missing.whl").as_uri()) is None
    assert url_size("git+https://example/repo.git") is None


def test_estimate_install_reads_pips_report_and_the_wheelhouse(tmp_path):
    """A stand-in pip that writes a report on stdout: the wheelhouse's file costs no download."""
    local = tmp_path / "index" / "numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl"
    other = tmp_path / "index" / "torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl"
    local.parent.mkdir()
    local.write_bytes(b"n" * 300)
    other.write_bytes(b"t" * 5000)
    report = json.dumps(pip_report(local.as_uri(), other.as_uri()))
    fake_python = tmp_path / "python"
    fake_python.write_text(f"#!{sys.executable}\nimport sys\nassert '--dry-run' in sys.argv\nprint({report!r})\n")
    fake_python.chmod(0o755)
    wheels = tmp_path / "wheels"
    assert wheelhouse_files(wheels) == [], "no wheelhouse yet: everything downloads"
    wheels.mkdir()
    (wheels / local.name).write_bytes(b"n" * 300)
    assert wheelhouse_files(wheels) == [local.name]
    estimate = estimate_install(str(fake_python), ["torch==2.14.1", "numpy"], wheelhouse_files(wheels), {})
    assert estimate == InstallEstimate(download_bytes=0, unpack_bytes=5300, copy_bytes=5000), "a file:// index copies"
    failing = tmp_path / "failing"
    failing.write_text(f"#!{sys.executable}\nraise SystemExit(1)\n")
    failing.chmod(0o755)
    assert estimate_install(str(failing), ["torch==2.14.1"], [], {}) is None


def test_pips_own_dry_run_report_has_the_shape_the_estimate_reads(tmp_path):
    """This machine's pip, on a local wheel: the report lists it with its URL (no index needed)."""
    wheel = tmp_path / "demo_pkg-1.0-py3-none-any.whl"
    subprocess.run(
        [sys.executable, "-c", WHEEL_WRITER, str(wheel)],
        check=True,
    )
    estimate = estimate_install(sys.executable, ["--no-index", str(wheel)], [], {"PATH": "/usr/bin:/bin"})
    assert estimate is not None and estimate.unpack_bytes == estimate.copy_bytes == wheel.stat().st_size


WHEEL_WRITER = """
import sys, zipfile
with zipfile.ZipFile(sys.argv[1], "w") as wheel:
    wheel.writestr("demo_pkg/__init__.py", "")
    info = "demo_pkg-1.0.dist-info/"
    wheel.writestr(info + "METADATA", "Metadata-Version: 2.1\\nName: demo-pkg\\nVersion: 1.0\\n")
    wheel.writestr(info + "WHEEL", "Wheel-Version: 1.0\\nGenerator: t\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n")
    wheel.writestr(info + "RECORD", "")
"""


def test_a_measured_install_scales_the_cpu_bound_part_of_the_later_ones_not_their_bytes():
    """torch 2.13.0 from the wheelhouse took 13x its CPU-bound prior (a loaded machine): 2.14.1's
    byte-compiling slows as much, its 2.9 GB of downloading and writing do not."""
    small, big = InstallEstimate(0, 230_000_000), InstallEstimate(2_900_000_000, 2_900_000_000)
    pace = InstallPace()
    assert pace.seconds(big) == big.seconds, "before any install is measured: the priors"
    pace.record(small, 13 * CPU_S + small.bytes_seconds)
    assert pace.seconds(big) == pytest.approx(13 * CPU_S + big.bytes_seconds)
    pace.record(None, 1000.0)  # an install nothing estimated says nothing about the pace
    pace.record(big, CPU_S + big.bytes_seconds)  # an idle machine again
    assert pace.seconds(big) == pytest.approx(7 * CPU_S + big.bytes_seconds)
    quick = InstallPace()
    quick.record(big, 1.0)  # faster than its bytes: the CPU part counts nothing, never less
    assert quick.seconds(big) == pytest.approx(big.bytes_seconds)
