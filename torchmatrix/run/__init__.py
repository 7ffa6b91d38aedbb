"""Running one torch version: the pre-run component check, scheduling groups, progress, confirmation re-runs."""
