"""Where a resumed run first parts from the straight one (suites/step_trace.py): the first step, and
there the first quantity in the order a step uses them, named."""

from __future__ import annotations

import torch

from suites.step_trace import digest, digests, first_divergence


def step(**changed) -> dict:
    """One step's record with every quantity equal to a reference step's but those `changed`."""
    record = {
        "batch": {"batch": digest(torch.arange(4))},
        "lr": {"param group 0 lr": digest(0.1)},
        "non_persistent_buffers": digests({"curriculum_step": torch.tensor(3)}),
        "rng": {"torch CPU": b"a"},
        "parameters": digests({"w": torch.ones(2)}),
        "gradients": digests({"w": torch.ones(2)}),
        "updated": digests({"w": torch.zeros(2)}),
    }
    return {**record, **changed}


def test_equal_runs_do_not_part_and_digests_tell_dtype_and_value_apart():
    assert first_divergence([step(), step()], [step(), step()], 4) is None
    assert digest(torch.ones(2)) != digest(torch.ones(2, dtype=torch.float64))
    assert digest(torch.tensor([0.0])) != digest(torch.tensor([-0.0]))


def test_the_first_differing_step_names_its_first_differing_quantity():
    later_update = step(updated=digests({"w": torch.ones(2)}))
    resumed = [step(), step(lr={"param group 0 lr": digest(0.2)}, updated=later_update["updated"])]
    assert first_divergence([step(), step()], resumed, 4) == (
        "the runs first part at step 5, in the learning rate the scheduler set: param group 0 lr"
    )
    update_only = [step(updated=digests({"w": torch.ones(2)}))]
    assert first_divergence([step()], update_only, 4).startswith(
        "the runs first part at step 4, in the parameters after the step, with equal gradients"
    )
