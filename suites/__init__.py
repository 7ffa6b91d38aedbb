"""Correctness suites, run by the torchmatrix pytest plugin once per cell."""
