"""Imported first by the zygote (zygote.PRELOAD), before torch: ties the zygote's life to its pytest process.

multiprocessing's forkserver notices its parent's death only when it next waits for work, and
its first minutes go to importing torch; a runner killed then would leave it running alone.
"""

from torchmatrix.forks.parent_death import exit_with_parent

exit_with_parent()
