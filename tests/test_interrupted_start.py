"""Ctrl-C at any instant of a probe's start leaves no process behind.

A search journals ``trial_started`` before the ranks exist, so a Ctrl-C sent on seeing it lands
anywhere in starting them: inside `proc.start` after the fork, between a start returning and
its caller keeping the launch, after the group is up but before the probe holds it. CI once
caught a rank alive after ``tune`` had exited 130. Each instant is hit here with a real rank;
and a controller that exits holding a launch nobody stopped stops it on its way out."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import uuid

import pytest

from autotune.hardware import proc
from autotune.launching import group
from autotune.measuring import trial
from autotune.measuring.trial import TrialSpec, run_trial
from conftest import SCRIPTS, live_children, trial_processes, wait_for

pytestmark = pytest.mark.slow


class CtrlC(KeyboardInterrupt):
    """The interrupt of these tests (told apart from a real one)."""


def _after(fn):
    """``fn`` runs, then Ctrl-C lands before its result reaches the caller."""
    def wrapped(*args, **kwargs):
        fn(*args, **kwargs)
        raise CtrlC
    return wrapped


def _instead(*args, **kwargs):
    raise CtrlC


def _raise_ctrl_c(signum, frame):
    raise CtrlC


def _signal_inside_popen(monkeypatch):
    """A real SIGINT, delivered while ``Popen`` has the child but has not returned it: the
    handler runs in the main thread at once (``raise_signal``), so without holding it the
    interrupt leaves ``Popen`` and the pid is lost. The test restores SIGINT's handler."""
    signal.signal(signal.SIGINT, _raise_ctrl_c)
    recording = proc.subprocess.Popen

    def popen(*args, **kwargs):
        p = recording(*args, **kwargs)
        signal.raise_signal(signal.SIGINT)
        return p
    monkeypatch.setattr(proc.subprocess, "Popen", popen)


def _first_tree(monkeypatch):
    calls = []
    real = proc.Launched.tree

    def tree(self):
        calls.append(self.pid)
        if len(calls) == 1:  # the call inside `proc.start`, the child already forked
            raise CtrlC
        return real(self)
    monkeypatch.setattr(proc.Launched, "tree", tree)


INSTANTS = {
    "inside Popen, after the fork (a real signal)": _signal_inside_popen,
    "inside proc.start, after the fork": _first_tree,
    "proc.start returned, launch not yet kept":
        lambda mp: mp.setattr(proc, "start", _after(proc.start)),
    "ranks started, group not yet built":
        lambda mp: mp.setattr(group, "RankGroup", _instead),
    "group returned, not yet held by the probe":
        lambda mp: mp.setattr(trial, "start_group", _after(group.start_group)),
    "group held, energy meter starting":
        lambda mp: mp.setattr(trial, "EnergyMeter", _instead),
}


@pytest.mark.parametrize("instant", list(INSTANTS))
def test_ctrl_c_at_any_instant_of_a_probe_start_leaves_no_process(tmp_path, monkeypatch,
                                                                   instant):
    started = []
    sigint = signal.getsignal(signal.SIGINT)
    real_popen = proc.subprocess.Popen

    def popen(*args, **kwargs):  # to know the rank was really started before the interrupt
        p = real_popen(*args, **kwargs)
        started.append(p.pid)
        return p
    monkeypatch.setattr(proc.subprocess, "Popen", popen)
    INSTANTS[instant](monkeypatch)
    name = f"i{uuid.uuid4().hex[:8]}"
    spec = TrialSpec.of(command=(str(SCRIPTS / "ok.py"),), cwd=str(tmp_path),
                        log_dir=tmp_path / "logs", name=name, max_s=25.0, hang_s=4.0,
                        startup_s=30.0, grace_s=3.0, min_measure_s=2.0,
                        foreign_limit_cores=1e9)
    try:
        with pytest.raises(CtrlC):
            run_trial(spec)
    finally:
        signal.signal(signal.SIGINT, sigint)
    assert started, "the interrupt came before any rank existed: nothing was tested"
    assert trial_processes(name) == [], "a rank outlived the interrupted start"
    assert live_children() == []
    assert [lp for lp in proc.live() if lp.spec.marker.startswith(name)] == []


