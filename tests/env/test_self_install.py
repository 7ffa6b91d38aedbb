"""Each torch venv gets the same torchmatrix the runner imports, however it was installed."""

from __future__ import annotations

import json

from torchmatrix.env.self_install import arguments_for, install_arguments

from helpers.checkout import REPO


def test_a_checkout_installs_editable(tmp_path):
    (tmp_path / "pyproject.toml").write_text("")
    (tmp_path / "suites").mkdir()
    assert arguments_for(tmp_path, None, "0.1.0") == ["-e", str(tmp_path)]


def test_this_checkout_installs_itself_editable():
    assert install_arguments() == ["-e", str(REPO)]


def test_an_install_from_a_path_reinstalls_from_that_path(tmp_path):
    direct_url = json.dumps({"url": "file:///home/me/torchmatrix", "dir_info": {}})
    assert arguments_for(tmp_path, direct_url, "0.1.0") == ["torchmatrix @ file:///home/me/torchmatrix"]


def test_an_editable_install_of_another_tree_stays_editable(tmp_path):
    direct_url = json.dumps({"url": "file:///home/me/my%20torchmatrix", "dir_info": {"editable": True}})
    assert arguments_for(tmp_path, direct_url, "0.1.0") == ["-e", "/home/me/my torchmatrix"]


def test_a_git_install_pins_the_commit_it_got(tmp_path):
    direct_url = json.dumps(
        {
            "url": "https://github.com/org/torchmatrix.git",
            "vcs_info": {"vcs": "git", "commit_id": "0123abcd", "requested_revision": "main"},
        }
    )
    assert arguments_for(tmp_path, direct_url, "0.1.0") == [
        "torchmatrix @ git+https://github.com/org/torchmatrix.git@0123abcd"
    ]


def test_an_archive_install_reinstalls_that_archive(tmp_path):
    direct_url = json.dumps({"url": "https://example.org/torchmatrix-0.1.0.tar.gz", "archive_info": {}})
    assert arguments_for(tmp_path, direct_url, "0.1.0") == [
        "torchmatrix @ https://example.org/torchmatrix-0.1.0.tar.gz"
    ]


def test_an_index_install_pins_its_version(tmp_path):
    assert arguments_for(tmp_path, None, "0.1.0") == ["torchmatrix==0.1.0"]
