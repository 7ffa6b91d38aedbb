"""Parameter names as the user's model spells them, whatever wrapper the cell put around it."""

from torchmatrix.testing import clean_name

__all__ = ["clean_name"]
