"""The bodies of the nox sessions; noxfile.py only declares them.

Every gpu_matrix session of one nox invocation writes into one run directory, so the report
session finds all torch versions side by side. A torch that fails to install still produces a
report: its cells are recorded as errors carrying pip's output.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from nox.command import CommandFailed

from torchmatrix import file_writes
from torchmatrix.env.component_requirements import install_requirements, use_record
from torchmatrix.env.envdir_lock import (
    EnvdirUnlockable,
    MatrixSession,
    envdir_of,
    lock_envdir,
    reuses_venvs_only,
    runs_matrix_sessions,
)
from torchmatrix.env.install_estimate import InstallEstimate, InstallPace, wheelhouse_files
from torchmatrix.env.self_install import install_arguments
from torchmatrix.env.torch_install import InstallResult, estimate_torch_install, install_torch, wheelhouse
from torchmatrix.env.version_venv import (
    clear_stamp,
    gpu_matrix_python,
    install_record,
    kept_as_installed,
    kept_holding,
    renew,
    stamped_as,
    write_stamp,
)
from torchmatrix.exit_codes import ExitCode
from torchmatrix.matrix.config import Matrix, load_matrix
from torchmatrix.run.progress import format_seconds
from torchmatrix.run.run_directory import check_run_id, new_run_id
from torchmatrix.user_error import UserError

PROJECT = Path(__file__).resolve().parent.parent  # this checkout: its examples, tests and lint only
TORCHTITAN_MINIMAL = PROJECT / "examples" / "torchtitan" / "requirements-minimal.txt"
LIGHTNING = "lightning==2.6.6"  # examples/lightning's [requires], for its test in `nox -s tests` (about 15 s)
ACCELERATE = ("accelerate==1.16.0", "torchdata==0.11.0")  # examples/accelerate's [requires], for its test (about 6 s)
DOCS_REQUIREMENTS = ("mkdocs==1.6.1", "mkdocs-material==9.8.1", "pymdown-extensions==13.1")
INVOCATION_STARTED = time.time()  # the noxfile loads once per nox invocation
_SESSIONS_STARTED: Counter[str] = Counter()
INSTALL_PACE = InstallPace()  # how this invocation's installs went against their estimates


@contextmanager
def exit_on_user_error() -> Iterator[None]:
    """End nox with a `UserError`'s one line and its exit code instead of a traceback."""
    try:
        yield
    except UserError as error:
        print(f"torchmatrix: error: {error}", file=sys.stderr)
        raise SystemExit(error.exit_code) from None


def matrix_or_exit(path: str) -> Matrix:
    """Load matrix.toml for the noxfile; a bad file ends nox with one line and exit code 2."""
    with exit_on_user_error():
        return load_matrix(path)


def run_id_or_exit(given: str | None) -> str:
    """TORCHMATRIX_RUN_ID as a run directory name under reports/ (or a new one); one that would
    leave reports/ ends nox with one line and exit code 2."""
    with exit_on_user_error():
        return check_run_id(given, "TORCHMATRIX_RUN_ID") if given else new_run_id()


def lock_envdir_or_exit(argv: list[str], versions: dict[str, tuple[str, ...]]) -> int | None:
    """When this nox command runs matrix sessions (`versions`: each one's torch versions), hold its
    envdir's matrix lock until nox exits, shared when it only reuses venvs (taken as the noxfile
    loads, before nox touches a venv). A conflicting run ends with exit code 2; a file system
    without flock gets a warning and no lock."""
    import nox

    registered = nox.registry.get()
    matrix_sessions = [
        MatrixSession.parametrized(
            name,
            [v for v in session_versions if v != "system"],
            registered[name].tags if name in registered else (),
        )
        for name, session_versions in versions.items()
    ]
    if not runs_matrix_sessions(argv, matrix_sessions):
        return None
    try:
        with exit_on_user_error():
            return lock_envdir(envdir_of(argv, Path.cwd()), shared=reuses_venvs_only(argv))
    except EnvdirUnlockable as error:
        print(f"torchmatrix: warning: {error}; matrix runs sharing it are not kept apart", file=sys.stderr)
        return None


