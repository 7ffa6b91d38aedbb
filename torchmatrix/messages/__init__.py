"""What crosses the boundary between the runner and its pytest processes: plan.json, group plans, grants, event logs."""
