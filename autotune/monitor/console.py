"""The CLI's terminal: commands get their consoles, tables and ERROR/WARNING/HINT lines here.

rich stays inside `autotune.monitor` (see there). Plain output (no control codes) when stdout
is not a terminal, with ``--plain``, or when ``NO_COLOR`` is set. Core logic never prints; it
returns values that these helpers render.
"""

from __future__ import annotations

import os
import sys

from rich.console import Console
from rich.table import Table

__all__ = ["Console", "Table", "make_console", "use_plain", "error", "warning", "hint"]


def is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def use_plain(stream, plain: bool) -> bool:
    """Plain lines for pipes and files, with ``--plain``, or when ``NO_COLOR`` is set."""
    return plain or bool(os.environ.get("NO_COLOR")) or not is_terminal(stream)


def make_console(*, plain: bool = False, stderr: bool = False) -> Console:
    stream = sys.stderr if stderr else sys.stdout
    plain = use_plain(stream, plain)
    return Console(file=stream, no_color=plain, highlight=False, soft_wrap=plain,
                   force_terminal=False if plain else None, emoji=False,
                   width=120 if plain else None)


def _say(prefix: str, message: str) -> None:
    print(f"{prefix}: {message}", file=sys.stderr, flush=True)


def error(message: str) -> None:
    _say("ERROR", message)


def warning(message: str) -> None:
    _say("WARNING", message)


def hint(message: str) -> None:
    _say("HINT", message)