def gpu_matrix(session, matrix: Matrix, torch_version: str, run_id: str) -> None:
    """Install torch==V as matrix.toml says (checked first, progress on the terminal), this torchmatrix, then run V's cells."""
    install = matrix.install(torch_version)
    session.env.update(install.env)
    reports = matrix.root / "reports"
    run = [
        "python",
        "-m",
        "torchmatrix",
        "run",
        "--config",
        str(matrix.path),
        "--torch",
        torch_version,
        "--run-id",
        run_id,
        "--reports",
        str(reports),
        "--report-follows",
        *invocation_part(session),
    ]
    later = later_versions(session)
    run_dir = reports / run_id
    install_log = run_dir / f"torch-{torch_version}" / "logs" / "install.log"
    created = first_missing(install_log.parent, stop=reports)
    install_log.parent.mkdir(parents=True, exist_ok=True)
    keeps_venvs = getattr(session.virtualenv, "reuse_existing", False)  # read before a renewal turns it off
    kept = kept_as_matrix_asks(session, matrix, torch_version, install_log)
    installs = not kept and installs_run(session)  # False under nox -R, which installs nothing
    if installs:
        renew(session.virtualenv)  # before the forecast runs pip in it
    installing = [v for v in later if not (keeps_venvs and will_be_kept(session, matrix, v))]
    forecast = forecast_installs(session, matrix, ([] if kept else [torch_version]) + installing if later else [])
    install_started = time.time()
    installed = InstallResult(True) if kept else install_all(session, matrix, torch_version, install_log, installs)
    install_took = time.time() - install_started  # before waiting for the forecast, which may take longer
    estimates = forecast.result()
    if torch_version in estimates:
        INSTALL_PACE.record(estimates[torch_version], install_took)
    run += ["--progress-installs-after", installs_after(estimates, later)]
    if not installed.ok:
        run_cells(session, [*run, "--install-log", str(install_log)], run_dir, created, success_codes=[0, 1])
        session.error(
            f"torch=={torch_version} did not install: {installed.reason}; its cells are reported as errors (see {install_log})"
        )
    run_cells(session, run, run_dir, created)


def kept_as_matrix_asks(session, matrix: Matrix, torch_version: str, install_log: Path) -> bool:
    """Whether the session's venv is one nox kept whose stamp says torch, this torchmatrix and
    `[requires]` are installed as matrix.toml says now; then nothing is installed, and the log says so."""
    venv = Path(session.virtualenv.location)
    if kept_as_installed(session.virtualenv, torch_version, install_record(matrix, torch_version)):
        said = f"torch {torch_version}: reusing its venv, installed as matrix.toml says"
        file_writes.write_text(install_log, f"{said}: {venv}\n")
        print(f"torchmatrix: {said} (--reuse-venv=never installs afresh)", flush=True)
        if matrix.requires:
            use_record(session)
        return True
    return False


def install_all(session, matrix: Matrix, torch_version: str, install_log: Path, installs: bool) -> InstallResult:
    """Install torch, this torchmatrix and `[requires]` into the session's venv, and stamp it once all
    of it installed (not where `installs` is False, under `nox -R`, which installs nothing)."""
    venv = Path(session.virtualenv.location)
    if installs:
        clear_stamp(venv)
    install = matrix.install(torch_version)
    installed = install_torch(session, torch_version, install, install_log)
    session.install(*install_arguments())
    failed = {}
    if installed.ok and matrix.requires:
        log = install_log.with_name("requires.log")
        failed = install_requirements(session, matrix.requires, install.constraints, log)
    if installs and installed.ok and not failed:
        write_stamp(venv, install_record(matrix, torch_version))  # the next session and bisect reuse it
    return installed


def installs_run(session) -> bool:
    """False under `nox -R` (or `--no-install` on a kept venv), where nox skips every install."""
    return session.run_install("python", "--version", silent=True, log=False) is not None


def will_be_kept(session, matrix: Matrix, version: str) -> bool:
    """Whether the venv of a later gpu_matrix session of torch `version` already holds what
    matrix.toml asks, so that session will install nothing."""
    python = gpu_matrix_python(Path(session.virtualenv.location).parent, version)
    return python is not None and stamped_as(python.parent.parent, version, install_record(matrix, version))


