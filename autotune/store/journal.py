"""The run journal: ``events.jsonl`` in every run directory, append-only, one event a line.

Each event is written with a single ``write`` on a file opened ``O_APPEND``, so concurrent writers
never interleave inside a line; a write that fails (disk full) is cut back off, so the file ends
on a whole line, and raises `autotune.store.rundir.write_error`'s one line. A crash can at worst
leave a last line without its newline; `read_events` skips any line that is incomplete or does
not parse, so readers never break, and a new `Journal` on that file ends the torn line first so
the next event stands on its own.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import time
from pathlib import Path

from autotune.store import jsontext, rundir
from autotune.store.events import Event, check

EVENTS = "events.jsonl"


class Journal:
    """Appends events to ``<run_dir>/events.jsonl``."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / EVENTS
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            _end_torn_line(fd)
        finally:
            os.close(fd)

    def emit(self, name: Event, /, **fields) -> dict:
        """Append one event; ``fields`` are the event's (`autotune.store.events.FIELDS`), and
        ``t`` may be given to replace the time now.

        Raises:
            ValueError: ``name`` or ``fields`` outside the schema (`autotune.store.events.check`).
        """
        event = {"t": time.time(), "event": check(name, fields).value, **fields}
        line = (jsontext.dumps(event, separators=(",", ":")) + "\n").encode()
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        except OSError as exc:
            raise rundir.write_error(self.path, exc) from None
        size = os.fstat(fd).st_size
        try:
            if os.write(fd, line) != len(line):
                raise OSError(errno.ENOSPC, "short write")
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            raise rundir.write_error(self.path, exc) from None
        finally:
            os.close(fd)
        return event


def _end_torn_line(fd: int) -> None:
    """A writer that died mid-line left no newline: end that line, so our first event is not
    glued to it (readers skip the torn line). A line still being copied in by a live writer
    looks the same; the newline then lands after it (appends are serialised) as an empty
    line, which readers skip too."""
    size = os.fstat(fd).st_size
    if size and os.pread(fd, 1, size - 1) != b"\n":
        os.write(fd, b"\n")


def read_events(run_dir: Path, *, offset: int = 0,
                skipped: list[int] | None = None) -> tuple[list[dict], int]:
    """Complete events from byte ``offset`` on, and the offset to continue from. A complete
    line that is not a JSON object (torn by a crash, or hand-edited) is left out; its byte
    offset in the journal is appended to ``skipped`` when one is given."""
    path = Path(run_dir) / EVENTS
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    events = []
    end = data.rfind(b"\n") + 1  # an unterminated last line is not complete yet
    at = 0
    for line in data[:end].split(b"\n")[:-1]:
        try:
            event = json.loads(line) if line.strip() else None
        except ValueError:
            event = line  # not JSON
        if isinstance(event, dict):
            events.append(event)
        elif event is not None and skipped is not None:
            skipped.append(offset + at)
        at += len(line) + 1
    return events, offset + end