# A controller that starts a rank and is interrupted before anything stops it.
HOLDER = textwrap.dedent("""
    import os, sys
    from pathlib import Path
    from autotune.hardware import proc
    log = Path(sys.argv[2]) / "rank.log"
    spec = proc.LaunchSpec(argv=(sys.executable, "-c", "import time; time.sleep(600)"),
                           env=dict(os.environ), cwd=sys.argv[2], marker=sys.argv[1],
                           stdout_path=log, stderr_path=log)
    launched = proc.start(spec)
    print(launched.pid, flush=True)
    sys.stdin.read()  # until told
    raise KeyboardInterrupt
""")


def test_a_controller_exiting_on_ctrl_c_stops_the_launches_it_still_held(tmp_path):
    marker = f"held-{uuid.uuid4().hex[:8]}"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, marker, str(tmp_path)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              stderr=subprocess.DEVNULL, cwd=os.getcwd())
    try:
        rank = int(holder.stdout.readline())
        wait_for(lambda: trial_processes(marker), timeout_s=30, what="the held rank")
        holder.stdin.close()
        assert holder.wait(timeout=60) != 0  # ended by its KeyboardInterrupt
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        left = trial_processes(marker)
        for p in left:  # not left to sleep on after a failure
            p.kill()
    assert left == [], f"rank {rank} outlived its controller"
    assert live_children() == []


# A control command (``nvidia-cuda-mps-control``'s kind) that runs until it is stopped.
SLEEPER = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(600)"


def test_ctrl_c_while_a_control_command_runs_kills_it(tmp_path):
    """`proc.run_command` killed its command's group on a timeout only: Ctrl-C while it waited
    left the command running."""
    marker = f"cmd-{uuid.uuid4().hex[:8]}"
    up = tmp_path / "pid"
    main = threading.main_thread().ident

    def interrupt_once_up():  # the SIGINT goes to the main thread, inside `run_command`
        wait_for(lambda: up.exists() and up.read_text(), timeout_s=60, what="the command")
        signal.pthread_kill(main, signal.SIGINT)
    sigint = signal.signal(signal.SIGINT, _raise_ctrl_c)
    sender = threading.Thread(target=interrupt_once_up, daemon=True)
    try:
        sender.start()
        with pytest.raises(CtrlC):
            proc.run_command([sys.executable, "-c", SLEEPER, str(up)], env=dict(os.environ),
                             timeout_s=120, marker=marker)
    finally:
        sender.join(timeout=60)
        signal.signal(signal.SIGINT, sigint)
        left = trial_processes(marker)
        for p in left:
            p.kill()
    assert left == [], f"the command (pid {up.read_text()}) outlived the interrupt"
    assert live_children() == []


def _blocked_and_ignored(pid: int) -> tuple[int, int]:
    """The signal masks of ``pid`` a child reads from the kernel: (blocked, ignored)."""
    fields = dict(line.split(":\t", 1) for line in open(f"/proc/{pid}/status").read().splitlines()
                  if ":\t" in line)
    return int(fields["SigBlk"], 16), int(fields["SigIgn"], 16)


def test_a_signal_held_while_a_process_starts_comes_after_and_the_process_hears_every_signal():
    """`proc.signals_held`: SIGTERM sent inside the block reaches its handler as the block
    ends, not inside it; a process started inside has none of the signals blocked (a kernel
    mask would pass to it and leave it deaf to Ctrl-C and SIGTERM), and one ignored here stays
    ignored there, as it would without the hold."""
    bit = {sig: 1 << (sig - 1) for sig in proc.HELD_SIGNALS}
    came: list[int] = []
    before_term = signal.signal(signal.SIGTERM, lambda signum, frame: came.append(signum))
    before_hup = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    child = None
    try:
        with proc.signals_held():
            child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                                     stdin=subprocess.PIPE)
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):  # bytecodes enough for a handler to have run, were it let
                pass
            inside = list(came)
        assert inside == [] and came == [signal.SIGTERM]
        blocked, ignored = _blocked_and_ignored(child.pid)
        assert not blocked & (bit[signal.SIGINT] | bit[signal.SIGTERM] | bit[signal.SIGHUP])
        assert ignored & bit[signal.SIGHUP] and not ignored & bit[signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, before_term)
        signal.signal(signal.SIGHUP, before_hup)
        if child is not None:
            child.communicate(b"")
