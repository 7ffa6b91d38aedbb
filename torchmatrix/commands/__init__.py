"""One module per `torchmatrix` command, each with its parser (`add_parser`) and its handler (`run`)."""
