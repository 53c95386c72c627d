"""Files a probe writes into the user's tree, seen from inside the training process.

A probe runs the script where the user would, so relative paths resolve as they do without
autotune, and a checkpoint or output the script writes lands in the user's tree, perhaps over a
file that was there. The functions Python code creates, truncates, deletes or renames files
with are wrapped: ``open`` (``builtins.open`` and ``io.open``, which ``pathlib`` and
``logging`` call), ``os.open``, ``os.remove``, ``os.unlink``, ``os.rmdir``, ``os.rename``,
``os.replace``, ``os.truncate``, ``shutil.rmtree`` and ``torch.save`` (which writes a path
from C++). A call notes its path, before it acts, when the path lies under a watched directory
(``AUTOTUNE_WATCH_DIRS``: the user's working directory and the script's) but outside the
probe's own scratch directory (``AUTOTUNE_SCRATCH_DIR``, the ``--probe-cwd`` of an isolated
probe). Each new path goes to the controller once, as a ``seen`` message ``{what: "writes",
paths: [{path, op, existed}]}``. Python's bytecode cache (``__pycache__``) is not the user's
data and is left out.

Wrappers, not an audit hook (PEP 578): an audit hook is called on every audited event, and a
training step raises many that write nothing (torch's optimizer step calls ``id()`` about 16
times, each one an event): 0.4-1 us each here, about 1% of a 0.6 ms step, which the
measurement then counted against the script. A wrapper costs only on the calls it wraps. What
it cannot see: a reference taken before it was installed (``from os import remove`` in a
module imported before the script), and files written by native code past these functions
(which the audit hook missed too).

Nothing is blocked: the script behaves as it would without autotune; the user is told.
"""

from __future__ import annotations

import builtins
import functools
import io
import os
import shutil
import sys
import threading

from probes import protocol

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
WRITE_MODES = "wax+"  # an ``open`` mode with any of these writes
MAX_PATHS = 200  # per process; a script writing thousands of files is reported by its first


def dirs_from_env(env) -> tuple[list[str], str | None]:
    """(watched directories, scratch directory) as the controller set them."""
    watch = [d for d in env.get(protocol.ENV_WATCH_DIRS, "").split(os.pathsep) if d]
    scratch = env.get(protocol.ENV_SCRATCH_DIR) or None
    return watch, scratch


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def reportable(path: str, watch: list[str], scratch: str | None) -> bool:
    """True for an absolute, resolved path in the user's tree. Pure."""
    if not any(_under(path, d) for d in watch):
        return False
    if scratch and _under(path, scratch):
        return False
    return "__pycache__" not in path.split(os.sep)


def _arg(args: tuple, kwargs: dict, i: int, name: str, default=None):
    return args[i] if len(args) > i else kwargs.get(name, default)


def _path(raw) -> bool:
    """A path (not a file descriptor)."""
    return isinstance(raw, (str, bytes, os.PathLike))


def opened(args: tuple, kwargs: dict) -> list[tuple[str, str]]:
    """``open(file, mode="r", ...)``: the file, where the mode writes."""
    file, mode = _arg(args, kwargs, 0, "file"), _arg(args, kwargs, 1, "mode", "r")
    if _path(file) and isinstance(mode, str) and any(c in mode for c in WRITE_MODES):
        return [(file, "write")]
    return []


def os_opened(args: tuple, kwargs: dict) -> list[tuple[str, str]]:
    """``os.open(path, flags, mode=0o777, *, dir_fd=None)``: the path, where the flags write."""
    path, flags = _arg(args, kwargs, 0, "path"), _arg(args, kwargs, 1, "flags", 0)
    if _path(path) and isinstance(flags, int) and flags & WRITE_FLAGS and \
            _no_dir_fd(path, kwargs.get("dir_fd")):
        return [(path, "write")]
    return []


