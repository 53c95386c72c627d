"""CUDA MPS: the control daemon's whole life, the one place ``nvidia-cuda-mps-control`` is run.

Facts from the NVIDIA MPS guide this package is built on:

* ``nvidia-cuda-mps-control -d`` starts the control daemon in the background. It and its clients
  meet through ``CUDA_MPS_PIPE_DIRECTORY`` (default /tmp/nvidia-mps) and log to
  ``CUDA_MPS_LOG_DIRECTORY`` (``control.log``: start-up, shutdown, every user command); the
  daemon writes ``nvidia-cuda-mps-control.pid`` in the pipe directory. We give every daemon its
  own short private directories, so ours never touches a system-wide one. Paths over ~87
  characters make the daemon fail *silently*: we refuse them up front.
* Commands go to the daemon on the stdin of ``nvidia-cuda-mps-control`` (``get_server_list``,
  ``get_client_list PID``, ``quit``...). ``quit`` terminates it.
* A CUDA client that cannot reach the daemon silently runs without MPS, so MPS is *verified*:
  every rank's pid must show up in ``get_client_list`` of a server (`MpsDaemon.verify`).
* ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` in a client's environment limits the share of the GPU's
  threads its context may use (`client_env`).
* Clients should end before the daemon does: killing an unsynchronised client can hang a server.

A started daemon is stopped (``quit``, then TERM/KILL of its pid if it does not go) on every exit
path of the controller: `stop` / the context manager, ``atexit`` (normal exit, an uncaught
exception, Ctrl-C unwinding to the CLI), and SIGTERM/SIGHUP, which are turned into ``SystemExit``
when no other handler is installed. Only SIGKILL of the controller leaves a daemon behind;
the next start finds and stops it (`reap_stale`).

Controller settings (environment): ``AUTOTUNE_MPS_CONTROL`` (path of the executable),
``AUTOTUNE_MPS_DIR`` (where private directories go, default /tmp), ``AUTOTUNE_MPS_KEEP=1``
(keep the directories and ``control.log`` after the daemon stopped).

Modules: `config` (names, paths, the executable), `daemon` (`MpsDaemon`: start, commands, stop;
a client's environment; the `shared` one), `verify` (`MpsCheck`: are the ranks really clients),
`registry` (the controller's daemons: `stop_all`, signal handlers, `reap_stale`), `process` (the
daemon's pid). Imports go one way, ``daemon`` -> ``verify``, ``registry``, ``process`` ->
``config``: no module imports one that imports it back. Callers use this package's names only.
"""

from autotune.hardware.mps.config import (BINARY, BINARY_ENV, DIR_ENV, DIR_PREFIX, KEEP_ENV,
                                          LOG_ENV, MAX_DIR_CHARS, OWNER_FILE, PID_FILE, PIPE_ENV,
                                          THREAD_PCT_ENV, MpsError, available, check_dir,
                                          find_binary)
from autotune.hardware.mps.daemon import MpsDaemon, client_env, shared, stop_shared
from autotune.hardware.mps.registry import reap_stale, stop_all
from autotune.hardware.mps.verify import MpsCheck

__all__ = [
    "BINARY", "BINARY_ENV", "DIR_ENV", "DIR_PREFIX", "KEEP_ENV", "LOG_ENV", "MAX_DIR_CHARS",
    "OWNER_FILE", "PID_FILE", "PIPE_ENV", "THREAD_PCT_ENV",
    "MpsCheck", "MpsDaemon", "MpsError",
    "available", "check_dir", "client_env", "find_binary",
    "reap_stale", "shared", "stop_all", "stop_shared",
]
