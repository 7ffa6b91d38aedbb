"""`torchmatrix archive write`: it runs the writer in the release's interpreter, prints what the
manifest says was written and what not (why), and exits 1 when the release wrote nothing."""

from __future__ import annotations

import json
import stat

from torchmatrix import cli
from torchmatrix.exit_codes import ExitCode


def fake_interpreter(tmp_path, written: list[str], not_written: dict[str, str]):
    """An executable that stands for a release's python: it writes the manifest the writer would."""
    manifest = {"torch": "2.7.1", "version": "2.7.1+cu126", "git_version": "e2d141dbde55aa", "written": written}
    manifest["not_written"] = not_written
    script = tmp_path / "python"
    script.write_text(
        "#!/bin/sh\n"
        'while [ "$1" != "--to" ]; do shift; done\n'
        'mkdir -p "$2/2.7.1"\n'
        f"cat > \"$2/2.7.1/manifest.json\" <<'END'\n{json.dumps(manifest)}\nEND\n"
        "echo 'a rank logs this' >&2\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_prints_what_the_release_wrote_and_why_not(tmp_path, capsys):
    python = fake_interpreter(
        tmp_path, ["tp/foreach/sync"], {"hsdp/foreach/sync": "RuntimeError: Cannot use ReduceOp.AVG with Gloo"}
    )
    code = cli.main(
        ["archive", "write", "--torch", "2.7.1", "--python", str(python), "--to", str(tmp_path / "archive")]
    )
    out = capsys.readouterr().out
    assert code == ExitCode.PASSED
    assert "torch 2.7.1+cu126 (e2d141dbde55) wrote 1 form; 1 form it cannot write" in out
    assert "  not written: hsdp/foreach/sync: RuntimeError: Cannot use ReduceOp.AVG with Gloo" in out
    assert (tmp_path / "archive/.logs/2.7.1/write.log").read_text() == "a rank logs this\n"


def test_a_release_that_wrote_nothing_exits_1(tmp_path, capsys):
    python = fake_interpreter(tmp_path, [], {"tp/foreach/sync": "no dcp.async_save in this release"})
    code = cli.main(
        ["archive", "write", "--torch", "2.7.1", "--python", str(python), "--to", str(tmp_path / "archive")]
    )
    assert code == ExitCode.FAILED
    assert "wrote 0 forms; 1 form it cannot write" in capsys.readouterr().out


def test_a_to_that_is_a_file_exits_2(tmp_path, capsys):
    (tmp_path / "archive").write_text("")
    code = cli.main(["archive", "write", "--torch", "2.7.1", "--python", "python", "--to", str(tmp_path / "archive")])
    assert code == ExitCode.USAGE
    assert "is a file, not a directory; pass a directory" in capsys.readouterr().err
