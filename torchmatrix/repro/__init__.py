"""Standalone reproducers of confirmed failures, for reports upstream."""
