"""The parallel_equivalence suite's test names, as the mutant modules that prove it name them."""

LOSSES = "test_losses_match_single_process"
GRADIENTS = "test_reduced_gradients_match_single_process"
DECLARED_DTYPE = "test_gradients_reduced_in_declared_dtype"
NORM = "test_gradient_norm_is_the_whole_models"
CLIP = "test_clipping_scales_by_the_whole_norm"
PARAMETERS = "test_parameters_match_single_process_step"
ACCUMULATION = "test_micro_batches_accumulate_to_the_whole_batch"
EVERY_TEST = {LOSSES, GRADIENTS, DECLARED_DTYPE, NORM, CLIP, PARAMETERS, ACCUMULATION}
