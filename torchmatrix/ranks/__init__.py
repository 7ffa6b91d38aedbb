"""Inside a pytest process: the plugin, the rank pool forked from a zygote, and the rank processes themselves."""
