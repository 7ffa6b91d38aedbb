"""matrix.toml validation: every malformed file gives one line naming the file, the key and the fix."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from torchmatrix.matrix.builtin_suites import BUILTIN_SUITES, builtin_suite_path
from torchmatrix.matrix.config import ConfigError, load_matrix

GOOD = """
[torch]
versions = ["2.13.0", "2.14.1"]
baseline = "2.13.0"

[axes]
world_size = [1, 2]
fsdp = ["none", "fsdp2"]

[suites.demo]
path = "suites/test_demo.py"
timeout = 30
axes = ["world_size"]
"""

# (matrix.toml text, substrings the one-line error must contain)
MALFORMED = [
    ("[torch\nversions = 1", ["not valid TOML"]),
    (GOOD + "\n[extra]\nx = 1\n", ["extra: unknown key", "use one of"]),
    (GOOD.replace('[torch]\nversions = ["2.13.0", "2.14.1"]\nbaseline = "2.13.0"', ""), ["torch: missing"]),
    (GOOD.replace('versions = ["2.13.0", "2.14.1"]', "versions = []"), ["torch.versions", "non-empty array"]),
    (GOOD.replace('versions = ["2.13.0", "2.14.1"]', 'versions = "2.13.0"'), ["torch.versions", "non-empty array"]),
    (
        GOOD.replace('versions = ["2.13.0", "2.14.1"]', 'versions = ["2.13.0", "latest"]'),
        ["torch.versions[1]", "'latest' is not a PEP 440 torch version", 'such as "2.13.0"'],
    ),
    (
        GOOD.replace('versions = ["2.13.0", "2.14.1"]', 'versions = ["2.13.0cu121", "2.14.1"]'),
        ["torch.versions[0]", "'2.13.0cu121' is not a PEP 440", 'did you mean "2.13.0+cu121"?'],
    ),
    (
        GOOD.replace('versions = ["2.13.0", "2.14.1"]', 'versions = ["2.13.0", "2.13.0"]'),
        ["torch.versions", "listed twice"],
    ),
    (GOOD.replace('baseline = "2.13.0"', 'baseline = "2.12.0"'), ["torch.baseline", "not among versions"]),
    (GOOD.replace('baseline = "2.13.0"', 'baseline = "2.13.0"\npin = "x"'), ["torch.pin", "unknown key"]),
    (GOOD.replace("world_size = [1, 2]", "world_size = []"), ["axes.world_size", "has no values"]),
    (GOOD.replace("world_size = [1, 2]", "world_size = 2"), ["axes.world_size", "must be an array"]),
    (GOOD.replace("world_size = [1, 2]", "world_size = [1, 1]"), ["axes.world_size", "listed twice"]),
    (GOOD.replace("world_size = [1, 2]", "world_size = [0, 2]"), ["axes.world_size[0]", "not a world size"]),
    (GOOD.replace("world_size = [1, 2]", 'world_size = ["two"]'), ["axes.world_size[0]", "not a world size"]),
    (
        GOOD.replace('fsdp = ["none", "fsdp2"]', 'fsdp = ["none", "../../etc"]'),
        ["axes.fsdp[1]", "not a valid axis value"],
    ),
    (GOOD.replace('fsdp = ["none", "fsdp2"]', 'fsdp = ["none", "/abs"]'), ["axes.fsdp[1]", "not a valid axis value"]),
    (GOOD.replace('fsdp = ["none", "fsdp2"]', 'Fsdp = ["none"]'), ["axes.Fsdp", "lower-case identifiers"]),
    (GOOD.replace('fsdp = ["none", "fsdp2"]', 'fsdp = [["none"]]'), ["axes.fsdp[0]", "not a valid axis value"]),
    (GOOD + '\n[[exclude]]\nattn = "sdpa"\n', ["exclude[0].attn", "is not an axis"]),
    (GOOD + '\n[[exclude]]\nfsdp = "fsdp3"\n', ["exclude[0].fsdp", "'fsdp3' is not a value of [axes].fsdp"]),
    (GOOD + "\n[[exclude]]\n", ["exclude[0]", "is empty"]),
    ('exclude = "fsdp"\n' + GOOD, ["exclude", "array of tables"]),
    (GOOD + '\n[[include]]\noptimizer = "adamw"\n', ["include[0].optimizer", "is not an axis"]),
    (GOOD + '\n[[include]]\nfsdp = ["fsdp1", "fsdp2"]\n', ["include[0].fsdp", "single value"]),
    (GOOD + '\n[[include]]\nfsdp = "fsdp1"\n[[include]]\nfsdp = "fsdp1"\n', ["would share the id", "fsdp1"]),
    (
        GOOD.replace('path = "suites/test_demo.py"', 'path = "suites/missing.py"'),
        ["suites.demo.path", "not a Python file"],
    ),
    (
        GOOD.replace('path = "suites/test_demo.py"', 'path = "../outside/test_demo.py"'),
        ["suites.demo.path", "leaves the project directory", "name a built-in suite without path", "[project] root"],
    ),
    (GOOD.replace('path = "suites/test_demo.py"', 'path = "/etc/passwd"'), ["suites.demo.path", "is absolute"]),
    (GOOD.replace('path = "suites/test_demo.py"', "path = 3"), ["suites.demo.path", "not a non-empty string"]),
    (
        GOOD.replace('path = "suites/test_demo.py"\n', ""),
        ["suites.demo", "no path, and 'demo' is not a built-in suite (collectives, grad_ckpt,", 'add path = "suites/'],
    ),
    (GOOD.replace("timeout = 30", "timeout = -1"), ["suites.demo.timeout", "not a positive number"]),
    (GOOD.replace("timeout = 30", 'timeout = "30s"'), ["suites.demo.timeout", "not a positive number"]),
    (GOOD.replace('axes = ["world_size"]', 'axes = ["optimizer"]'), ["suites.demo.axes", "'optimizer' is not an axis"]),
    (GOOD.replace("timeout = 30", "timeout = 30\nretries = 2"), ["suites.demo.retries", "unknown key"]),
    (GOOD.replace("[suites.demo]", "[suites.Demo]"), ["suites.Demo", "lower-case identifiers"]),
    (GOOD + '\n[components]\nmodel = "models/transformer.py"\n', ["components.model", "not an import path"]),
    (GOOD + "\n[[exclude]]\nworld_size = [1, 2]\n", ["every cell is excluded"]),
    (GOOD + "\n[report]\ndrift_ratio = 0\n", ["report.drift_ratio", "not a positive number"]),
    (GOOD + '\n[torch.install."2.15.0"]\nindex_url = "https://x/"\n', ['torch.install."2.15.0"', "add it to versions"]),
    (GOOD + '\n[torch.install."2.14.1"]\nindex = "https://x/"\n', ['torch.install."2.14.1".index', "unknown key"]),
    (GOOD + '\n[torch.install."2.14.1"]\nindex_url = "download.pytorch.org"\n', ["index_url", "not an index URL"]),
    (GOOD + '\n[torch.install."2.14.1"]\nrequirements = "numpy"\n', ["requirements", "must be an array"]),
    (
        GOOD + '\n[torch.install."2.14.1"]\nrequirements = ["numpy<<2"]\n',
        ["requirements[0]", "not a pip requirement"],
    ),
    (
        GOOD + '\n[torch.install."2.14.1"]\nconstraints = ["torch==2.14.0"]\n',
        ["constraints[0]", "names torch", "versions instead"],
    ),
    (GOOD + '\n[torch.install."2.14.1"]\nenv = { "A-B" = "1" }\n', ["env.A-B", "environment variable name"]),
    (GOOD + '\n[torch.install."2.14.1"]\nenv = { A = 1 }\n', ["env.A", "set to a string"]),
    (GOOD.replace('baseline = "2.13.0"', 'baseline = "2.13.0"\ninstall = 3'), ["torch.install", "must be a table"]),
    (GOOD + '\n[requires]\noptimizer_x = ["torchao"]\n', ["requires.optimizer_x", "not a [components] key"]),
    (
        GOOD + '\n[components]\noptimizer_x = "m:f"\n[requires]\noptimizer_x = "torchao"\n',
        ["requires.optimizer_x", "must be an array"],
    ),
    (
        GOOD + '\n[components]\noptimizer_x = "m:f"\n[requires]\noptimizer_x = ["torchao>>1"]\n',
        ["requires.optimizer_x[0]", "not a pip requirement"],
    ),
    (
        GOOD + '\n[components]\noptimizer_x = "m:f"\n[requires]\noptimizer_x = ["torch>=2"]\n',
        ["requires.optimizer_x[0]", "names torch"],
    ),
    (GOOD + '\n[components]\nm = "m:f"\n[requires.m]\nx = 1\n', ["requires.m", "must be an array"]),
    (
        GOOD + "\n[optional]\noptimizer_x = true\n",
        ["optional.optimizer_x", "not a [components] key", "name a component"],
    ),
    (
        GOOD + '\n[components]\nm = "m:f"\n[optional]\nm = false\n',
        ["optional.m", "False is not where the component is optional", "write true (anywhere)"],
    ),
    (GOOD + '\n[components]\nm = "m:f"\n[optional]\nm = {}\n', ["optional.m", "write true (anywhere)"]),
    (
        GOOD + '\n[components]\nm = "m:f"\n[optional]\nm = { device = ["gpu"] }\n',
        ["optional.m.device[0]", "'gpu' is not a device type", "use one of: cpu, cuda"],
    ),
    (
        GOOD + '\n[components]\nm = "m:f"\n[optional]\nm = { device = "cpu" }\n',
        ["optional.m.device", "not a non-empty array", 'write e.g. device = ["cpu"]'],
    ),
    (
        GOOD + '\n[components]\nm = "m:f"\n[optional]\nm = { torch = ["2.12.0"] }\n',
        ["optional.m.torch[0]", "'2.12.0' is not a version in [torch].versions", "use one of: 2.13.0, 2.14.1"],
    ),
    (
        GOOD + '\n[components]\nm = "m:f"\n[optional]\nm = { devices = ["cpu"] }\n',
        ["optional.m.devices", "unknown key in [optional].m", "use one of: device, torch"],
    ),
    (
        GOOD.replace('fsdp = ["none", "fsdp2"]', 'fsdp = ["none", "fsdp2"]\nmesh = ["flat", "hsdp"]'),
        [
            "axes.mesh",
            "cell ws1-none-hsdp",
            "needs an even world_size of at least 4",
            'add [[exclude]] mesh = ["hsdp"], world_size = [1, 2]',
        ],
    ),
    (
        GOOD.replace('fsdp = ["none", "fsdp2"]', 'fsdp = ["none", "fsdp2"]\nmesh = ["flat", "2d"]'),
        ["axes.mesh", "cell ws1-none-2d", "mesh='2d' is not a mesh", "use one of flat, hsdp, fsdp_tp"],
    ),
    (
        GOOD.replace("world_size = [1, 2]", "world_size = [4]").replace(
            'fsdp = ["none", "fsdp2"]', 'fsdp = ["none", "fsdp2"]\nmesh = ["flat", "fsdp_tp"]'
        ),
        [
            "cell ws4-none-fsdp_tp",
            "needs fsdp='fsdp2', not 'none'",
            'add [[exclude]] mesh = ["fsdp_tp"], fsdp = ["none"]',
        ],
    ),
    (
        GOOD.replace("world_size = [1, 2]", "world_size = [4]").replace(
            'fsdp = ["none", "fsdp2"]', 'fsdp = ["fsdp2"]\nmesh = ["flat"]'
        )
        + '\n[[include]]\nworld_size = 6\nfsdp = "fsdp2"\nmesh = "hsdp"\n[[include]]\nworld_size = 2\nfsdp = "fsdp2"\nmesh = "hsdp"\n',
        ["cell ws2-fsdp2-hsdp", "not 2", "or change the [[include]] that adds this cell"],
    ),
    (
        GOOD
        + '\n[suites.resume]\naxes = ["world_size"]\n[suites.resume.options]\nasync_save = ["ws2-none", "ws9-*"]\n',
        ["suites.resume.options.async_save", "'ws9-*' matches no cell id", "torchmatrix list"],
    ),
]


def write_matrix(tmp_path, text: str):
    (tmp_path / "suites").mkdir(exist_ok=True)
    (tmp_path / "suites" / "test_demo.py").write_text("def test_x(cell):\n    pass\n")
    path = tmp_path / "matrix.toml"
    path.write_text(text)
    return path


def test_the_corpus_is_large_enough():
    assert len(MALFORMED) >= 20


@pytest.mark.parametrize("text, expected", MALFORMED, ids=[f"case{i}" for i in range(len(MALFORMED))])
def test_malformed_matrix_gives_one_clear_line(tmp_path, text, expected):
    with pytest.raises(ConfigError) as raised:
        load_matrix(write_matrix(tmp_path, text))
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("matrix.toml"), message
    assert ";" in message, f"no fix suggested: {message}"
    for part in expected:
        assert part in message, f"{part!r} not in {message!r}"


def test_good_matrix_loads(tmp_path):
    matrix = load_matrix(write_matrix(tmp_path, GOOD))
    assert matrix.versions == ("2.13.0", "2.14.1")
    assert matrix.baseline == "2.13.0"
    assert matrix.suites["demo"].axes == ("world_size",)
    assert matrix.suites["demo"].timeout == 30.0
    assert [c.id for c in matrix.cells()] == ["ws1-none", "ws1-fsdp2", "ws2-none", "ws2-fsdp2"]


def test_a_mesh_axis_over_every_world_size_and_fsdp_needs_two_excludes(tmp_path):
    """The 2-D meshes exist only at an even world size of at least 4 and under FSDP2; the two excludes
    the loader's errors name leave exactly those cells, and no cell is skipped for it at run time."""
    text = GOOD.replace("world_size = [1, 2]", "world_size = [1, 2, 4, 6]").replace(
        'fsdp = ["none", "fsdp2"]', 'fsdp = ["none", "fsdp2"]\nmesh = ["flat", "hsdp", "fsdp_tp"]'
    )
    excludes = (
        '\n[[exclude]]\nmesh = ["hsdp", "fsdp_tp"]\nworld_size = [1, 2]\n'
        '\n[[exclude]]\nmesh = ["hsdp", "fsdp_tp"]\nfsdp = "none"\n'
    )
    cells = [cell.id for cell in load_matrix(write_matrix(tmp_path, text + excludes)).cells()]
    assert [cell for cell in cells if not cell.endswith("-flat")] == [
        "ws4-fsdp2-hsdp",
        "ws4-fsdp2-fsdp_tp",
        "ws6-fsdp2-hsdp",
        "ws6-fsdp2-fsdp_tp",
    ]
    assert len(cells) == 4 * 2 + 4


