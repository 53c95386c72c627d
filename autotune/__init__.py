"""autotune: tune the system knobs of an unmodified PyTorch training script by measuring it.

The package root holds the version and the error tree every part raises: a message names what
failed, the value, where the log is, and what to do.
"""

from __future__ import annotations

__version__ = "0.1.0"


class AutotuneError(Exception):
    """Base of every error autotune raises on purpose."""

    exit_code = 1


class UsageError(AutotuneError):
    """Bad command-line input: one line, exit code 2, no traceback."""

    exit_code = 2


class RecipeError(UsageError):
    """A recipe file that cannot be used (corrupt, missing field, unknown schema)."""


class LaunchError(AutotuneError):
    """A training process could not be started or supervised."""


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP reached the controller: unwind like Ctrl-C, so every child is stopped."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum
