"""Which step's training state a loaded checkpoint holds, tensor by tensor.

The resume suite keeps this rank's parameter shards and optimizer state at the previous save, at
the save it loads and after the step the trainer took next, while an asynchronous save could still
be in flight. A loaded tensor that differs from the save's value but equals another step's is named
with that step, which says why it differs: the next step reached the checkpoint (a staging copy
skipped, pytorch#144657), or the checkpointer wrote an earlier save's state again.
"""

from __future__ import annotations

from torchmatrix.testing import bits_equal


def held_state(parameters: dict, optimizer_state: dict) -> dict:
    """One rank's tensors by what the failure lines call them: `parameter NAME`, `optimizer state KEY of NAME`."""
    held = {f"parameter {name}": value for name, value in parameters.items()}
    for name, state in optimizer_state.items():
        held.update({f"optimizer state {key} of {name}": value for key, value in state.items() if _is_tensor(value)})
    return held


def held_step_lines(history: dict[int, dict], save_step: int, loaded: dict) -> list[str]:
    """Per loaded tensor that holds another step's value than the save's, one line naming that step;
    then one line when the checkpoint is torn: some kinds of state from the save, others from another step."""
    saved = history[save_step]
    lines, steps_by_kind = [], {}
    for label, value in loaded.items():
        if label not in saved or not _is_tensor(value):
            continue
        held = save_step if bits_equal(value, saved[label]) else _only_step_holding(history, save_step, label, value)
        steps_by_kind.setdefault(_kind(label), set()).add(held)
        if held not in (save_step, None):
            lines.append(f"after load: {label} holds step {held}'s value, the save was at step {save_step}")
    held_elsewhere = sorted({step for steps in steps_by_kind.values() for step in steps} - {save_step, None})
    causes = [_why(step, save_step) for step in held_elsewhere]
    return _torn(steps_by_kind, save_step) + lines + causes


def _only_step_holding(history: dict[int, dict], save_step: int, label: str, value) -> int | None:
    """The one other step whose state holds exactly `value` for `label`, else None."""
    steps = [
        step
        for step, state in history.items()
        if step != save_step and label in state and bits_equal(value, state[label])
    ]
    return steps[0] if len(steps) == 1 else None


def _why(held: int, save_step: int) -> str:
    """The cause of a checkpoint holding step `held`'s values, in one line."""
    if held > save_step:
        return (
            f"step {held}, taken after the save at step {save_step} returned, reached the checkpoint: the save wrote "
            "tensors the optimizer changed in place after it, without a copy made at the save (the staging copy skipped?)"
        )
    return f"the save at step {save_step} wrote the state of step {held}, an earlier save's, again (a stale staging buffer?)"


def _kind(label: str) -> str:
    """`parameter` or the optimizer state key (`step`, `exp_avg`, ...) of a label."""
    return "parameter" if label.startswith("parameter ") else label.removeprefix("optimizer state ").split(" of ", 1)[0]


def _torn(steps_by_kind: dict[str, set], save_step: int) -> list[str]:
    at_save = sorted(kind for kind, steps in steps_by_kind.items() if steps == {save_step})
    elsewhere = {kind: sorted(steps - {save_step, None}) for kind, steps in steps_by_kind.items()}
    other = sorted(kind for kind, steps in elsewhere.items() if steps)
    if not at_save or not other:
        return []
    held = ", ".join(f"{kind} from step {'/'.join(map(str, elsewhere[kind]))}" for kind in other)
    return [f"the checkpoint is torn: {held}, while {', '.join(at_save)} from step {save_step}, the save's"]


def _is_tensor(value) -> bool:
    return hasattr(value, "dtype") and hasattr(value, "shape")
