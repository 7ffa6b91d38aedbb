"""suites/test_checkpoint_archive.py's three checks, on what a reader returns for one archived
checkpoint (2.13.0's flat FSDP2 form, two ranks): a faithful read is exact, and each kind of broken
loader, resume or release is named by the value it broke and by its kind, without starting ranks."""

from __future__ import annotations

import copy
import json

import pytest

from suites.checkpoints.archive_writer import EXPECTED_FILE
from suites.test_checkpoint_archive import (
    EXACT,
    FORMAT,
    NUMERICS,
    RESUME,
    SHIPPED_ARCHIVE,
    continued_on,
    restored_on,
    verdict,
)

FORM = SHIPPED_ARCHIVE / "2.13.0" / "fsdp2-foreach-sync"


@pytest.fixture(scope="module")
def expected() -> dict:
    return json.loads((FORM / EXPECTED_FILE).read_text())


def faithful(expected: dict) -> list[dict]:
    """What each rank of a reader that loads and continues exactly returns."""
    return [
        {
            "loaded": copy.deepcopy(restored_on(expected, rank)),
            "continued": copy.deepcopy(continued_on(expected, rank)),
            "never_stopped": copy.deepcopy(continued_on(expected, rank)),
        }
        for rank in range(len(expected["ranks"]))
    ]


def flip_one_byte(encoded: dict) -> None:
    """One bit of a neutral() tensor's first byte changed."""
    import base64

    raw = bytearray(base64.b64decode(encoded["bytes"]))
    raw[0] ^= 1
    encoded["bytes"] = base64.b64encode(bytes(raw)).decode("ascii")


def test_a_faithful_read_is_exact(expected):
    assert verdict(expected, faithful(expected), "pair") == (EXACT, EXACT)


def drop_step(read):
    for state in read[1]["loaded"]["optimizer"].values():
        state.pop("step")


def zero_step(read):
    read[0]["loaded"]["optimizer"]["0.bias"]["step"] = {
        **read[0]["loaded"]["optimizer"]["0.bias"]["step"],
        "bytes": "AAAAAA==",
    }


def shuffle_parameter_keys(read):
    optimizer = read[0]["loaded"]["optimizer"]
    optimizer["0.weight"], optimizer["2.weight"] = optimizer["2.weight"], optimizer["0.weight"]


def shuffle_same_shaped_keys(read):
    optimizer = read[1]["loaded"]["optimizer"]
    optimizer["0.bias"]["exp_avg"], optimizer["0.bias"]["exp_avg_sq"] = (
        optimizer["0.bias"]["exp_avg_sq"],
        optimizer["0.bias"]["exp_avg"],
    )


def lose_rng(read):
    read[1]["loaded"]["rank"]["rng"] = read[0]["loaded"]["rank"]["rng"]


def lose_position(read):
    read[0]["loaded"]["rank"]["position"] = 0


def lose_scheduler(read):
    read[0]["loaded"]["scheduler"]["last_epoch"] = 0


def corrupt_a_parameter(read):
    flip_one_byte(read[0]["loaded"]["parameters"]["2.weight"])


def rename_a_parameter(read):
    parameters = read[0]["loaded"]["parameters"]
    parameters["_orig_mod.0.weight"] = parameters.pop("0.weight")


@pytest.mark.parametrize(
    ("break_read", "named"),
    [
        (drop_step, "optimizer.0.bias.step: missing, saved "),
        (zero_step, "rank 0: optimizer.0.bias.step: is 0.0, saved "),
        (shuffle_parameter_keys, "optimizer.0.weight.exp_avg: has shape (8, 16), saved (16, 8)"),
        (shuffle_same_shaped_keys, "rank 1: optimizer.0.bias.exp_avg:"),
        (lose_rng, "rank 1: rank.rng:"),
        (lose_position, "rank 0: rank.position: is 0, saved 3"),
        (lose_scheduler, "rank 0: scheduler.last_epoch: is 0, saved 3"),
        (corrupt_a_parameter, "rank 0: parameters.2.weight: 1/128 elements differ"),
        (rename_a_parameter, "parameters._orig_mod.0.weight: is a [16, 8] float32 tensor, saved nothing"),
    ],
)
def test_a_load_that_restores_other_values_is_a_format_difference_naming_the_value(expected, break_read, named):
    read = faithful(expected)
    break_read(read)
    kind, message = verdict(expected, read, "2.13.0/fsdp2/foreach/sync read by 2.15.0")
    assert kind == FORMAT
    assert message.startswith("format difference: 2.13.0/fsdp2/foreach/sync read by 2.15.0: the load restored")
    assert named in message


@pytest.mark.parametrize(
    ("key", "named"),
    [("losses", "rank 1: losses: 1/3 elements differ"), ("parameters", "rank 1: parameters.0.bias: 1/16 elements")],
)
def test_a_continuation_unlike_the_never_stopped_one_is_a_resume_difference(expected, key, named):
    read = faithful(expected)
    continued = read[1]["continued"]
    flip_one_byte(continued[key] if key == "losses" else continued[key]["0.bias"])
    kind, message = verdict(expected, read, "pair")
    assert kind == RESUME
    assert named in message


def test_a_writer_that_continued_otherwise_is_a_numerics_difference_not_a_failure(expected):
    """Both reads agree with each other and restore every value; only the writer's continuation differs."""
    changed = copy.deepcopy(expected)
    flip_one_byte(changed["continued"]["optimizer"]["2.weight"]["exp_avg_sq"])
    kind, message = verdict(changed, faithful(expected), "pair")
    assert kind == NUMERICS
    assert "optimizer.2.weight.exp_avg_sq: 1/128 elements differ, max " in message and "max |Δ|" in message
    assert "rank 0" in message and "rank 1" in message


def test_a_load_that_raises_is_a_format_difference_with_its_root_cause(expected):
    read = faithful(expected)
    read[0] = {"load_failed": "CheckpointException on ranks 0, 1: AssertionError: metadata is None"}
    kind, message = verdict(expected, read, "2.15.0/fsdp2/foreach/sync read by 2.13.0")
    assert (kind, message) == (
        FORMAT,
        "format difference: 2.15.0/fsdp2/foreach/sync read by 2.13.0: the load failed: "
        "CheckpointException on ranks 0, 1: AssertionError: metadata is None",
    )
