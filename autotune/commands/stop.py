"""``autotune stop RUN [--kill]``: stop a run as Ctrl-C does, from any terminal."""

from __future__ import annotations

import os
import signal
import sys
import time

import psutil

from autotune import AutotuneError, UsageError
from autotune.commands.monitor import add_runs_dir_arg, runs_root
from autotune.commands.common import positive_float
from autotune.monitor.runs import Status, info
from autotune.store import controller as controllers, rundir
from autotune.store.events import Event
from autotune.store.journal import Journal

GRACE_S = 60.0
POLL_S = 0.2


def add_parser(sub):
    p = sub.add_parser("stop", help="stop a run as Ctrl-C would",
                       description="Send the run's controller SIGINT, as Ctrl-C in its terminal "
                                   "would: a probe or the full run's ranks stop at a batch "
                                   "boundary, the journal and what was found are written, and "
                                   "no process of the run is left. Waits until it has ended.")
    p.add_argument("run", metavar="RUN",
                   help="the run's id (a unique prefix is enough) or its directory")
    p.add_argument("--grace", type=positive_float, default=GRACE_S, metavar="S",
                   help=f"seconds to wait for the run to end (default {GRACE_S:g})")
    p.add_argument("--kill", action="store_true",
                   help="after the grace, kill the controller and every process of the run "
                        "(SIGKILL) and end its journal (exit code 137)")
    add_runs_dir_arg(p)
    return p


def _live_controller(run_dir) -> controllers.Controller:
    """The run's controller, alive here; a `UsageError` for a run with nothing to stop."""
    now = info(run_dir)
    if now.status is Status.LOST:
        raise UsageError(f"run {now.id} is lost: its controller (pid {now.pid}) died without "
                         f"writing its end; nothing to stop ('autotune run --again "
                         f"{now.id}' starts a full run again)")
    if not now.status.live:
        code = "" if now.exit_code is None else f", exit code {now.exit_code}"
        raise UsageError(f"run {now.id} has already ended ({now.state_text}{code}); nothing "
                         f"to stop")
    ctl = controllers.controller(run_dir)
    if ctl is None:
        raise UsageError(f"run {now.id} is still starting and has no controller yet; try "
                         f"again in a moment")
    if not ctl.here:
        raise UsageError(f"run {now.id} is controlled from host {ctl.host} (pid {ctl.pid}); "
                         f"stop it there")
    return ctl


def _wait_gone(ctl: controllers.Controller, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not ctl.alive():
            return True
        time.sleep(POLL_S)
    return not ctl.alive()


def _kill(ctl: controllers.Controller, run_dir, grace_s: float) -> None:
    """SIGKILL the controller and every process under it (each rank's group whole), and end
    the journal it could not end."""
    try:
        root = psutil.Process(ctl.pid)
        tree = root.children(recursive=True)
    except psutil.Error:
        root, tree = None, []
    groups = set()
    for p in tree:
        try:
            groups.add(os.getpgid(p.pid))
        except OSError:
            pass
    if root is not None and ctl.alive():
        root.kill()
    for pgid in groups - {os.getpgid(0)}:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except OSError:
            pass
    for p in tree:
        try:
            p.kill()
        except psutil.Error:
            pass
    _wait_gone(ctl, 10.0)
    if info(run_dir).status is Status.LOST:
        Journal(run_dir).emit(Event.RUN_ENDED, exit_code=128 + signal.SIGKILL,
                              error=f"killed by 'autotune stop --kill' after {grace_s:g} s")


def run(args) -> int:
    run_dir = rundir.resolve(args.run, runs_root(args))
    ctl = _live_controller(run_dir)
    try:
        os.kill(ctl.pid, signal.SIGINT)
    except ProcessLookupError:
        pass
    except PermissionError:
        raise UsageError(f"run {run_dir.name}'s controller (pid {ctl.pid}) is not ours to "
                         f"signal") from None
    print(f"autotune: stopping run {run_dir.name} (pid {ctl.pid}) as Ctrl-C would; waiting "
          f"up to {args.grace:g} s", file=sys.stderr, flush=True)
    if not _wait_gone(ctl, args.grace):
        if not args.kill:
            raise AutotuneError(f"run {run_dir.name} has not ended within {args.grace:g} s "
                                f"(pid {ctl.pid} is still stopping it); 'autotune stop --kill "
                                f"{run_dir.name}' kills it")
        _kill(ctl, run_dir, args.grace)
    after = info(run_dir)
    code = "" if after.exit_code is None else f", exit code {after.exit_code}"
    print(f"run {after.id} {after.state_text}{code}")
    return 0
