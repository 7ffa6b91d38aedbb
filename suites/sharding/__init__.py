"""dtensor_optim's machinery: where a mesh places each parameter, what each rank builds, and the rank functions of a reshard."""
