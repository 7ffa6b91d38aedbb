"""Helpers the runner's tests share, one module per kind of thing; fixtures stay in tests/conftest.py."""
