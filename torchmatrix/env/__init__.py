"""The torch environments: installing a torch version into its venv, what it can run on, one run per envdir."""
