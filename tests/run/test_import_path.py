"""The component check and the pytest processes of a run see one sys.path: the matrix directory first."""

from __future__ import annotations

import os
import subprocess
import sys

from torchmatrix.run.import_path import user_code_environment


def test_the_matrix_directory_comes_first_and_inherited_entries_stay(tmp_path):
    env = user_code_environment(tmp_path, {"PYTHONPATH": os.pathsep.join(["/a", "", "/b"]), "HOME": "/h"})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(tmp_path), "/a", "/b"]
    assert env["HOME"] == "/h"


def test_a_process_started_elsewhere_imports_the_users_package(tmp_path):
    (tmp_path / "mystack").mkdir()
    (tmp_path / "mystack" / "__init__.py").write_text("WHERE = 'matrix dir'\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run(
        [sys.executable, "-c", "import mystack; print(mystack.WHERE)"],
        cwd=elsewhere,
        env=user_code_environment(tmp_path, {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}),
        capture_output=True,
        text=True,
    )
    assert done.stdout.strip() == "matrix dir", done.stderr
