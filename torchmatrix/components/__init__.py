"""Your stack: components named by import path, and the protocol the suites call them with."""
