"""How a process is born and how it dies: the preloaded interpreter and the zygote that fork the
runner's pytest processes and their ranks, what a fork drops to behave as a started process, and the
subreaper and parent-death ties that leave no process behind."""
