"""`.github/workflows/gpu-matrix.yml` against SchemaStore's GitHub workflow schema (vendored in
tests/data, see its README), and the matrix it fans out against what `github-matrix` prints."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys

import pytest
import yaml
from jsonschema import Draft7Validator

from helpers.checkout import REPO, checkout_env

WORKFLOW = REPO / ".github" / "workflows" / "gpu-matrix.yml"
SCHEMA = json.loads((REPO / "tests" / "data" / "github-workflow.json").read_text())
MATRIX_KEY = re.compile(r"\bmatrix\.([A-Za-z_][A-Za-z0-9_-]*)")


def load_workflow() -> dict:
    # YAML 1.1 reads the bare key `on` as True; GitHub reads it as the string "on".
    workflow = yaml.safe_load(WORKFLOW.read_text())
    workflow["on"] = workflow.pop(True)
    return workflow


def schema_errors(workflow: dict) -> list[str]:
    validator = Draft7Validator(SCHEMA, format_checker=Draft7Validator.FORMAT_CHECKER)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(workflow)]


@pytest.fixture(scope="module")
def printed_matrix() -> dict:
    """What the plan job's step prints, run the way the step runs it (one line, into $GITHUB_OUTPUT)."""
    done = subprocess.run(
        [sys.executable, "-m", "torchmatrix", "github-matrix", "--shards", "4"],
        cwd=REPO,
        env=checkout_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("\n") == 1, "a `key=value` line in $GITHUB_OUTPUT must be a single line"
    return json.loads(done.stdout)


def test_the_workflow_validates_against_the_github_workflow_schema():
    assert schema_errors(load_workflow()) == []


@pytest.mark.parametrize(
    "mutate, where",
    [
        (lambda w: w["jobs"]["cells"].pop("runs-on"), "jobs/cells"),
        (lambda w: w["jobs"]["merge"].update({"needs": 3}), "jobs/merge"),
        (lambda w: w["jobs"]["cells"]["strategy"].update({"fail_fast": False}), "jobs/cells"),
    ],
    ids=["job-without-runs-on", "needs-a-number", "misspelt-fail-fast"],
)
def test_the_schema_rejects_a_broken_workflow(mutate, where):
    workflow = load_workflow()
    mutate(workflow)
    errors = schema_errors(workflow)
    assert errors, "the vendored schema must catch this mistake"
    assert any(error.startswith(where) for error in errors), errors


def test_the_plan_output_feeds_the_fan_out():
    workflow = load_workflow()
    plan, cells = workflow["jobs"]["plan"], workflow["jobs"]["cells"]
    [step] = [s for s in plan["steps"] if s.get("id") == "plan"]
    assert 'matrix=$(python -m torchmatrix github-matrix --shards "$SHARDS")' in step["run"]
    assert '>> "$GITHUB_OUTPUT"' in step["run"]
    assert plan["outputs"]["matrix"] == "${{ steps.plan.outputs.matrix }}"
    assert cells["needs"] == "plan"
    assert cells["strategy"]["matrix"] == "${{ fromJSON(needs.plan.outputs.matrix) }}"


def test_every_matrix_key_the_fan_out_reads_is_in_every_printed_entry(printed_matrix):
    cells = load_workflow()["jobs"]["cells"]
    referenced = set(MATRIX_KEY.findall(json.dumps(cells)))
    assert {"name", "gpus", "session", "args"} <= referenced, referenced
    assert printed_matrix["include"], "the repository's matrix.toml plans jobs"
    for entry in printed_matrix["include"]:
        assert referenced <= set(entry), f"{entry['name']} lacks {referenced - set(entry)}"
        assert isinstance(entry["gpus"], int) and entry["gpus"] >= 1


def test_the_workflow_with_the_printed_matrix_in_place_still_validates(printed_matrix):
    workflow = copy.deepcopy(load_workflow())
    workflow["jobs"]["cells"]["strategy"]["matrix"] = printed_matrix
    assert schema_errors(workflow) == []
    assert len(printed_matrix["include"]) <= 256, "GitHub runs at most 256 jobs per matrix"
