"""What a resume must restore, compared between the save and right after the load piece by piece,
and the final state of the straight run against the resumed one: one line per thing that differs."""

from __future__ import annotations

import torch

from ..comparison.differences import same_state, state_differences, tensor_difference

AFTER_LOAD_PIECES = (
    "parameters",
    "optimizer_state",
    "optimizer_state_dtype_device",
    "param_groups",
    "scheduler",
    "loader",
    "rng",
    "extra_state",
)


def after_load_differences(
    saved: dict, loaded: dict, straight_batches: list, rng_used: list[str], resume_step: int
) -> dict:
    """Per piece of state, one line for each thing that differs between save and right after load."""
    return {
        "parameters": tensor_differences("parameter", saved["parameters"], loaded["parameters"]),
        "parameter_shards": tensor_differences(
            "parameter shard", saved["parameter_shards"], loaded["parameter_shards"]
        ),
        "optimizer_state": optimizer_state_differences(saved["optimizer_state"], loaded["optimizer_state"])
        + optimizer_attribute_differences(saved["optimizer_attributes"], loaded["optimizer_attributes"]),
        "optimizer_state_dtype_device": dtype_device_differences(
            saved["optimizer_state_dtype_device"], loaded["optimizer_state_dtype_device"]
        ),
        "param_groups": param_group_differences(saved["param_groups"], loaded["param_groups"]),
        "scheduler": [
            f"after load: scheduler {key} is {loaded['scheduler'][key]!r}, saved {value!r}"
            for key, value in saved["scheduler"].items()
            if loaded["scheduler"][key] != value
        ],
        "loader": loader_differences(saved["next_batches"], loaded["next_batches"], straight_batches, resume_step),
        "rng": [
            f"after load: RNG stream {name} differs from the saved one"
            if name in loaded["rng"]
            else f"after load: RNG stream {name} does not exist: the saved run created it during training, and no load restored it"
            for name in rng_used
            if loaded["rng"].get(name) != saved["rng"].get(name)
        ],
    }


def difference(expected, actual, reference: str = "saved") -> str | None:
    """tensor_difference for two tensors; any other two values compare by `==`, as a state dict's
    plain values (an int step, a tuple of betas) come back from a load."""
    if not isinstance(expected, torch.Tensor) or not isinstance(actual, torch.Tensor):
        return None if expected == actual else f"is {actual!r}, {reference} {expected!r}"
    return tensor_difference(actual, expected, reference)


def tensor_differences(what: str, saved: dict, loaded: dict) -> list[str]:
    if not saved:
        return [f"after load: no {what} to compare: the model's state dict is empty"]
    problems = [f"after load: {what} {name} missing" for name in saved.keys() - loaded.keys()]
    return problems + [
        f"after load: {what} {name} {reason}"
        for name in sorted(saved.keys() & loaded.keys())
        if (reason := difference(saved[name], loaded[name]))
    ]


def optimizer_state_differences(saved: dict, loaded: dict) -> list[str]:
    if not any(saved.values()):
        return ["after load: the optimizer had no state at the checkpoint step: nothing to compare"]
    problems = []
    for name, saved_state in sorted(saved.items()):
        loaded_state = loaded.get(name, {})
        for key, value in saved_state.items():
            reason = "missing" if key not in loaded_state else difference(value, loaded_state[key])
            if reason:
                problems.append(f"after load: optimizer state {key} of {name} {reason}")
    return problems + [
        f"after load: optimizer state of {name} present, none saved" for name in loaded.keys() - saved.keys()
    ]


def dtype_device_differences(saved: dict, loaded: dict) -> list[str]:
    """Per parameter and state key, the dtype or device the optimizer holds a state tensor in right
    after the load, where it is not the one saved: a load (or a compiled step's handling of it) that
    casts `step` or moves it to another device (pytorch#173901)."""
    if not any(saved.values()):
        return ["after load: the optimizer had no state at the checkpoint step: nothing to compare"]
    return [
        f"after load: optimizer state {key} of {name} is "
        + (
            f"{now[0]} on {now[1]}, saved {kept[0]} on {kept[1]}"
            if (now := loaded.get(name, {}).get(key))
            else "missing"
        )
        for name, state in sorted(saved.items())
        for key, kept in state.items()
        if loaded.get(name, {}).get(key) != kept
    ]


