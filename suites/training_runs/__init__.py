"""Training runs built from a cell's components: resume's straight and resumed runs, and peak_memory's measured step."""