def test_per_version_install_settings_load(tmp_path):
    nightly = """
[torch.install."2.14.1"]
index_url = "https://download.pytorch.org/whl/nightly/cpu"
requirements = ["numpy<2", "transformers>=5"]
constraints = ["sympy==1.13.1"]
env = { PIP_CACHE_DIR = "/scratch/pip-cache", NCCL_DEBUG = "INFO" }
"""
    matrix = load_matrix(write_matrix(tmp_path, GOOD + nightly))
    install = matrix.install("2.14.1")
    assert install.index_url == "https://download.pytorch.org/whl/nightly/cpu"
    assert install.requirements == ("numpy<2", "transformers>=5")
    assert install.constraints == ("sympy==1.13.1",)
    assert install.env == {"PIP_CACHE_DIR": "/scratch/pip-cache", "NCCL_DEBUG": "INFO"}
    assert matrix.install("2.13.0").index_url is None and matrix.install("2.13.0").requirements == ()


def test_component_requirements_load(tmp_path):
    text = (
        GOOD
        + '\n[components]\noptimizer_ao = "torchmatrix.models.x:build"\n[requires]\noptimizer_ao = ["torchao", "numpy<3"]\n'
    )
    assert load_matrix(write_matrix(tmp_path, text)).requires == {"optimizer_ao": ("torchao", "numpy<3")}
    assert load_matrix(write_matrix(tmp_path, GOOD)).requires == {}


