"""The machine's load average while one torch version runs, sampled in the background.

plan.json records it per version, and the upgrade diff shows it beside every timing claim: a
version that ran while other work loaded the machine took longer for a reason that is not torch.
"""

from __future__ import annotations

import os
import threading

SAMPLE_SECONDS = 5.0


class LoadSampler:
    """Samples the 1-minute load average every SAMPLE_SECONDS from start until stop."""

    def __init__(self, every: float = SAMPLE_SECONDS):
        self.every = every
        self.samples: list[float] = []
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="load-sampler", daemon=True)

    def start(self) -> LoadSampler:
        self._thread.start()
        return self

    def stop(self) -> dict:
        """Stop sampling and return the summary plan.json keeps."""
        self._stopped.set()
        self._thread.join()
        self.samples.append(os.getloadavg()[0])
        return self.summary()

    def summary(self) -> dict:
        """{"mean", "max", "samples", "cores"} of the samples so far (empty before the first)."""
        if not self.samples:
            return {}
        return {
            "mean": round(sum(self.samples) / len(self.samples), 2),
            "max": round(max(self.samples), 2),
            "samples": len(self.samples),
            "cores": os.cpu_count() or 1,
        }

    def _sample(self) -> None:
        while True:
            self.samples.append(os.getloadavg()[0])
            if self._stopped.wait(self.every):
                return
