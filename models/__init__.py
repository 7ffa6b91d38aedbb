"""Reference components the suites test: models, parallel wrappers, optimizers, checkpointer, data."""
