"""A real single-node Slurm cluster for the tests: munged, slurmctld and slurmd on this machine.

Everything lives in one directory (key, sockets, state, logs) on ports the OS picks, so it runs
beside any other cluster on the machine; clients reach it through SLURM_CONF. The node offers two
GPUs as generic resources backed by /dev/null and /dev/zero, so the generated scripts'
`--gpus-per-node` is scheduled for real on a machine without GPUs.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
GPUS = ("/dev/null", "/dev/zero")


def missing_reason() -> str | None:
    """Why a cluster cannot start here, or None when it can."""
    missing = [name for name in (*DAEMONS, "sbatch", "squeue", "scontrol") if shutil.which(name) is None]
    if missing:
        return f"Slurm is not installed ({', '.join(missing)} missing): apt-get install slurm-wlm munge (.ci/run does)"
    if os.geteuid() != 0:
        return "a single-node Slurm with SlurmUser=root needs root"
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


class SlurmCluster:
    """One node, one partition, started in `directory` and stopped by the pids it wrote."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.node = socket.gethostname().split(".")[0]
        self.conf = directory / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

    def start(self, timeout: float = 60) -> None:
        d = self.directory
        d.chmod(0o700)
        for sub in ("state", "spool"):
            (d / sub).mkdir()
        key = d / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self._daemon(
            "munged",
            "--force",
            f"--socket={d / 'munge.sock'}",
            f"--key-file={key}",
            f"--log-file={d / 'munged.log'}",
            f"--pid-file={d / 'munged.pid'}",
            f"--seed-file={d / 'munged.seed'}",
        )
        self.conf.write_text(self._slurm_conf())
        (d / "gres.conf").write_text("".join(f"NodeName={self.node} Name=gpu File={f}\n" for f in GPUS))
        self._daemon("slurmctld", "-i", "-f", str(self.conf))
        self._daemon("slurmd", "-f", str(self.conf))
        deadline = time.monotonic() + timeout
        while self.scontrol("show", "node", self.node, check=False).count("State=IDLE") == 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the Slurm node did not come up in {timeout:.0f} s:\n{self.logs()}")
            time.sleep(0.5)

    def _slurm_conf(self) -> str:
        d = self.directory
        cpus = os.cpu_count() or 1
        return f"""\
ClusterName=torchmatrix-test
SlurmctldHost={self.node}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d / "munge.sock"}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
StateSaveLocation={d / "state"}
SlurmdSpoolDir={d / "spool"}
SlurmctldPidFile={d / "slurmctld.pid"}
SlurmdPidFile={d / "slurmd.pid"}
SlurmctldLogFile={d / "slurmctld.log"}
SlurmdLogFile={d / "slurmd.log"}
NodeName={self.node} CPUs={cpus} RealMemory=1000 Gres=gpu:{len(GPUS)} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""

    def _daemon(self, name: str, *args: str) -> None:
        done = subprocess.run([name, *args], env=self.env, capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"{name} did not start (exit {done.returncode}): {done.stderr.strip()}\n{self.logs()}")

    def scontrol(self, *args: str, check: bool = True) -> str:
        done = subprocess.run(["scontrol", *args], env=self.env, capture_output=True, text=True, timeout=60)
        if check and done.returncode != 0:
            raise RuntimeError(f"scontrol {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def jobs(self) -> dict[str, tuple[str, str]]:
        """Job (or array task, `123_0`) id -> (name, state) for every job the controller still queues."""
        done = subprocess.run(
            ["squeue", "--array", "--noheader", "--format=%i|%j|%T"],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        rows = (line.split("|") for line in done.stdout.splitlines() if line.strip())
        return {job: (name, state) for job, name, state in rows}

    def wait_until(self, predicate, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not predicate(self.jobs()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} within {timeout:.0f} s; queue: {self.jobs()}\n{self.logs()}")
            time.sleep(0.2)

    def logs(self) -> str:
        return "\n".join(
            f"--- {name}.log\n" + "\n".join((self.directory / f"{name}.log").read_text().splitlines()[-15:])
            for name in DAEMONS
            if (self.directory / f"{name}.log").exists()
        )

    def stop(self) -> None:
        """Cancel what is left, then end the daemons by the pids they recorded."""
        if (self.directory / "slurmctld.pid").exists():
            subprocess.run(["scancel", "--user", str(os.geteuid())], env=self.env, capture_output=True, timeout=60)
        for name in reversed(DAEMONS):
            pid_file = self.directory / f"{name}.pid"
            if not pid_file.exists():
                continue
            pid = int(pid_file.read_text().split()[0])
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            deadline = time.monotonic() + 20
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """True while the process runs (a daemon's zombie, left where nothing reaps it, counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"