def dtype_device_mismatches(expected: dict, actual: dict) -> list[str]:
    """dtype_device_differences for the final state: straight run (expected) vs resumed (actual)."""
    return [
        f"  {name}.{key}: {now[0]} on {now[1]}, expected {kept[0]} on {kept[1]}"
        for name, state in sorted(expected.items())
        for key, kept in state.items()
        if (now := actual.get(name, {}).get(key)) and now != kept
    ]


def extra_state_differences(saved: dict, loaded: dict) -> list[str]:
    """Per key of the extra state the checkpointer's save returned: missing from what its load
    returned, or different (a `tokens_seen` a manager writes and then loses)."""
    return [
        f"after load: extra state {key!r} " + ("missing from what load returned" if key not in loaded else reason)
        for key in sorted(saved, key=str)
        if key not in loaded or (reason := difference(saved[key], loaded[key]))
    ]


def param_group_differences(saved: list[dict], loaded: list[dict]) -> list[str]:
    if not saved:
        return ["after load: the optimizer had no param groups at the checkpoint step: nothing to compare"]
    if len(saved) != len(loaded):
        return [f"after load: {len(loaded)} param groups, saved {len(saved)}"]
    return [
        f"after load: param group {index} {key} {reason}"
        for index, (saved_group, loaded_group) in enumerate(zip(saved, loaded))
        for key in sorted(saved_group.keys() | loaded_group.keys())
        if (reason := difference(saved_group.get(key), loaded_group.get(key)))
    ]


def loader_differences(saved: list, loaded: list, straight_batches: list, resume_step: int) -> list[str]:
    """The first of the next batches that differs after load vs at save, each named by its index in
    the straight run's reading order: the next one, or one further on (past an epoch boundary)."""
    differing = next((i for i, (a, b) in enumerate(zip(loaded, saved)) if not same_state(a, b)), None)
    if differing is None:
        return []

    def index(batch) -> str:
        found = [i for i, seen in enumerate(straight_batches) if same_state(batch, seen)]
        return f"batch {found[0]}" if found else "a batch the straight run never read"

    if differing == 0:
        return [f"after load: loader would yield {index(loaded[0])}, saved at {index(saved[0])}"]
    return [
        f"after load: the loader's batch {resume_step + differing} (the {ordinal(differing + 1)} after the load) "
        f"differs from the saved loader's, though the {differing} before it agree: the order changes later "
        f"(at an epoch boundary?), so something the order depends on (epoch, shuffle seed) was not restored"
    ]


def ordinal(number: int) -> str:
    suffix = "th" if 10 <= number % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(number % 10, "th")
    return f"{number}{suffix}"


def optimizer_attribute_differences(saved: dict, loaded: dict) -> list[str]:
    """The optimizer object's own counters, scalars and tables (besides `.state` and `.param_groups`)
    by attribute name and content: a `{param: flag}` table compares by parameter names."""
    return [f"after load: optimizer attribute {line}" for line in state_differences(loaded, saved, reference="saved")]


def parameter_mismatches(expected: dict, actual: dict) -> list[str]:
    """Per parameter: missing or not bit-identical; no parameter at all is a failure, not a pass."""
    if not expected:
        return ["  the model has no parameters on this rank: nothing to compare"]
    problems = [f"  {name}: missing after the resume" for name in sorted(expected.keys() - actual.keys())]
    return problems + [
        f"  {name}: {problem}"
        for name in sorted(expected.keys() & actual.keys())
        if (problem := tensor_difference(actual[name], expected[name]))
    ]


def state_mismatches(expected: dict, actual: dict) -> list[str]:
    """Per parameter and state key: what is missing, extra or not bit-identical; no state at all
    is a failure, not a pass."""
    if not any(expected.values()):
        return ["  the optimizer holds no state after training on this rank: nothing to compare"]
    problems = []
    for name, expected_state in expected.items():
        actual_state = actual.get(name)
        if actual_state is None:
            problems.append(f"  {name}: no state at all (expected {sorted(expected_state)})")
            continue
        for key, value in expected_state.items():
            problem = "missing" if key not in actual_state else difference(value, actual_state[key], "expected")
            if problem:
                problems.append(f"  {name}.{key}: {problem}")
    problems += [f"  {name}: state present, none expected" for name in actual.keys() - expected.keys()]
    return problems
