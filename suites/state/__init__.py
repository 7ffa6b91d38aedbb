"""Training state as the suites read it: names as built, module, optimizer and reachable state walks, owned generators, whole tensors."""
