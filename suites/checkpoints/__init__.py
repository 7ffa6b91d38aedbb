"""How a checkpoint is taken and read: the checkpointer's two forms, what DCP stores, pickles, the version-neutral form, the archive's stack and writer."""
