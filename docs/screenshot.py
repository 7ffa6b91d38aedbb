"""Regenerates the documentation's screenshot of the summary page from a real run: the cells this
checkout's matrix.toml selects under the filters (by default the world_size=1 ones) on the torch
installed here, their report, and summary.html as headless Chromium renders it.

    python docs/screenshot.py [--only world_size=1] [--out docs/images/summary.png]

Needs this project installed with its test extra (selenium) and Debian's chromium and chromium-driver.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RUN_ID = "docs-screenshot"
WINDOW = (1280, 1000)  # the totals and the grid, as a reader first sees the page


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", default=None, metavar="AXIS=V1,V2", help="as for torchmatrix run")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "images" / "summary.png")
    args = parser.parse_args()
    chromium, chromedriver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and chromedriver):
        print("docs/screenshot.py: needs chromium and chromedriver: apt-get install chromium chromium-driver")
        return 2
    with tempfile.TemporaryDirectory() as reports:
        run_dir = real_run(Path(reports), args.only or ["world_size=1"])
        screenshot(run_dir / "summary.html", args.out, chromium, chromedriver)
    print(f"wrote {args.out}")
    return 0


def real_run(reports: Path, only: list[str]) -> Path:
    """Runs the selected cells and writes their report; a run with failures is still a page to show."""
    filters = [argument for value in only for argument in ("--only", value)]
    torchmatrix = [sys.executable, "-m", "torchmatrix"]
    run = [*torchmatrix, "run", "--torch", "system", *filters, "--reports", str(reports), "--run-id", RUN_ID]
    done = subprocess.run(run, cwd=REPO)
    if done.returncode not in (0, 1):
        sys.exit(done.returncode)
    subprocess.run([*torchmatrix, "report", str(reports / RUN_ID)], cwd=REPO, check=True)
    return reports / RUN_ID


def screenshot(page: Path, out: Path, chromium: str, chromedriver: str) -> None:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--force-device-scale-factor=1"):
        options.add_argument(flag)
    driver = webdriver.Chrome(options=options, service=Service(chromedriver))
    try:
        driver.set_window_size(*WINDOW)
        driver.get(page.as_uri())
        out.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(out))
    finally:
        driver.quit()


if __name__ == "__main__":
    sys.exit(main())
