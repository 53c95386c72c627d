"""Files a probe writes into the user's tree, seen from inside the training process.

A probe runs the script where the user would, so relative paths resolve as they do without
autotune, and a checkpoint or output the script writes lands in the user's tree, perhaps over a
file that was there. An audit hook (PEP 578) on the events that create, truncate, delete or
rename files notes every path under a watched directory (``AUTOTUNE_WATCH_DIRS``: the user's
working directory and the script's) but outside the probe's own scratch directory
(``AUTOTUNE_SCRATCH_DIR``, the ``--probe-cwd`` of an isolated probe). Each new path goes to the
controller once, as a ``seen`` message ``{what: "writes", paths: [{path, op, existed}]}``.
Python's bytecode cache (``__pycache__``) is not the user's data and is left out. ``torch.save``
to a path writes from C++, past the audit hook, so it is wrapped to report its path too.

Nothing is blocked: the script behaves as it would without autotune; the user is told.
"""

from __future__ import annotations

import functools
import os
import sys

from probes import protocol

WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
EVENTS = frozenset({"open", "os.remove", "os.rename", "os.truncate", "shutil.rmtree",
                    "os.rmdir"})
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


def written_paths(event: str, args: tuple) -> list[tuple[str, str]]:
    """(path as given, operation) for an audit event that changes files; [] for the rest."""
    if event == "open":
        path, _mode, flags = args
        if isinstance(flags, int) and flags & WRITE_FLAGS:
            return [(path, "write")]
        return []
    if event == "os.rename":
        return [(p, "rename") for p, fd in ((args[0], args[2]), (args[1], args[3]))
                if _no_dir_fd(p, fd)]
    if event == "os.truncate":
        return [(args[0], "truncate")]
    if event in ("os.remove", "os.rmdir", "shutil.rmtree") and _no_dir_fd(args[0], args[1]):
        return [(args[0], "delete")]
    return []


def _no_dir_fd(path, dir_fd) -> bool:
    # A path relative to a directory descriptor (shutil.rmtree's own unlinks) says nothing
    # about where it is; the rmtree event for its top directory is reported instead.
    return dir_fd in (None, -1) or os.path.isabs(os.fsdecode(path))


class WriteWatch:
    """The audit hook of one process and the paths it has reported."""

    def __init__(self, meter, watch: list[str], scratch: str | None):
        self.meter = meter
        self.watch = [os.path.realpath(d) for d in watch]
        self.scratch = os.path.realpath(scratch) if scratch else None
        self.reported: set[str] = set()
        self._busy = False

    def install(self) -> None:
        if not self.watch:
            return
        sys.addaudithook(self._hook)
        torch = sys.modules.get("torch")
        if torch is not None:
            self._wrap_save(torch)

    def _wrap_save(self, torch) -> None:
        save = torch.save
        watch = self

        @functools.wraps(save)
        def saved(obj, f, *args, **kwargs):
            if isinstance(f, (str, bytes, os.PathLike)):
                try:
                    watch._note(f, "write")
                except Exception:  # noqa: BLE001 - watching must never break the script
                    pass
            return save(obj, f, *args, **kwargs)

        torch.save = saved

    def _hook(self, event: str, args: tuple) -> None:
        if event not in EVENTS or self._busy:
            return
        self._busy = True
        try:
            for raw, op in written_paths(event, args):
                self._note(raw, op)
        except Exception:  # noqa: BLE001 - watching must never break the script
            pass
        finally:
            self._busy = False

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
    """Install the hook for the directories in ``env`` (default: this process's)."""
    env = os.environ if env is None else env
    dirs, scratch = dirs_from_env(env)
    w = WriteWatch(meter, dirs, scratch)
    w.install()
    return w
