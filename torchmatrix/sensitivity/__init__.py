"""`torchmatrix sensitivity`: generic mutants of your components and whether the suites catch them."""
