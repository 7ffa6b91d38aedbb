"""repro.py's harness stands in for torchmatrix's `ranks` fixture: every `ranks.<name>` a built-in
suite uses must exist on the harness's Ranks, or a reproducer of that suite's failure dies with an
AttributeError instead of reproducing it."""

from __future__ import annotations

import re

from torchmatrix.repro import harness

from helpers.checkout import REPO

USE = re.compile(r"(?<![.\w])ranks\.([a-z_]+)\b")  # not a module path such as torchmatrix.ranks.bitwise


def test_the_harness_offers_every_ranks_attribute_the_suites_use():
    used = {
        name: path.name for path in sorted((REPO / "suites").rglob("*.py")) for name in USE.findall(path.read_text())
    }
    assert {"run", "world_size", "in_world"} <= used.keys(), used
    missing = {name: suite for name, suite in used.items() if not hasattr(harness.Ranks, name)}
    assert not missing, f"repro's harness.Ranks lacks what these suites call: {missing}"


def test_the_harness_reads_a_built_in_suites_options_into_its_dataclass(monkeypatch):
    """Every built-in suite reads its options as attributes (`options.seed`): a reproducer handing it the
    table as a dict died with an AttributeError instead of reproducing the failure."""
    from types import SimpleNamespace

    from torchmatrix.testing import ParallelEquivalenceOptions

    monkeypatch.setitem(harness.CHECK, "options", {"steps": 2})
    options = harness.Fixtures.suite_options.__wrapped__(
        harness.Fixtures(), SimpleNamespace(module=SimpleNamespace(OPTIONS=ParallelEquivalenceOptions))
    )
    assert options == ParallelEquivalenceOptions(steps=2)
    assert harness.Fixtures.suite_options.__wrapped__(harness.Fixtures(), SimpleNamespace(module=None)) == {"steps": 2}
