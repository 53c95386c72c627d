"""Output printed while the live view is up goes above it, whoever prints it.

rich's own redirection (``Live(redirect_stdout=True)``) hands a rich `Console` that writes to
``sys.stdout`` the real stream underneath (``rich_proxied_file``), so a command's rich table
printed during a run lands inside the live region and the next redraw erases part of it.
`Above` has no such escape hatch: every complete line written to it, plain or with ANSI styles
from another console, is decoded and printed through the live view's console, above the view.
"""

from __future__ import annotations

import io
import threading

from rich.ansi import AnsiDecoder
from rich.console import Console
from rich.text import Text


class Above(io.TextIOBase):
    """A text stream that prints complete lines above the live view of ``console``."""

    def __init__(self, console: Console, original):
        super().__init__()
        self._console = console
        self._original = original
        self._pending: list[str] = []
        self._lock = threading.Lock()
        self._decoder = AnsiDecoder()

    @property
    def original(self):
        return self._original

    @property
    def encoding(self):
        return getattr(self._original, "encoding", "utf-8")

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        try:
            return bool(self._original.isatty())
        except (AttributeError, ValueError):
            return False

    def fileno(self) -> int:
        return self._original.fileno()

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        with self._lock:
            self._pending.append(text)
            if "\n" not in text:
                return len(text)
            block, _, rest = "".join(self._pending).rpartition("\n")
            self._pending = [rest] if rest else []
        self._print(block)
        return len(text)

    def flush(self) -> None:
        with self._lock:
            block, self._pending = "".join(self._pending), []
        if block:
            self._print(block)

    def _print(self, block: str) -> None:
        lines = [line.rsplit("\r", 1)[-1] for line in block.split("\n")]  # progress bars: last
        try:
            text = Text("\n").join(self._decoder.decode_line(line) for line in lines)
            self._console.print(text, soft_wrap=True, highlight=False)
        except Exception:  # noqa: BLE001 - never lose the output: write it as it came
            try:
                self._original.write(block + "\n")
                self._original.flush()
            except Exception:  # noqa: BLE001
                pass
