"""autotune: tune the system knobs of an unmodified PyTorch training script by measuring it.

The package root holds the version, the error tree every part raises (a message names what
failed, the value, where the log is, and what to do), and `Note`, the one shape in which every
layer tells the user something that is not an error. Code decides on a note's `kind`, never on
its text.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

__version__ = "0.1.0"


class NoteKind(str, enum.Enum):
    """How much a note matters; the CLI prefixes it (`WARNING:`, `HINT:`), info goes bare."""

    INFO = "info"
    HINT = "hint"
    WARNING = "warning"


@dataclass(frozen=True)
class Note:
    """Something autotune tells the user: what it did, what it saw, what to do."""

    kind: NoteKind
    text: str

    def __str__(self) -> str:
        return self.text if self.kind is NoteKind.INFO else f"{self.kind.value.upper()}: {self.text}"

    def to_dict(self) -> dict:
        return {"kind": self.kind.value, "text": self.text}

    @classmethod
    def from_dict(cls, d: Mapping) -> Note:
        return cls(NoteKind(d["kind"]), str(d["text"]))

    @classmethod
    def warning(cls, text: str) -> Note:
        return cls(NoteKind.WARNING, text)

    @classmethod
    def hint(cls, text: str) -> Note:
        return cls(NoteKind.HINT, text)

    @classmethod
    def info(cls, text: str) -> Note:
        return cls(NoteKind.INFO, text)


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
