"""Where a resumed run first parts from the straight one (suites/training_runs/step_trace.py): the first step whose
gradients or update differ, and what differs among its inputs, or whether the LR or the optimizer does."""

from __future__ import annotations

import torch

from suites.training_runs.step_trace import digest, digests, first_divergence


def step(**changed) -> dict:
    """One step's record with every quantity equal to a reference step's but those `changed`."""
    record = {
        "batch": {"batch": digest(torch.arange(4))},
        "lr": {"param group 0 lr": digest(0.1)},
        "non_persistent_buffers": digests({"tokens_seen": torch.tensor(3)}),
        "rng": {"torch CPU": b"a"},
        "parameters": digests({"w": torch.ones(2)}),
        "gradients": digests({"w": torch.ones(2)}),
        "updated": digests({"w": torch.zeros(2)}),
    }
    return {**record, **changed}


OTHER_UPDATE = digests({"w": torch.ones(2)})


def test_equal_runs_do_not_part_and_digests_tell_dtype_and_value_apart():
    assert first_divergence([step(), step()], [step(), step()], 4) is None
    assert digest(torch.ones(2)) != digest(torch.ones(2, dtype=torch.float64))
    assert digest(torch.tensor([0.0])) != digest(torch.tensor([-0.0]))


def test_a_counter_that_changes_nothing_is_never_blamed():
    """A non-persistent counter no load restores differs at every resumed step; the runs part only where the update does."""
    counter = {"non_persistent_buffers": digests({"tokens_seen": torch.tensor(0)})}
    resumed = [step(**counter), step(**counter, updated=OTHER_UPDATE)]
    assert first_divergence([step(), step()], resumed, 4) == (
        "the runs first part at step 5, in the parameters after the step (w): with equal gradients and learning "
        "rate, the optimizer's update differs (its state, or what it keeps on itself)"
    )


def test_the_first_step_with_other_gradients_names_the_inputs_that_differ():
    resumed = [step(rng={"torch CPU": b"b"}, gradients=digests({"w": torch.full((2,), 2.0)}), updated=OTHER_UPDATE)]
    assert first_divergence([step()], resumed, 4) == (
        "the runs first part at step 4, in the gradients (w); of that step's inputs, these differ: RNG streams "
        "(the process's, and generators the model, data, optimizer or scheduler own): torch CPU"
    )
    learning_rate = [step(lr={"param group 0 lr": digest(0.2)}, updated=OTHER_UPDATE)]
    assert first_divergence([step()], learning_rate, 4).endswith(
        "the learning rate the scheduler set differs (param group 0 lr)"
    )