def run_cells(
    session, command: list[str], run_dir: Path, created: Path | None, success_codes: list[int] | None = None
) -> None:
    """`torchmatrix run` (with the session's arguments), then the report session over `run_dir`.

    Exit code 2 means the runner said in one line what to change and wrote no reports: the
    directories this session `created` for them go, nox ends with exit code 2 and says nothing
    more, and no report session follows to fail on an empty run directory.
    """
    nox_logger = logging.getLogger("nox")
    usage_exit = UsageExitFilter()
    nox_logger.addFilter(usage_exit)
    try:
        session.run(*command, *session.posargs, success_codes=success_codes or [0])
    except CommandFailed as failed:
        if failed.return_code != ExitCode.USAGE:
            session.notify("report", [str(run_dir)])
            raise
        if created:
            shutil.rmtree(created, ignore_errors=True)
        raise SystemExit(ExitCode.USAGE) from None
    finally:
        nox_logger.removeFilter(usage_exit)
    session.notify("report", [str(run_dir)])


def first_missing(directory: Path, stop: Path) -> Path | None:
    """The outermost directory between `stop` (excluded) and `directory` that does not exist yet:
    what creating `directory` adds, and all a failed session may remove."""
    missing = None
    for path in [directory, *directory.parents]:
        if path == stop or stop not in path.parents:
            break
        if not path.exists():
            missing = path
    return missing


def invocation_part(session) -> list[str]:
    """`--progress-part K/N --progress-since T`: this session is the K-th of the N sessions of its
    name that this nox invocation runs, so the runner's [k/N] count and ETA continue across
    torch versions instead of restarting. Reads nox's queue (nox >= 2026.7.11)."""
    name = session._runner.name
    _SESSIONS_STARTED[name] += 1
    queued = sum(
        1 for runner, selected in session._runner.manifest.list_all_sessions() if selected and runner.name == name
    )
    index = _SESSIONS_STARTED[name]
    return ["--progress-part", f"{index}/{index + queued}", "--progress-since", f"{INVOCATION_STARTED:.3f}"]


def later_versions(session) -> list[str]:
    """The torch versions of the sessions of this one's name still queued in this nox invocation."""
    name = session._runner.name
    return [
        runner.func.call_spec["torch"]
        for runner, selected in session._runner.manifest.list_all_sessions()
        if selected and runner.name == name and "torch" in getattr(runner.func, "call_spec", {})
    ]


def forecast_installs(session, matrix: Matrix, versions: list[str]) -> Future[dict[str, InstallEstimate | None]]:
    """Each of `versions`' install estimated from what pip would fetch (install_estimate), asked
    in a thread while this session installs (this session's own, when it is one of them, sets
    the pace of the later ones; without later ones nothing is asked); the wheelhouses are listed
    first, so what this install downloads still counts. uv installs are not estimated (None);
    venvs that nox reuses (-R) install nothing (left out)."""
    python = str(Path(session.virtualenv.location) / "bin" / "python")
    uv = getattr(session, "venv_backend", "virtualenv") == "uv"
    if reuses_venvs_only(sys.argv) and getattr(session.virtualenv, "_reused", False):
        versions = []
    cached = {version: wheelhouse_files(wheelhouse(version, matrix.install(version))) for version in versions}

    def estimates() -> dict[str, InstallEstimate | None]:
        return {
            version: None if uv else estimate_torch_install(python, version, matrix.install(version), cached[version])
            for version in versions
        }

    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="install-estimate")
    future = pool.submit(estimates)
    pool.shutdown(wait=False)
    return future


def installs_after(estimates: dict[str, InstallEstimate | None], versions: list[str]) -> str:
    """`--progress-installs-after`: the seconds the installs of `versions` will take at this
    invocation's pace, one line each on the terminal; 'unknown' when one is not estimated."""
    total = 0.0
    for version in versions:
        if version not in estimates:
            continue  # a venv nox reuses
        estimate = estimates[version]
        if estimate is None:
            print(
                f"torchmatrix: torch {version}'s install is not estimated: pip did not say what it fetches",
                file=sys.stderr,
            )
            return "unknown"
        seconds = INSTALL_PACE.seconds(estimate)
        print(
            f"torchmatrix: torch {version}, to install later: {estimate.describe()}, about {format_seconds(seconds)} at this machine's pace",
            file=sys.stderr,
        )
        total += seconds
    return f"{total:.0f}"


def hf_llama_matrix() -> Matrix:
    """examples/hf_llama/matrix.toml: the suites on a tiny Hugging Face Llama."""
    return matrix_or_exit(str(PROJECT / "examples" / "hf_llama" / "matrix.toml"))


def hf_matrix(session, torch_version: str, run_id: str) -> None:
    """gpu_matrix over the Hugging Face example, with transformers installed (its components
    import from its own directory and torchmatrix.models)."""
    session.install("transformers")
    gpu_matrix(session, hf_llama_matrix(), torch_version, run_id)


