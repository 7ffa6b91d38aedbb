"""grad_ckpt's machinery: a step recorded without and with activation checkpointing, its checkpoint units and what a failure says."""