def test_optional_components_load_and_apply_where_declared(tmp_path):
    text = GOOD + '\n[components]\na = "m:f"\nb = "m:g"\nc = "m:h"\n[optional]\na = true\n'
    text += 'b = { device = ["cpu"] }\nc = { device = ["cuda"], torch = ["2.14.1"] }\n'
    optional = load_matrix(write_matrix(tmp_path, text)).optional
    assert [key for key in "abc" if optional[key].applies("cpu", "2.14.1")] == ["a", "b"]
    assert [key for key in "abc" if optional[key].applies("cuda", "2.14.1")] == ["a", "c"]
    assert [key for key in "abc" if optional[key].applies("cuda", "2.13.0")] == ["a"]
    assert load_matrix(write_matrix(tmp_path, GOOD)).optional == {}


def test_suite_axes_default_to_every_axis(tmp_path):
    matrix = load_matrix(write_matrix(tmp_path, GOOD.replace('axes = ["world_size"]\n', "")))
    assert matrix.suites["demo"].axes == ("world_size", "fsdp")


def test_builtin_suite_is_named_without_path(tmp_path):
    text = GOOD.replace("[axes]\n", '[axes]\nqkv = ["fused", "split"]\n')
    text += '\n[suites.grad_ckpt]\n\n[suites.collectives]\n\n[suites.resume]\ntimeout = 5\naxes = ["world_size"]\n'
    matrix = load_matrix(write_matrix(tmp_path, text))
    grad_ckpt = matrix.suites["grad_ckpt"]
    assert Path(grad_ckpt.path) == Path(importlib.util.find_spec("torchmatrix.suites.test_grad_ckpt").origin)
    assert (grad_ckpt.timeout, grad_ckpt.axes) == (120.0, ("qkv", "world_size", "fsdp")), "every axis: a user's too"
    assert (matrix.suites["collectives"].timeout, matrix.suites["collectives"].axes) == (60.0, ("world_size",))
    assert (matrix.suites["resume"].timeout, matrix.suites["resume"].axes) == (5.0, ("world_size",))