def optimizers_matrix() -> Matrix:
    """examples/optimizers/matrix.toml: the ecosystem's precision-aware optimizers on the suites."""
    return matrix_or_exit(str(PROJECT / "examples" / "optimizers" / "matrix.toml"))


def optim_matrix(session, torch_version: str, run_id: str) -> None:
    """gpu_matrix over the third-party optimizers (torchao, torch-optimi, bitsandbytes, installed
    per component from its `[requires]`)."""
    gpu_matrix(session, optimizers_matrix(), torch_version, run_id)


def torchtitan_matrix() -> Matrix:
    """examples/torchtitan/matrix.toml: the suites on torchtitan's own model, parallelize and checkpointer."""
    return matrix_or_exit(str(PROJECT / "examples" / "torchtitan" / "matrix.toml"))


def titan_matrix(session, torch_version: str, run_id: str) -> None:
    """gpu_matrix over the torchtitan example (torchtitan and triton installed from its
    `[requires]`; its adapters import from its own directory)."""
    gpu_matrix(session, torchtitan_matrix(), torch_version, run_id)


def lightning_fabric_matrix() -> Matrix:
    """examples/lightning/matrix.toml: the suites on a Lightning Fabric stack as a Fabric user writes it."""
    return matrix_or_exit(str(PROJECT / "examples" / "lightning" / "matrix.toml"))


def lightning_matrix(session, torch_version: str, run_id: str) -> None:
    """gpu_matrix over the Lightning example (lightning installed from its `[requires]`; its adapters
    import from its own directory)."""
    gpu_matrix(session, lightning_fabric_matrix(), torch_version, run_id)


def accelerate_hf_matrix() -> Matrix:
    """examples/accelerate/matrix.toml: the suites on a Hugging Face accelerate stack with its FSDP2 plugin."""
    return matrix_or_exit(str(PROJECT / "examples" / "accelerate" / "matrix.toml"))


def accelerate_matrix(session, torch_version: str, run_id: str) -> None:
    """gpu_matrix over the accelerate example (accelerate and torchdata installed from its `[requires]`;
    its adapters import from its own directory)."""
    gpu_matrix(session, accelerate_hf_matrix(), torch_version, run_id)


def report(session, matrix: Matrix) -> None:
    """Each version's reads of the other versions' checkpoints (`cross-read`), then a run directory's
    reports (default: reports/latest beside matrix.toml); the session fails when the upgrade diff is not
    clean, as `compare` does. With `-- --compare RUN`, diff it against RUN."""
    parser = argparse.ArgumentParser(prog="nox -s report --")
    parser.add_argument("run_dir", nargs="?", default=str(matrix.root / "reports" / "latest"))
    parser.add_argument("--compare", metavar="RUN", help="a reference run directory or results.json")
    args = parser.parse_args(session.posargs)
    install_report_tools(session)
    envdir = Path(session.virtualenv.location).parent
    read = ["cross-read", args.run_dir, "--config", str(matrix.path), "--envdir", str(envdir)]
    session.run("python", "-m", "torchmatrix", *read, success_codes=[0, 1])
    session.run("python", "-m", "torchmatrix", "report", args.run_dir, "--check-upgrade")
    if args.compare:
        out = Path(args.run_dir) / f"compare-{Path(args.compare).resolve().name}.md"
        session.run("python", "-m", "torchmatrix", "compare", args.compare, args.run_dir, "--out", str(out))


def install_report_tools(session) -> None:
    """Install this torchmatrix and nox (cross-read finds gpu_matrix's venvs by nox's own naming) into the
    report session's venv, unless nox kept it and its stamp says it holds them: every `nox -s gpu_matrix`
    ends in this session, and pip took seconds of each for nothing."""
    record = {"report": [*install_arguments(), "nox"]}
    if kept_holding(session.virtualenv, record):
        return
    installs = installs_run(session)  # False under nox -R, which installs nothing
    if installs:
        renew(session.virtualenv)  # a kept venv whose stamp differs is made anew, its stamp gone with it
    session.install(*install_arguments(), "nox")
    if installs:
        write_stamp(Path(session.virtualenv.location), record)


def merge(session) -> None:
    """Merge report directories (shards, jobs, versions): `nox -s merge -- DIR... --out DIR`."""
    session.install(*install_arguments())
    session.run("python", "-m", "torchmatrix", "merge", *session.posargs)


