"""Bisecting torch releases: which versions lie between two pins, the search, the command."""
