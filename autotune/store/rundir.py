"""Run directories: one per tune/probe/run, private to the user (mode 0700)."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

ENV_RUNS_DIR = "AUTOTUNE_RUNS_DIR"


def runs_root() -> Path:
    """``$AUTOTUNE_RUNS_DIR``, else ``~/.autotune/runs``."""
    root = os.environ.get(ENV_RUNS_DIR)
    return Path(root).expanduser() if root else Path.home() / ".autotune" / "runs"


def _private_dir(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)
    return path


def new_run_dir(kind: str, script: str, *, root: Path | None = None) -> Path:
    """A fresh ``<root>/<date>-<time>-<kind>-<script>[-N]`` directory, mode 0700."""
    root = _private_dir(root or runs_root())
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(script).stem)[:40] or "script"
    base = f"{time.strftime('%Y%m%d-%H%M%S')}-{kind}-{stem}"
    for n in range(1000):
        path = root / (base if n == 0 else f"{base}-{n}")
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            continue
        os.chmod(path, 0o700)
        return path
    raise RuntimeError(f"cannot create a run directory under {root}")


def latest_run_dir(root: Path | None = None) -> Path | None:
    root = root or runs_root()
    if not root.is_dir():
        return None
    runs = [p for p in root.iterdir() if p.is_dir()]
    return max(runs, key=lambda p: p.stat().st_mtime, default=None)


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write a file so a reader never sees half of it: temp file, fsync, rename."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    mode = "wb" if isinstance(data, bytes) else "w"
    with open(tmp, mode) as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
