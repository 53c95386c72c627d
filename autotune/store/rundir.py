"""Run directories: one per tune/probe/run, private to the user (mode 0700), found by id.

A run's id is its directory's name; a unique prefix of it is enough (`resolve`)."""

from __future__ import annotations

import errno
import os
import re
import time
from pathlib import Path

from autotune import AutotuneError, UsageError

ENV_RUNS_DIR = "AUTOTUNE_RUNS_DIR"
OUTPUT = "output.log"  # what a detached controller's terminal would have shown


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


def run_dirs(root: Path | None = None) -> list[Path]:
    """The run directories under ``root`` (default `runs_root`), newest first."""
    root = Path(root) if root else runs_root()
    try:
        found = [p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")]
    except OSError:
        return []
    return sorted(found, key=lambda p: (p.name[:15], p.stat().st_mtime, p.name), reverse=True)


def resolve(ref: str, root: Path | None = None) -> Path:
    """The run ``ref`` names: a run directory's path, or a run id or its unique prefix under
    ``root``. A `UsageError` (one line, exit 2) for no match, several, or another user's run."""
    where = Path(root) if root else runs_root()
    path = Path(ref).expanduser()
    if os.sep in ref or ref.startswith("."):
        if not path.is_dir():
            raise UsageError(f"run directory {ref!r} not found")
        return _owned(path)
    exact = where / ref
    if ref and exact.is_dir():
        return _owned(exact)
    matches = [p for p in run_dirs(where) if p.name.startswith(ref)] if ref else []
    if not matches and path.is_dir():  # a directory named relative to here
        return _owned(path)
    if not matches:
        raise UsageError(f"no run {ref!r} under {where}; 'autotune ps --all"
                         f"{'' if root is None else f' --runs-dir {root}'}' lists them")
    if len(matches) > 1:
        names = ", ".join(p.name for p in matches[:3]) + (", ..." if len(matches) > 3 else "")
        raise UsageError(f"run id {ref!r} is ambiguous: {len(matches)} runs start with it "
                         f"({names}); give more of it")
    return _owned(matches[0])


def _owned(path: Path) -> Path:
    """Another user's run is theirs to control (and its mode 0700 hides it anyway)."""
    try:
        uid = path.stat().st_uid
    except OSError as exc:
        raise UsageError(f"cannot read run directory {path}: {exc.strerror}") from None
    if uid != os.getuid():
        try:
            import pwd
            owner = pwd.getpwuid(uid).pw_name
        except (ImportError, KeyError):
            owner = f"uid {uid}"
        raise UsageError(f"run {path.name} belongs to another user ({owner}); only its owner "
                         f"can read or control it")
    return path


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write a file so a reader never sees half of it: temp file, fsync, rename. A failure is
    `write_error`'s one line, the old file left as it was."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    mode = "wb" if isinstance(data, bytes) else "w"
    try:
        with open(tmp, mode) as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise write_error(path, exc) from None


_CAUSES = {errno.ENOSPC: "disk full", errno.EDQUOT: "disk quota exceeded",
           errno.EACCES: "permission denied", errno.EPERM: "permission denied",
           errno.EROFS: "read-only file system"}


def write_error(path, exc: OSError | str) -> AutotuneError:
    """The one line for a write that failed: the path and the cause (disk full, permission)."""
    cause = exc if isinstance(exc, str) else \
        _CAUSES.get(exc.errno, exc.strerror or type(exc).__name__)
    return AutotuneError(f"cannot write {path}: {cause}")
