"""`UserError`: the base of every error the user caused and can fix, printed as one line with exit 2."""

from __future__ import annotations

from torchmatrix.exit_codes import ExitCode


class UserError(Exception):
    """A problem the user can fix, said in one line that names what to change; the CLI and the nox
    sessions catch it once, print `torchmatrix: error: <message>` and exit with `exit_code`."""

    exit_code = ExitCode.USAGE
