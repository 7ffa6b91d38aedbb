"""The user's components as the suites call them, and the suites' own defaults where matrix.toml names none."""
