"""This process's RNG state as one value: captured, put back, and compared stream by stream.

- Streams: torch CPU, every CUDA device once CUDA is initialised, python `random`, numpy (when installed).
- The reference checkpointer saves it per rank, the resume suite compares it, the sensitivity
  mutants put it back; torch is imported when called, so the package imports without it.
"""

from __future__ import annotations

import pickle
import random

TORCH_CPU = "torch CPU"
CUDA = "CUDA"  # a list: one state per device
PYTHON = "python random"
NUMPY = "numpy"


def capture_rng_state() -> dict:
    """Every RNG stream's state, to put back with restore_rng_state (or save in a checkpoint)."""
    import torch

    state = {TORCH_CPU: torch.get_rng_state(), PYTHON: random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state[CUDA] = torch.cuda.get_rng_state_all()
    numpy = _numpy()
    if numpy is not None:
        state[NUMPY] = numpy.random.get_state()
    return state


def restore_rng_state(state: dict) -> None:
    """Put back what capture_rng_state returned."""
    import torch

    torch.set_rng_state(state[TORCH_CPU])
    random.setstate(state[PYTHON])
    if CUDA in state:
        torch.cuda.set_rng_state_all(state[CUDA])
    if NUMPY in state:
        _numpy().random.set_state(state[NUMPY])


def rng_streams(state: dict | None = None) -> dict[str, bytes]:
    """Each stream of `state` (default: now) by name ("torch CPU", "CUDA device 0", "numpy",
    "python random") as the bytes of its state, so two captures compare with ==."""
    state = capture_rng_state() if state is None else state
    streams = {TORCH_CPU: state[TORCH_CPU].numpy().tobytes(), PYTHON: pickle.dumps(state[PYTHON])}
    for device, device_state in enumerate(state.get(CUDA, [])):
        streams[f"{CUDA} device {device}"] = device_state.numpy().tobytes()
    if NUMPY in state:
        kind, keys, position, has_gauss, cached = state[NUMPY][:5]
        streams[NUMPY] = pickle.dumps((kind, keys.tobytes(), position, has_gauss, cached))
    return streams


def _numpy():
    try:
        import numpy
    except ImportError:
        return None
    return numpy
