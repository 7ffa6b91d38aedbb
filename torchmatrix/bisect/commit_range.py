"""The commit range a bisect between two nightly dates ends on: the last good and first bad builds'
`torch.version.git_version`, as an upstream bug report wants it (a dev version names a date, not a commit)."""

from __future__ import annotations

COMPARE_URL = "https://github.com/pytorch/pytorch/compare/{good}...{bad}"


def commit_range_line(good: str, bad: str, git_versions: dict[str, str]) -> str | None:
    """`commit range for upstream: ...` between the builds `good` and `bad`; None when either's commit is unknown."""
    good_sha, bad_sha = git_versions.get(good, ""), git_versions.get(bad, "")
    if not good_sha or not bad_sha or good_sha in ("Unknown", bad_sha):
        return None
    url = COMPARE_URL.format(good=good_sha, bad=bad_sha)
    return f"commit range for upstream: {good} is {good_sha}, {bad} is {bad_sha}: {url}"
