"""A demo suite for the Slurm tests, its matrix, and stand-ins for sbatch, srun and nox that run a
job's script on this machine."""

from __future__ import annotations

from helpers.matrix_files import matrix_toml


def slurm_matrix(version: str) -> str:
    """Two world sizes by two flavours of one demo suite, for the given torch."""
    return matrix_toml(
        torch=[version], axes={"world_size": [1, 2], "flavor": ["a", "b"]}, suites={"demo": {"timeout": 60}}
    )


DEMO = """
import torch
import torch.distributed as dist


def _sum_of_ranks():
    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)
    return value.item()


def test_all_reduce(cell, ranks):
    n = cell.world_size
    assert ranks.run(_sum_of_ranks) == [n * (n + 1) / 2] * n


def test_launcher_world_matches_the_cell(cell, ranks):
    assert len(ranks.run(_sum_of_ranks)) == cell.world_size
"""

STAND_INS = {
    "sbatch": """
        import itertools, os, re, subprocess, sys
        script = sys.argv[-1]
        text = open(script).read()
        directives = dict(re.findall(r"^#SBATCH --([\\w-]+)=(.*)$", text, re.M))
        counter = os.path.join(os.environ["FAKE_SLURM_STATE"], "next-job-id")
        job = int(open(counter).read()) if os.path.exists(counter) else 100
        open(counter, "w").write(str(job + 1))
        dependency = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--dependency=")), "")
        with open(os.path.join(os.environ["FAKE_SLURM_STATE"], "submitted"), "a") as log:
            log.write(f"{job} {os.path.basename(script)} {dependency}\\n")
        first, last = map(int, directives["array"].split("-")) if "array" in directives else (None, None)
        for task in ([None] if first is None else range(first, last + 1)):
            env = dict(os.environ, SLURM_JOB_ID=f"{job}{task or ''}", SLURM_ARRAY_JOB_ID=str(job), SLURM_JOB_NAME=directives["job-name"],
                       SLURM_JOB_NODELIST="node[1-4]", SLURM_NNODES=directives["nodes"])
            if task is not None:
                env["SLURM_ARRAY_TASK_ID"] = str(task)
            with open(os.path.join(os.environ["FAKE_SLURM_STATE"], f"{job}-{task}.out"), "w") as output:
                subprocess.run(["bash", script], cwd=directives["chdir"], env=env, stdout=output, stderr=subprocess.STDOUT)
        print(job)
    """,
    "srun": """
        import os, subprocess, sys
        args = sys.argv[1:]
        nodes = 1
        while args and args[0].startswith("--"):
            if args[0].startswith("--nodes="):
                nodes = int(args[0].split("=", 1)[1])
            args = args[1:]
        procs = [subprocess.Popen(args, env=dict(os.environ, SLURM_NODEID=str(n), SLURM_PROCID=str(n))) for n in range(nodes)]
        sys.exit(max(p.wait() for p in procs))
    """,
    "scontrol": """
        print("127.0.0.1")
    """,
    "nox": """
        import os, subprocess, sys
        args = sys.argv[1:]
        if "--install-only" in args:
            sys.exit(0)
        posargs = args[args.index("--") + 1:] if "--" in args else []
        session = args[args.index("-s") + 1]
        command = [sys.executable, "-m", "torchmatrix"]
        if session.startswith("gpu_matrix(torch="):
            version = session.split("'")[1]
            command += ["run", "--torch", version, "--run-id", os.environ["TORCHMATRIX_RUN_ID"], "--reports", "reports"]
        else:
            command += [session]
        sys.exit(subprocess.run(command + posargs).returncode)
    """,
}
