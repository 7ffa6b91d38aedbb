"""Torch versions as matrix.toml spells them: what pip accepts and is a plain file name, and the
nearest valid spelling of a typo."""

from __future__ import annotations

import pytest

from torchmatrix.matrix.torch_versions import is_torch_version, nearest_spelling


@pytest.mark.parametrize("text", ["system", "2.13.0", "2.13", "2.13.0+cu121", "2.13.0rc1", "2.13.0.dev20260101"])
def test_pip_versions_and_system_are_accepted(text):
    assert is_torch_version(text)


@pytest.mark.parametrize(
    "typo, nearest",
    [
        ("2.13.0cu121", "2.13.0+cu121"),
        ("2.13.0-cu121", "2.13.0+cu121"),
        ("2.13.0_cpu", "2.13.0+cpu"),
        ("v2.14.1", "2.14.1"),
        (" 2.13.0 ", "2.13.0"),
        ("latest", None),
        ("../2.13.0", None),
    ],
)
def test_a_typo_is_refused_with_the_nearest_valid_spelling(typo, nearest):
    assert not is_torch_version(typo)
    assert nearest_spelling(typo) == nearest


def test_a_version_that_is_not_a_file_name_is_refused_though_pip_reads_it():
    assert not is_torch_version("2.13.0+cu121 ") and not is_torch_version(2.13)
