"""How MPS is found and configured: names every other module of `autotune.hardware.mps` shares.

The executable and how to find it, the environment variables the daemon and its clients read,
the daemon's files, the path limit it fails on silently, and `MpsError`. Kept apart from the
daemon so that asking whether MPS could run here (`available`) starts nothing; it imports no
other module of the package.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping

from autotune import LaunchError

BINARY = "nvidia-cuda-mps-control"
BINARY_ENV = "AUTOTUNE_MPS_CONTROL"
DIR_ENV = "AUTOTUNE_MPS_DIR"
KEEP_ENV = "AUTOTUNE_MPS_KEEP"
PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
LOG_ENV = "CUDA_MPS_LOG_DIRECTORY"
THREAD_PCT_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
PID_FILE = "nvidia-cuda-mps-control.pid"
OWNER_FILE = "autotune-owner.json"
DIR_PREFIX = "atmps-"
MAX_DIR_CHARS = 87


class MpsError(LaunchError):
    """The MPS daemon could not be started, reached or verified."""


def find_binary(env: Mapping[str, str] | None = None) -> str | None:
    """Path of ``nvidia-cuda-mps-control``: ``$AUTOTUNE_MPS_CONTROL``, else on ``PATH``."""
    env = os.environ if env is None else env
    explicit = env.get(BINARY_ENV)
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    return shutil.which(BINARY, path=env.get("PATH"))


def available(env: Mapping[str, str] | None = None) -> tuple[bool, str]:
    """Whether this controller could run MPS here, and if not, why."""
    binary = find_binary(env)
    explicit = (os.environ if env is None else env).get(BINARY_ENV)
    if binary is None and explicit:
        return False, f"{BINARY_ENV}={explicit!r} is not an executable file"
    if binary is None:
        return False, (f"{BINARY} not found on PATH (it ships with the NVIDIA driver's compute "
                       f"utilities; or set {BINARY_ENV})")
    from autotune.hardware import nvml

    ok, why = nvml.available()
    if not ok:
        return False, f"no GPU for MPS: {why}"
    return True, ""


def check_dir(path: str | os.PathLike, what: str) -> None:
    """Refuse a pipe/log directory the daemon would fail on without a word."""
    text = str(path)
    if len(text) > MAX_DIR_CHARS:
        raise MpsError(f"{what} {text!r} is {len(text)} characters long; the MPS daemon fails "
                       f"silently on paths over {MAX_DIR_CHARS}. Set {DIR_ENV} to a short "
                       f"directory such as /tmp")

