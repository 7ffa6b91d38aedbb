"""Build a local stand-in for PyTorch's nightly and test channels from one real torch wheel.

The real channels (download.pytorch.org/whl/nightly/<variant>, .../whl/test/<variant>) cannot be
reached from every machine, so this repacks a torch wheel under channel version strings
(`2.16.0.dev20261201+cpu` on the nightly index, `2.16.0+cpu` on the test index, as PyTorch names
its release candidates there) with a distinct fake `torch.version.git_version` per build, and writes
PEP 503 simple indexes pip reads by file:// URL. `--planted-from DATE` gives every nightly of that
date or later a real bug (torch.optim.Adam without the square root of its second bias correction),
which examples/local_channels/test_adam_step.py detects, so a bisect by date has something to find.

    python examples/local_channels/build_index.py torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl \
        --out /work/local-channels --nightly 20261201 20261202 20261203 --planted-from 20261202 --rc 2.16.0

The wheels are hundreds of MB each: keep them outside the repository.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import html
import re
import zipfile
from pathlib import Path

PLANTED_FILE = "torch/optim/adam.py"
PLANTED_FROM = (
    "            bias_correction2_sqrt = bias_correction2**0.5\n\n            if amsgrad:\n                # Maintains"
)
PLANTED_TO = (
    "            bias_correction2_sqrt = bias_correction2\n\n            if amsgrad:\n                # Maintains"
)


def fake_sha(version: str) -> str:
    """A 40-hex-digit stand-in for the commit a build came from, distinct per version."""
    return hashlib.sha1(version.encode()).hexdigest()


def repack(source: Path, version: str, out_dir: Path, planted: bool) -> Path:
    """`source` rewritten as torch `version`: dist-info renamed, METADATA, torch/version.py, RECORD."""
    old_version = source.name.split("-")[1]
    target = out_dir / source.name.replace(f"-{old_version}-", f"-{version}-", 1)
    old_prefix, new_prefix = f"torch-{old_version}.", f"torch-{version}."
    record_name = f"torch-{version}.dist-info/RECORD"
    rows = []
    with zipfile.ZipFile(source) as zin, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zout:
        for info in zin.infolist():
            name = (
                new_prefix + info.filename[len(old_prefix) :] if info.filename.startswith(old_prefix) else info.filename
            )
            if name == record_name:
                continue
            data = zin.read(info)
            if name == f"torch-{version}.dist-info/METADATA":
                data = re.sub(rb"^Version: .*$", f"Version: {version}".encode(), data, count=1, flags=re.M)
            elif name == "torch/version.py":
                text = data.decode()
                text = re.sub(r"^__version__ = .*$", f"__version__ = '{version}'", text, flags=re.M)
                text = re.sub(r"^git_version = .*$", f"git_version = '{fake_sha(version)}'", text, flags=re.M)
                data = text.encode()
            elif name == PLANTED_FILE and planted:
                text = data.decode()
                if PLANTED_FROM not in text:
                    raise SystemExit(f"{source.name}: {PLANTED_FILE} has no line to plant the bug in")
                data = text.replace(PLANTED_FROM, PLANTED_TO, 1).encode()
            copied = zipfile.ZipInfo(name, info.date_time)
            copied.external_attr = info.external_attr
            zout.writestr(copied, data, zipfile.ZIP_DEFLATED)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            rows.append(f"{name},sha256={digest},{len(data)}")
        rows.append(f"{record_name},,")
        zout.writestr(record_name, "\n".join(rows) + "\n")
    return target


def write_simple_index(channel_dir: Path) -> None:
    """`simple/torch/index.html` listing the channel's wheels, as a PEP 503 index does."""
    project = channel_dir / "simple" / "torch"
    project.mkdir(parents=True, exist_ok=True)
    links = "".join(
        f'<a href="../../{html.escape(wheel.name)}">{html.escape(wheel.name)}</a><br/>\n'
        for wheel in sorted(channel_dir.glob("torch-*.whl"))
    )
    (project / "index.html").write_text(f"<!DOCTYPE html>\n<html><body>\n{links}</body></html>\n")
    (channel_dir / "simple" / "index.html").write_text(
        '<!DOCTYPE html>\n<html><body><a href="torch/">torch</a></body></html>\n'
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheel", type=Path, help="a real torch wheel (pip download torch==2.13.0 --no-deps)")
    parser.add_argument("--out", type=Path, required=True, help="where nightly/ and test/ go")
    parser.add_argument("--nightly", nargs="*", default=[], metavar="YYYYMMDD", help="dates of nightly builds")
    parser.add_argument("--planted-from", metavar="YYYYMMDD", help="nightlies of this date or later carry the bug")
    parser.add_argument("--rc", metavar="VERSION", help="the test channel's release candidate, e.g. 2.16.0")
    parser.add_argument("--base", default="2.16.0", help="the version the nightlies lead up to")
    args = parser.parse_args()
    label = "+" + args.wheel.name.split("-")[1].partition("+")[2] if "+" in args.wheel.name else ""
    builds = [
        ("nightly", f"{args.base}.dev{date}{label}", bool(args.planted_from and date >= args.planted_from))
        for date in args.nightly
    ]
    builds += [("test", f"{args.rc}{label}", False)] if args.rc else []
    for channel, version, planted in builds:
        channel_dir = args.out / channel
        channel_dir.mkdir(parents=True, exist_ok=True)
        wheel = repack(args.wheel, version, channel_dir, planted)
        print(f"{wheel} git_version {fake_sha(version)}{' (planted: Adam bias correction)' if planted else ''}")
    for channel in dict.fromkeys(channel for channel, _, _ in builds):
        write_simple_index(args.out / channel)
        print(f"{channel}: file://{(args.out / channel / 'simple').resolve()}")


if __name__ == "__main__":
    main()