def test_builtin_suite_names_match_the_shipped_files():
    shipped = {path.stem.removeprefix("test_") for path in builtin_suite_path("resume").parent.glob("test_*.py")}
    assert shipped == set(BUILTIN_SUITES)


def test_a_suite_path_may_leave_matrix_dir_inside_project_root(tmp_path):
    (tmp_path / "shared" / "test_demo.py").parent.mkdir()
    (tmp_path / "shared" / "test_demo.py").write_text("def test_x(cell):\n    pass\n")
    text = GOOD.replace('path = "suites/test_demo.py"', 'path = "../shared/test_demo.py"')
    (tmp_path / "project").mkdir()
    matrix = load_matrix(write_matrix(tmp_path / "project", text + '\n[project]\nroot = ".."\n'))
    assert matrix.suites["demo"].path == "../shared/test_demo.py"


def test_exclude_list_means_any_of(tmp_path):
    matrix = load_matrix(write_matrix(tmp_path, GOOD + '\n[[exclude]]\nfsdp = "none"\nworld_size = [2]\n'))
    assert [c.id for c in matrix.cells()] == ["ws1-none", "ws1-fsdp2", "ws2-fsdp2"]


def test_repository_matrix_is_valid():
    from helpers.checkout import REPO

    matrix = load_matrix(REPO / "matrix.toml")
    assert matrix.baseline in matrix.versions
    eager_flat_default = (3 + 2) * 2 * 2 + 2  # ws1 x 3 fsdp, ws2 x 2 fsdp, x attn x optimizer; ws4 SDPA AdamW x 2 fsdp
    two_d = 2  # hsdp and fsdp_tp at ws4, fsdp2, sdpa, adamw
    implementations = 4 + 3  # SDPA AdamW without FSDP at ws1 (4 others), FSDP2 at ws2 (no compiled step)
    compiled, modern_stack, te, accumulation = 1, 1, 1, 2
    pipeline = 2 + 1  # GPipe and interleaved 1F1B at pp=2 alone, 1F1B at pp=2 x FSDP2 over two
    assert (
        len(matrix.cells())
        == eager_flat_default + two_d + implementations + compiled + modern_stack + te + accumulation + pipeline
    )
    ids = {cell.id for cell in matrix.cells()}
    assert {
        "ws1-none-flat-sdpa-adamw-default-aot_eager-none-none",
        "ws4-fsdp2-fsdp_tp-sdpa-adamw-fused-inductor",
        "ws2-fsdp2-flat-sdpa-adamw-default-none-bf16",
        "ws2-none-flat-sdpa-adamw-default-none-none-gpipe",
        "ws4-fsdp2-flat-sdpa-adamw-default-none-none-1f1b",
    } <= ids


def test_cli_prints_one_line_and_exits_2(project):
    project.write("suites/test_demo.py", "def test_x(cell):\n    pass\n")
    project.write("matrix.toml", GOOD.replace("timeout = 30", "timeout = 0"))
    for command in (["list"], ["run", "--torch", "2.13.0"]):
        done = project.torchmatrix(*command)
        assert done.returncode == 2, done
        assert done.stderr.count("\n") == 1, done.stderr
        assert "Traceback" not in done.stderr
        assert "suites.demo.timeout" in done.stderr


def test_builtin_suites_resolve_from_a_checkout_that_is_not_installed():
    """nox's own environment imports torchmatrix from the checkout (the noxfile puts it on sys.path)."""
    from helpers.checkout import REPO

    code = f"import sys; sys.path.insert(0, {str(REPO)!r}); from torchmatrix.matrix.builtin_suites import builtin_suite_path; print(builtin_suite_path('resume'))"
    done = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True)
    assert done.stdout.strip() == str(REPO / "suites" / "test_resume.py"), done.stderr
