"""Reading a rank's log: its end for a failed result, and what it gained since the last look.

The trial runner (`autotune.measuring.trial`) shows the end of rank 0's log with a failure (`tail`), gives
its last line to the classifier (`last_line`, `autotune.measuring.outcome`) and, with ``--metric``, feeds
what the log gained while the probe runs to `autotune.measuring.metric` (`Reader`). Apart from
`autotune.measuring.series` so that module stays pure.
"""

from __future__ import annotations

import codecs
import os
from pathlib import Path

TAIL_BYTES = 16384  # how far back from the end `tail` reads
KEEP_HEAD_BYTES = 1 << 20  # what a capped probe log keeps of its start ...
KEEP_TAIL_BYTES = 1 << 20  # ... and of its end


def tail(path: Path, lines: int = 15) -> str:
    """The last ``lines`` lines of a log (from its last 16 KiB); "" when it cannot be read."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - TAIL_BYTES))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def last_line(text: str) -> str:
    """The last non-blank line of ``text``, stripped, at most 300 characters."""
    for line in reversed(text.splitlines()):
        if line.strip():
            return line.strip()[:300]
    return ""


class Reader:
    """What a log gained since the last read, as text; reading starts where the log ends now.

    UTF-8 is decoded incrementally: a character split between two reads comes out whole.
    """

    def __init__(self, path: Path):
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def read(self, *, final: bool = False) -> str | None:
        """The text added since the last read; None when the log cannot be read (yet)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
                self.offset = f.tell()
        except OSError:
            return None
        return self._decoder.decode(data, final=final)


def cap(path: Path, *, head_bytes: int = KEEP_HEAD_BYTES, tail_bytes: int = KEEP_TAIL_BYTES) -> int:
    """Shrink a finished log to its first ``head_bytes`` and last ``tail_bytes``, cut at line ends,
    with one line between them that says how much was dropped. Returns the bytes dropped (0 when
    the log was small enough or cannot be read). Call it only once nothing writes the log."""
    try:
        size = path.stat().st_size
        if size <= head_bytes + tail_bytes:
            return 0
        with open(path, "rb") as f:
            head = f.read(head_bytes)
            f.seek(size - tail_bytes)
            tail = f.read()
    except OSError:
        return 0
    cut = head.rfind(b"\n")
    head = head[:cut + 1] if cut >= 0 else head
    start = tail.find(b"\n")
    tail = tail[start + 1:] if 0 <= start < len(tail) - 1 else tail
    dropped = size - len(head) - len(tail)
    note = (f"[autotune: {dropped} bytes of this log dropped here; it keeps its first "
            f"{len(head)} and last {len(tail)} bytes]\n").encode()
    tmp = path.with_name(path.name + ".capped")
    try:
        tmp.write_bytes(head + note + tail)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)
        return 0
    return dropped
