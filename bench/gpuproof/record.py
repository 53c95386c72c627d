"""A step's record: what ran, what was skipped and why, the numbers; kept on disk per step.

Each step writes ``<out>/steps/<name>.json`` (atomically) as it ends, so a later invocation
with other ``--steps`` adds to the same report (a device lease may allow 10 minutes a command).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

STEPS = ("env", "tests", "probe", "tune", "energy", "measure")
STATUSES = ("ok", "incomplete", "failed", "skipped")


@dataclass
class Step:
    """One step. ``status``: ok, incomplete (ran, but part of it was skipped), failed, skipped.
    ``reason`` is one line; ``lines`` say, in order, what ran and how it ended."""

    name: str
    status: str = "ok"
    reason: str = ""
    lines: list[str] = field(default_factory=list)
    data: dict = field(default_factory=dict)
    started: str = field(default_factory=lambda: time.strftime("%Y-%m-%d %H:%M:%S"))
    duration_s: float = 0.0

    def say(self, line: str) -> None:
        self.lines.append(line)
        print(f"[{self.name}] {line}", flush=True)

    def skip(self, reason: str) -> Step:
        self.status, self.reason = "skipped", reason
        self.say(f"skipped: {reason}")
        return self

    def fail(self, reason: str) -> None:
        """Mark failed; the first failure is the reason, later ones are lines."""
        if self.status != "failed":
            self.status, self.reason = "failed", reason
        self.say(f"FAILED: {reason}")

    def partial(self, reason: str, *, say: bool = True) -> None:
        """Mark incomplete (unless already failed): something inside was skipped or is missing."""
        if self.status == "ok":
            self.status, self.reason = "incomplete", reason
        if say:
            self.say(f"incomplete: {reason}")

    def to_dict(self) -> dict:
        return asdict(self)


def write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix="." + path.name)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def dumps(obj) -> str:
    """Strict JSON: a non-finite number is ``null``."""
    def clean(v):
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {str(k): clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        return v
    return json.dumps(clean(obj), indent=2, default=str, allow_nan=False)


def save(out: Path, step: Step) -> None:
    write_atomic(out / "steps" / f"{step.name}.json", dumps(step.to_dict()))


def load_all(out: Path) -> dict[str, dict]:
    """Every step recorded under ``out``, in the kit's order."""
    found = {}
    for name in STEPS:
        path = out / "steps" / f"{name}.json"
        if path.exists():
            found[name] = json.loads(path.read_text())
    return found
