"""`python -m torchmatrix` entry point."""

import sys

from torchmatrix.cli import main

sys.exit(main())
