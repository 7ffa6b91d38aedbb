"""How the suites compare: bit for bit with what differs named, and the derived bounds where the order of roundings may change."""
