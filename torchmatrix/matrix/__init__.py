"""The matrix: matrix.toml, the cells it expands to, the selection a run covers, and the suite runs planned from them."""