def removed(args: tuple, kwargs: dict) -> list[tuple[str, str]]:
    """``os.remove``/``os.unlink``/``os.rmdir(path, *, dir_fd=None)``, ``shutil.rmtree(path)``."""
    path = _arg(args, kwargs, 0, "path")
    return [(path, "delete")] if _path(path) and _no_dir_fd(path, kwargs.get("dir_fd")) else []


def renamed(args: tuple, kwargs: dict) -> list[tuple[str, str]]:
    """``os.rename``/``os.replace(src, dst, *, src_dir_fd=None, dst_dir_fd=None)``: both."""
    pairs = ((_arg(args, kwargs, 0, "src"), kwargs.get("src_dir_fd")),
             (_arg(args, kwargs, 1, "dst"), kwargs.get("dst_dir_fd")))
    return [(p, "rename") for p, fd in pairs if _path(p) and _no_dir_fd(p, fd)]


def truncated(args: tuple, kwargs: dict) -> list[tuple[str, str]]:
    """``os.truncate(path, length)``: the path (not a descriptor)."""
    path = _arg(args, kwargs, 0, "path")
    return [(path, "truncate")] if _path(path) else []


def _no_dir_fd(path, dir_fd) -> bool:
    # A path relative to a directory descriptor (shutil.rmtree's own unlinks) says nothing
    # about where it is; the rmtree call on its top directory is reported instead.
    return dir_fd in (None, -1) or os.path.isabs(os.fsdecode(path))


class WriteWatch:
    """The wrappers of one process and the paths they have reported."""

    def __init__(self, meter, watch: list[str], scratch: str | None):
        self.meter = meter
        self.watch = [os.path.realpath(d) for d in watch]
        self.scratch = os.path.realpath(scratch) if scratch else None
        self.reported: set[str] = set()
        self._noting = threading.local()  # a thread noting a path: its own calls meanwhile

    def install(self) -> None:
        if not self.watch:
            return
        wrapped_open = self._wrapped(builtins.open, opened)
        builtins.open = io.open = wrapped_open
        for name, paths in (("open", os_opened), ("remove", removed), ("unlink", removed),
                            ("rmdir", removed), ("rename", renamed), ("replace", renamed),
                            ("truncate", truncated)):
            setattr(os, name, self._wrapped(getattr(os, name), paths))
        shutil.rmtree = self._wrapped(shutil.rmtree, removed)
        torch = sys.modules.get("torch")
        if torch is not None:
            torch.save = self._wrapped(torch.save, lambda a, kw: [
                (f, "write") for f in [_arg(a, kw, 1, "f")] if _path(f)])

    def _wrapped(self, fn, paths):
        """``fn``, noting first the paths a call of it writes (``paths(args, kwargs)``)."""
        watch = self

        noting = self._noting

        @functools.wraps(fn)
        def call(*args, **kwargs):
            # what noting a path calls is not noted; another thread's calls meanwhile are
            if not getattr(noting, "on", False):
                noting.on = True
                try:
                    for raw, op in paths(args, kwargs):
                        watch._note(raw, op)
                except Exception:  # noqa: BLE001 - watching must never break the script
                    pass
                finally:
                    noting.on = False
            return fn(*args, **kwargs)

        return call

    def _note(self, raw, op: str) -> None:
        if isinstance(raw, bytes):
            raw = os.fsdecode(raw)
        elif hasattr(raw, "__fspath__"):
            raw = os.fspath(raw)
        if not isinstance(raw, str) or len(self.reported) >= MAX_PATHS:
            return
        path = os.path.join(os.path.realpath(os.path.dirname(os.path.abspath(raw))),
                            os.path.basename(raw))
        if path in self.reported or not reportable(path, self.watch, self.scratch):
            return
        self.reported.add(path)
        self.meter.send(protocol.SEEN, what="writes", note="",
                        paths=[{"path": path, "op": op, "existed": os.path.lexists(path)}])


def watch(meter, env=None) -> WriteWatch:
    """Install the wrappers for the directories in ``env`` (default: this process's)."""
    env = os.environ if env is None else env
    dirs, scratch = dirs_from_env(env)
    w = WriteWatch(meter, dirs, scratch)
    w.install()
    return w
