"""torchmatrix: run PyTorch training-correctness suites over a matrix of torch versions and cells.

Importing the package never imports torch: the runner lives in nox's environment, and only the
rank processes it starts need torch.
"""

__version__ = "0.1.0"
