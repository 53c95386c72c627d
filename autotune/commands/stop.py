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
from autotune.launching import rank_command
from autotune.monitor.runs import Status, info
from autotune.store import controller as controllers, rundir
from autotune.store.events import Event
from autotune.store.journal import Journal

GRACE_S = 60.0
RANKS_GRACE_S = 10.0  # the run's processes, from their SIGTERM to their SIGKILL
ENDING_S = 20.0  # the controller, from its processes' end to its own
POLL_S = 0.2
MPS_PREFIX = "nvidia-cuda-mps"  # the control daemon and its server


def add_parser(sub):
    p = sub.add_parser("stop", help="stop a run as Ctrl-C would",
                       description="Send the run's controller SIGINT, as Ctrl-C in its terminal "
                                   "would: a probe or the full run's ranks stop at a batch "
                                   "boundary, the journal and what was found are written, and "
                                   "no process of the run is left. Waits until it has ended. "
                                   "Processes of the run still there after the grace get "
                                   "SIGTERM, and SIGKILL 10 s later, as a second Ctrl-C would "
                                   "(the controller still writes the run's end).")
    p.add_argument("run", metavar="RUN",
                   help="the run's id (a unique prefix is enough) or its directory")
    p.add_argument("--grace", type=positive_float, default=GRACE_S, metavar="S",
                   help=f"seconds to wait for the run to end before its processes get "
                        f"SIGTERM (default {GRACE_S:g})")
    p.add_argument("--kill", action="store_true",
                   help="after the grace, kill the controller and every process of the run "
                        "(SIGKILL) at once and end its journal (exit code 137)")
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


def _under(ctl: controllers.Controller, *, spare_mps: bool = False
           ) -> tuple[psutil.Process | None, list, set[int]]:
    """The controller's process, every process under it, and their process groups (each rank
    is one, with its DataLoader workers), the controller's own and ours left out.
    ``spare_mps``: an MPS daemon the controller started is left to it (it stops one with
    ``quit`` on its way out, as NVIDIA's guide asks; a signal could leave its server behind)."""
    try:
        root = psutil.Process(ctl.pid)
        tree = root.children(recursive=True)
    except psutil.Error:
        root, tree = None, []
    if spare_mps:
        tree = [p for p in tree if not _is_mps(p)]
    groups = set()
    for p in tree:
        try:
            groups.add(os.getpgid(p.pid))
        except OSError:
            pass
    for pid in (ctl.pid, 0):
        try:
            groups.discard(os.getpgid(pid))
        except OSError:
            pass
    return root, tree, groups


def _is_mps(p: psutil.Process) -> bool:
    try:
        return p.name().startswith(MPS_PREFIX)
    except psutil.Error:
        return False


def _command(cmdline: list[str]) -> str:
    """A process's command in a few words: a rank's script, not the interpreter and the
    probes that start it."""
    words = rank_command.user_command(cmdline)
    if not words:
        return "?"
    return " ".join([os.path.basename(words[0]), *words[1:3]])[:60]


def _described(procs: list[psutil.Process]) -> str:
    said = []
    for p in procs[:4]:
        try:
            said.append(f"pid {p.pid} ({_command(p.cmdline())})")
        except psutil.Error:
            pass
    more = f" and {len(procs) - 4} more" if len(procs) > 4 else ""
    return ", ".join(said) + more if said else "gone by now"


def _signal_groups(groups: set[int], sig: int) -> None:
    for pgid in groups:
        try:
            os.killpg(pgid, sig)
        except OSError:
            pass


def _kill_all(tree: list[psutil.Process], groups: set[int]) -> None:
    """SIGKILL each group whole, then each process (one that left its group among them)."""
    _signal_groups(groups, signal.SIGKILL)
    for p in tree:
        try:
            p.kill()
        except psutil.Error:
            pass


def _end_ranks(ctl: controllers.Controller, run_dir) -> None:
    """The run outstayed its grace: its ranks get SIGTERM, and SIGKILL `RANKS_GRACE_S` later,
    as a second Ctrl-C does in its terminal. The controller stays: it sees them end and writes
    the run's end, as for any stop."""
    _, tree, groups = _under(ctl, spare_mps=True)
    if not tree:
        print(f"autotune: run {run_dir.name} is still stopping, and no process of it is left "
              f"but its controller (pid {ctl.pid})", file=sys.stderr, flush=True)
        return
    print(f"autotune: run {run_dir.name} is still stopping; its processes ({_described(tree)}) "
          f"get SIGTERM, and SIGKILL {RANKS_GRACE_S:g} s later, as a second Ctrl-C would",
          file=sys.stderr, flush=True)
    _signal_groups(groups, signal.SIGTERM)
    if _wait_gone(ctl, RANKS_GRACE_S):
        return
    _kill_all(*_under(ctl, spare_mps=True)[1:])


def _kill(ctl: controllers.Controller, run_dir, grace_s: float) -> None:
    """SIGKILL the controller and every process under it (each rank's group whole), and end
    the journal it could not end."""
    root, tree, groups = _under(ctl)
    if root is not None and ctl.alive():
        root.kill()
    _kill_all(tree, groups)
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
        if args.kill:
            _kill(ctl, run_dir, args.grace)
        else:
            _end_ranks(ctl, run_dir)
            if not _wait_gone(ctl, ENDING_S):
                raise AutotuneError(f"run {run_dir.name} has not ended within {args.grace:g} s "
                                    f"and the SIGTERM of its processes (pid {ctl.pid} is still "
                                    f"stopping it); 'autotune stop --kill {run_dir.name}' kills "
                                    f"it")
    after = info(run_dir)
    code = "" if after.exit_code is None else f", exit code {after.exit_code}"
    print(f"run {after.id} {after.state_text}{code}")
    return 0
