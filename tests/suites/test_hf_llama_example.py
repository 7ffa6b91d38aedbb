"""examples/hf_llama on CPU at world sizes 1 and 2: the suites run on transformers'
LlamaForCausalLM as it ships (no subclass: the loss and the DynamicCache read from its own output,
recompute counted by the suite, resume passing the loader's tokens as `input_ids` and `labels`),
and fail exactly where transformers documents a limit.

Under its activation checkpointing, transformers hands a cache-writing decoder layer `cache=None`
(GradientCheckpointingLayer), so the checkpointed model returns the DynamicCache it was given
empty: the grad-ckpt suite's cache check fails on that, in every cell. Everything else passes.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from junitparser import JUnitXml

from helpers.checkout import REPO, checkout_env

pytestmark = pytest.mark.slow

CELLS = ("ws1-none-sdpa-adamw", "ws2-fsdp2-eager-adamw")
CACHE_CHECK = "test_recompute_reruns_layers_and_rewrites_cache_identically"


def test_the_suites_on_a_tiny_hf_llama(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "torchmatrix", "run", "--torch", "system", "--reports", str(tmp_path)]
        + ["--config", str(REPO / "examples" / "hf_llama" / "matrix.toml"), "-k", " or ".join(CELLS)],
        cwd=REPO,
        env=checkout_env(),
        capture_output=True,
        text=True,
        timeout=600,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    cases = {
        (suite.name.split("/", 1)[1], case.name.split("[torch=", 1)[0]): case
        for suite in JUnitXml.fromfile(str(tmp_path / "latest" / "junit.xml"))
        for case in suite
    }
    assert {cell for cell, _ in cases} == set(CELLS), output
    failed = {key: case for key, case in cases.items() if not (case.is_passed or case.is_skipped)}
    assert sorted(failed) == [(cell, CACHE_CHECK) for cell in CELLS], output
    for (cell, _), case in failed.items():
        # the message is the root cause line, the conclusion; the lines under it name the entry, then the fix
        assert case.result[0].message == (
            f"AssertionError: cell {cell} (float32, bit for bit): the model returned a cache of 4 entries without "
            "checkpointing and none with it (None or empty): checkpointing lost the cache"
        ), case.result[0].message
        assert "usual fix: hand the cache to checkpointed layers as to plain ones" in case.result[0].text
        for line in (
            "rank 0: cache entry past_key_values.layers[0].keys: missing from the first",
            "rank 0: the model returned a cache of 4 entries without checkpointing and none with it",
        ):
            assert line in case.result[0].text, case.result[0].text
    passed = {test.split("[", 1)[0] for (_, test), case in cases.items() if case.is_passed}
    assert {
        "test_checkpointing_leaves_loss_and_gradients_unchanged",
        "test_losses_identical_after_resume",
        "test_final_optimizer_state_identical",
        "test_state_is_laid_out_like_its_param",
        "test_reshard_load_is_exact",
    } <= passed, output
