"""Which torch release an environment has: its build's version, or the distribution pip installed."""

from __future__ import annotations

from torchmatrix.env.devices import Environment, probe


def environment(torch: str, release: str) -> Environment:
    return Environment(torch=torch, git_version="", cuda_version=None, gpu_count=0, gpu_name="", release=release)


def test_a_release_is_the_builds_version_or_the_installed_distributions():
    assert environment("2.13.0+cpu", "2.13.0+cpu").has_release("2.13.0")
    assert environment("2.13.0+cpu", "2.95.0").has_release("2.95.0")  # a wheel whose build reports another number
    assert not environment("2.13.0+cpu", "2.13.0+cpu").has_release("2.14.1")
    assert not environment("2.13.0+cpu", "").has_release("")  # a torch pip did not install names no release


def test_the_probe_reports_the_distribution_pip_installed():
    from importlib import metadata

    found = probe()
    assert found.release == metadata.version("torch") and found.has_release(found.base_version)
