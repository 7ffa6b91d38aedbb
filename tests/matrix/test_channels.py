"""Channel values in [torch].versions ("nightly", "nightly-YYYYMMDD", "rc"): what matrix.toml accepts,
the index each installs from, and the concrete build each resolves to among what an index lists."""

from __future__ import annotations

import pytest

from torchmatrix.matrix.channels import (
    DEFAULT_URLS,
    ChannelError,
    cached_build,
    companion_pin,
    dated_builds,
    is_build_of,
    resolve,
)
from torchmatrix.matrix.config import ConfigError, load_matrix
from torchmatrix.matrix.safe_names import check_name

NIGHTLY_INDEX = [
    "2.16.0.dev20261203+cpu",
    "2.16.0.dev20261202+cpu",
    "2.16.0.dev20261201+cpu",
    "2.15.0.dev20261020+cpu",
    "2.14.1+cpu",
]
URL = "file:///srv/nightly/simple"


def write(tmp_path, torch_table: str) -> object:
    (tmp_path / "suites").mkdir(exist_ok=True)
    (tmp_path / "suites" / "test_demo.py").write_text("def test_x(cell):\n    pass\n")
    path = tmp_path / "matrix.toml"
    path.write_text(f'{torch_table}\n[axes]\nworld_size = [1]\n\n[suites.demo]\npath = "suites/test_demo.py"\n')
    return load_matrix(path)


@pytest.mark.parametrize(
    ("value", "version"),
    [
        ("nightly", "2.16.0.dev20261203+cpu"),
        ("nightly-20261202", "2.16.0.dev20261202+cpu"),
        ("nightly-20261020", "2.15.0.dev20261020+cpu"),
    ],
)
def test_a_nightly_value_resolves_to_the_build_of_its_date(value, version):
    assert resolve(value, NIGHTLY_INDEX, URL) == version


@pytest.mark.parametrize(
    ("listed", "version"),
    [
        (["2.16.0+cpu", "2.15.1+cpu", "2.15.0+cpu"], "2.16.0+cpu"),  # the test channel's own spelling
        (["2.16.0rc2", "2.16.0rc1", "2.15.1"], "2.16.0rc2"),
        (["2.17.0.dev20261201+cpu", "2.16.0rc1+cpu"], "2.16.0rc1+cpu"),  # a dev build is never an rc
    ],
)
def test_rc_is_the_newest_build_on_the_test_channel(listed, version):
    assert resolve("rc", listed, URL) == version


def test_a_date_without_a_build_is_one_line_that_says_what_to_pick():
    with pytest.raises(ChannelError) as error:
        resolve("nightly-20261130", NIGHTLY_INDEX, URL)
    message = str(error.value)
    assert message == (
        f"torch nightly-20261130: {URL} has no nightly build of 20261130; "
        "pick a date it lists (latest: 20261201, 20261202, 20261203)"
    )
    with pytest.raises(ChannelError, match="has no release candidate; use a pinned release"):
        resolve("rc", ["2.17.0.dev20261201"], URL)


def test_matrix_toml_takes_channel_values_and_their_indexes(tmp_path):
    matrix = write(
        tmp_path,
        '[torch]\nversions = ["2.13.0", "nightly", "nightly-20261201", "rc"]\n\n'
        '[torch.channels]\nnightly = "file:///srv/nightly/simple"\n\n'
        '[torch.install."nightly"]\nrequirements = ["torchao"]\nenv = { PIP_CONSTRAINT = "/dev/null" }\n',
    )
    assert matrix.versions == ("2.13.0", "nightly", "nightly-20261201", "rc")
    dated = matrix.install("nightly-20261201")  # a dated nightly shares "nightly"'s table
    assert (dated.index_url, dated.requirements, dated.env) == (URL, ("torchao",), {"PIP_CONSTRAINT": "/dev/null"})
    assert matrix.install("rc").index_url == DEFAULT_URLS["rc"] == "https://download.pytorch.org/whl/test/cpu"
    assert matrix.install("2.13.0").index_url is None
    for value in matrix.versions:  # venvs, torch-<V> directories and JUnit names need no mapping
        assert check_name(value, "torch version") == value


@pytest.mark.parametrize(
    ("torch_table", "message"),
    [
        (
            '[torch]\nversions = ["nightly@20261201"]',
            "torch.versions[0]: 'nightly@20261201' is not a PEP 440 torch version pip can install; did you mean \"nightly-20261201\"?",
        ),
        (
            '[torch]\nversions = ["nightly"]\n[torch.channels]\nbeta = "file:///x"',
            "torch.channels.beta: is not a channel; use one of: nightly, rc",
        ),
        (
            '[torch]\nversions = ["nightly"]\n[torch.channels]\nnightly = "download.pytorch.org/whl/nightly"',
            "torch.channels.nightly: 'download.pytorch.org/whl/nightly' is not an index URL",
        ),
        (
            '[torch]\nversions = ["nightly"]\n[report]\nprerelease_blocks = "yes"',
            "report.prerelease_blocks: must be true or false; write prerelease_blocks = true",
        ),
    ],
)
def test_a_wrong_channel_setting_is_one_line_naming_the_key(tmp_path, torch_table, message):
    with pytest.raises(ConfigError, match=None) as error:
        write(tmp_path, torch_table)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_bisect_by_date_lists_the_dated_builds_between_the_pins():
    assert dated_builds(NIGHTLY_INDEX, "nightly-20261020", "nightly-20261203") == [
        "nightly-20261201",
        "nightly-20261202",
    ]


def test_companions_come_from_the_same_date_or_the_newest_before_it():
    listed = ["0.16.0.dev20261203+cpu", "0.16.0.dev20261201+cpu", "0.15.0"]
    assert companion_pin("torchao", listed, "2.16.0.dev20261201+cpu") == "torchao==0.16.0.dev20261201+cpu"
    assert companion_pin("torchao", listed, "2.16.0.dev20261202+cpu") == "torchao==0.16.0.dev20261201+cpu"
    assert companion_pin("torchao", listed, "2.16.0+cpu") == "torchao"  # an rc: the test channel's newest, --pre


def test_a_dated_value_finds_its_build_in_the_wheelhouse(tmp_path):
    (tmp_path / "torch-2.16.0.dev20261201+cpu-cp311-cp311-linux_x86_64.whl").write_bytes(b"")
    (tmp_path / "numpy-2.3.0-cp311-cp311-linux_x86_64.whl").write_bytes(b"")
    assert cached_build("nightly-20261201", tmp_path) == "2.16.0.dev20261201+cpu"
    assert cached_build("nightly-20261202", tmp_path) is None
    assert cached_build("nightly", tmp_path) is None  # the newest build is the index's to say


@pytest.mark.parametrize(
    ("value", "build", "accepted"),
    [
        ("nightly", "2.16.0.dev20261203+cpu", True),
        ("nightly-20261203", "2.16.0.dev20261203+cpu", True),
        ("nightly-20261202", "2.16.0.dev20261203+cpu", False),
        ("nightly", "2.16.0+cpu", False),
        ("rc", "2.16.0+cpu", True),
        ("rc", "2.16.0.dev20261203+cpu", False),
    ],
)
def test_a_run_accepts_the_builds_a_channel_value_resolves_to(value, build, accepted):
    assert is_build_of(value, build) is accepted
