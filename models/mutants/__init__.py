"""Known-bad components: each suite must fail on the mutants written for it."""
