"""A known-bad configuration of the example's checkpointer, which the resume suite must catch
(tests/suites/test_torchtitan_example.py)."""

from __future__ import annotations

from checkpoint import Checkpointer


class FreshOptimizerAndScheduleCheckpointer(Checkpointer):
    """torchtitan's own `exclude_from_loading = ["optimizer", "lr_scheduler"]` (as a fine-tuning
    config sets it): the run resumes with fresh AdamW moments and its LR schedule restarted."""

    def config(self, directory: str):
        config = super().config(directory)
        config.exclude_from_loading = ["optimizer", "lr_scheduler"]
        return config
