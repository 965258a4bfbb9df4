"""The error type of the command line: one line for the user, exit status 2, no traceback.

Example:
    >>> str(CLIError("--num_processes must be >= 1, got -2"))
    '--num_processes must be >= 1, got -2'
"""

from __future__ import annotations

__all__ = ["CLIError"]


class CLIError(ValueError):
    """A bad command line or configuration; ``accel`` prints it on one line and exits with 2."""