def sensitivity(session, matrix: Matrix) -> None:
    """`python -m torchmatrix sensitivity` on the baseline torch: which generic mutants of the
    configured components the suites catch; the session fails when one is missed."""
    torch = [] if matrix.baseline == "system" else [f"torch=={matrix.baseline}", "numpy"]
    session.install(*install_arguments(), *torch)
    session.run(
        "python", "-m", "torchmatrix", "sensitivity", "--config", str(matrix.path), "--torch", matrix.baseline,
        *session.posargs,
    )  # fmt: skip


def bisect(session, matrix: Matrix) -> None:
    """`python -m torchmatrix bisect` from a venv with this torchmatrix; its steps install torch
    versions into gpu_matrix's venvs in this same envdir (under the envdir's matrix lock), with
    nox's own virtualenv code, so nox goes in beside it."""
    session.install(*install_arguments(), "nox")
    envdir = Path(session.virtualenv.location).parent
    session.run(
        "python", "-m", "torchmatrix", "bisect", "--config", str(matrix.path), "--envdir", str(envdir), *session.posargs
    )


def tests(session, torch_version: str, *, fast: bool = False) -> None:
    """The project's own tests, in parallel with pytest-xdist, against the baseline torch; ``fast``
    leaves out the tests marked slow (rank processes, whole runs), the lane a developer runs first.
    torchtitan for tests/suites/test_torchtitan_example.py is its minimal set, --no-deps (30 s, not
    2.5 min); lightning and accelerate for tests/suites/test_lightning_example.py and
    test_accelerate_example.py (full lane only). The full lane gives
    each test file whole to one worker (``--dist loadscope``), so a run its tests share (a module-scoped
    fixture) is made once, not once per worker, in tests/conftest.py's order (the longest files first);
    the fast lane spreads single tests (its shared fixtures are cheap, and whole files would hold its
    longest file on one worker). The 25 slowest tests are listed at the end, so a CI log shows where
    its time went."""
    torch = [] if torch_version == "system" else [f"torch=={torch_version}", "numpy"]
    session.install("-e", f"{PROJECT}[test]", *torch)
    session.install("--no-deps", "-r", str(TORCHTITAN_MINIMAL))
    if not fast:
        session.install(LIGHTNING, *ACCELERATE, *torch)  # torch named again: resolving them keeps the baseline
    lane = ["-m", "not slow"] if fast else ["--dist", "loadscope", "--no-loadscope-reorder"]
    session.run("python", "-m", "pytest", "-n", "auto", "--durations=25", *lane, *session.posargs)


def lint(session) -> None:
    """ruff's lint rules and formatting over the whole project (config in pyproject.toml)."""
    session.install("ruff")
    session.run("ruff", "check", str(PROJECT))
    session.run("ruff", "format", "--check", str(PROJECT))


def docs(session) -> None:
    """The documentation site, built with every warning an error: a broken link or anchor, a missing
    page, a reference table whose code fails to render. torchmatrix is installed because the pages'
    reference tables are rendered from it (docs/hooks/generated.py)."""
    session.install(*DOCS_REQUIREMENTS, *install_arguments())
    session.run(
        "mkdocs", "build", "--strict", "--clean", "--config-file", str(PROJECT / "mkdocs.yml"), *session.posargs
    )


def cli(session, command: str) -> None:
    """`python -m torchmatrix COMMAND` from a venv that has this torchmatrix installed (nox's own
    environment may lack its dependencies): the documented commands work from its set-up."""
    session.install(*install_arguments())
    session.run("python", "-m", "torchmatrix", *([command] if command else []), *session.posargs)


class UvProbeFilter(logging.Filter):
    """Drops nox's "uv binary not found." line: nox probes for uv before creating any venv, even
    with the virtualenv backend this project uses, and says so on every session."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != "uv binary not found."


class UsageExitFilter(logging.Filter):
    """Drops nox's "Command … failed with exit code 2" while `torchmatrix run` runs: the runner
    has already said in one line what to change, and nox then ends with exit code 2."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith("Command ") and message.endswith(f"failed with exit code {int(ExitCode.USAGE)}"))


def quiet_uv_probe() -> None:
    """Install UvProbeFilter on nox's logger."""
    logging.getLogger("nox").addFilter(UvProbeFilter())
