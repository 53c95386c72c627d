"""The one place that starts processes, and the one that makes sure none outlives its run.

Every launch gets its own session (so its process group can be signalled whole) and an
``AUTOTUNE_TRIAL`` marker in its environment, which every descendant inherits. The controller
makes itself a child subreaper (Linux ``prctl``), so a descendant orphaned by a crash is
re-parented to us, not to init, and can still be found and reaped. Shutdown is TERM, grace,
KILL, then a sweep for anything still carrying the marker.

Every launch is registered the moment its process exists, and leaves the register only when
`stop` has ended it. A signal that lands while the process is being created and registered is
held until it is registered (`signals_held`): raised inside ``Popen``, it would lose the pid.
What is still registered when the controller exits (an interrupt that landed between a launch
and the code that would have stopped it) is stopped by `stop_all`, registered with
``atexit``: Ctrl-C at any instant leaves no process behind.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from autotune import LaunchError
from probes import protocol

_PR_SET_CHILD_SUBREAPER = 36
_subreaper = False
_ours: set[int] = set()  # pids this process started with Popen: subprocess reaps those
_live: dict[int, Launched] = {}  # launches not yet ended by `stop`, by root pid


def birth_clock() -> float:
    """Now, on the clock ``psutil``'s ``create_time`` reads, less one kernel tick: a process
    born after this call has a create time at or after it.

    That clock is the boot time in whole seconds (``btime``) plus the ticks since boot, so it
    runs up to a second behind ``time.time()`` (0.18 s measured here): a rank forked just after
    a ``time.time()`` reads as born before it.
    """
    try:
        since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
    except (AttributeError, OSError):  # no boot clock: the wall clock, a second's slack
        return time.time() - 1.0
    return psutil.boot_time() + since_boot - 2.0 / os.sysconf("SC_CLK_TCK")


def become_subreaper() -> bool:
    """Ask Linux to re-parent orphaned descendants to this process. Idempotent."""
    global _subreaper
    if _subreaper:
        return True
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        _subreaper = libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        _subreaper = False
    return _subreaper


def _children_files(pid: int) -> list[str] | None:
    """The kernel's lists of ``pid``'s children, one file per thread; None where the kernel
    keeps none (built without them, or not Linux)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    paths = [f"/proc/{pid}/task/{tid}/children" for tid in tids]
    return paths if paths and os.path.exists(paths[0]) else None


def descendants(root: psutil.Process) -> list[psutil.Process]:
    """Every live descendant of ``root``, read from the kernel's per-thread children lists:
    only this tree is read. psutil's ``children`` reads the stat file of every process on the
    host, which the loops that sample a run's tree five times a second paid for in CPU the
    ranks needed (~5 ms a walk on a two-core VM; more on a busy node). A child that starts or
    ends during the walk may be missed, and is found by the next."""
    if _children_files(root.pid) is None:
        return root.children(recursive=True)
    found: list[psutil.Process] = []
    stack, seen = [root.pid], {root.pid}
    while stack:
        for path in _children_files(stack.pop()) or ():
            try:
                with open(path) as f:
                    pids = [int(x) for x in f.read().split()]
            except (OSError, ValueError):
                continue
            for pid in pids:
                if pid in seen:
                    continue
                seen.add(pid)
                try:
                    found.append(psutil.Process(pid))
                except psutil.Error:
                    continue
                stack.append(pid)
    return found


@dataclass(frozen=True)
class LaunchSpec:
    """What to start: the child learns everything from argv and env, nothing else."""

    argv: tuple[str, ...]
    env: dict[str, str]
    cwd: str
    marker: str  # value of AUTOTUNE_TRIAL for this launch
    stdout_path: Path
    stderr_path: Path
    # pass each line of stdout+stderr to on_output as well, read back from the log
    # (`_follow`), not through a pipe
    stream_output: bool = False
    label: str = "rank 0"


@dataclass
class Launched:
    """A started process and how to reach its tree."""

    spec: LaunchSpec
    popen: subprocess.Popen
    pgid: int
    known: dict[int, float] = field(default_factory=dict)  # pid -> create_time of descendants
    _threads: list[threading.Thread] = field(default_factory=list)
    _ended: threading.Event = field(default_factory=threading.Event)  # `stop` has ended it

    @property
    def pid(self) -> int:
        return self.popen.pid

    def poll(self) -> int | None:
        return self.popen.poll()

    def tree(self) -> list[psutil.Process]:
        """Live processes of this launch: the root and every descendant seen so far."""
        procs = []
        try:
            root = psutil.Process(self.pid)
            procs.append(root)
            procs.extend(descendants(root))
        except psutil.Error:
            pass
        for proc in procs:
            try:
                self.known.setdefault(proc.pid, proc.create_time())
            except psutil.Error:
                pass
        return procs


def start(spec: LaunchSpec, *, on_output=None) -> Launched:
    """Start one process in a new session. Never goes through a shell."""
    become_subreaper()
    env = dict(spec.env)
    env[protocol.ENV_TRIAL] = spec.marker
    spec.stdout_path.parent.mkdir(parents=True, exist_ok=True)
    out = open(spec.stdout_path, "ab")
    err = out if spec.stdout_path == spec.stderr_path else open(spec.stderr_path, "ab")
    streamed_from = out.tell()
    try:
        with signals_held():  # what they raise comes once the process is registered
            try:
                popen = subprocess.Popen(
                    list(spec.argv), cwd=spec.cwd, env=env, stdin=subprocess.DEVNULL,
                    stdout=out, stderr=subprocess.STDOUT if spec.stream_output else err,
                    start_new_session=True, close_fds=True)
            except OSError as exc:
                raise LaunchError(f"cannot start {spec.argv[0]!r}: {exc.strerror or exc}; "
                                  f"check that it exists and is executable") from exc
            launched = Launched(spec=spec, popen=popen, pgid=popen.pid)
            _register(launched)
    finally:
        out.close()
        if err is not out:
            err.close()
    try:
        if spec.stream_output and on_output is not None:
            t = threading.Thread(target=_follow,
                                 args=(spec.stdout_path, streamed_from, launched._ended,
                                       on_output),
                                 daemon=True, name=f"autotune-follow-{popen.pid}")
            t.start()
            launched._threads.append(t)
        launched.tree()
    except BaseException:  # Ctrl-C before the caller holds it: nobody else could stop it
        stop(launched, grace_s=1.0)
        raise
    return launched


def start_daemon(argv: tuple[str, ...], *, env: dict[str, str], cwd: str, output_path: Path,
                 pass_fds: tuple[int, ...] = ()) -> subprocess.Popen:
    """Start a controller that outlives us (``autotune ... -d``): its own session, so no
    controlling terminal and no hang-up from ours; stdin from /dev/null, stdout and stderr
    appended to ``output_path``. It is not registered: nothing here stops it when we exit."""
    fd = os.open(output_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with open(fd, "ab") as out:
        try:
            return subprocess.Popen(list(argv), env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                                    stdout=out, stderr=subprocess.STDOUT,
                                    start_new_session=True, close_fds=True,
                                    pass_fds=pass_fds)
        except OSError as exc:
            raise LaunchError(f"cannot start {argv[0]!r}: {exc.strerror or exc}") from exc


# held while a process is created and registered: the ones the CLI turns into exceptions
# (`autotune.commands.cli`)
HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def signals_held():
    """Hold `HELD_SIGNALS` for the block, then hand the first that came to its handler.

    Python runs a signal's handler in the main thread between two bytecodes: Ctrl-C landing
    inside ``Popen``, after the fork, raises there, and the child runs on with a pid nobody
    holds. Only the main thread runs handlers, so elsewhere nothing is held. The handlers
    swapped in are Python's; ``exec`` resets them to the default in the child, and the
    signal mask is untouched (a mask would pass to the child: it would start deaf to them), so
    the child gets every signal as it would have. An ignored signal is left ignored: nothing
    would come of it here, and a child keeps it ignored (``nohup``'s SIGHUP, the SIGINT of a
    command started in the background of a shell), where a handler of ours would reach it as
    the default.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    came: list[tuple[int, object]] = []
    before = {}
    for sig in HELD_SIGNALS:
        if signal.getsignal(sig) in (None, signal.SIG_IGN):  # set outside Python, or ignored
            continue
        before[sig] = signal.signal(sig, lambda signum, frame: came.append((signum, frame)))
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
        if came:
            signum, frame = came[0]
            handler = before.get(signum)
            if callable(handler):
                handler(signum, frame)
            elif handler == signal.SIG_DFL:  # what the signal does by default, now
                os.kill(os.getpid(), signum)


def _register(launched: Launched) -> None:
    _ours.add(launched.pid)
    if not _live:
        atexit.unregister(stop_all)
        atexit.register(stop_all)
    _live[launched.pid] = launched


def live() -> list[Launched]:
    """The launches of this process that `stop` has not ended yet."""
    return list(_live.values())


def stop_all(grace_s: float = 2.0) -> list[int]:
    """Stop every launch `stop` has not ended (registered with ``atexit``); their root pids.

    A controller stopped between starting processes and handing them to the code that stops
    them (Ctrl-C in that instant) would otherwise leave them running."""
    stopped = []
    for launched in list(_live.values()):
        stopped.append(launched.pid)
        stop(launched, grace_s=grace_s)
    return stopped


FOLLOW_S = 0.25  # how often a streamed launch's log is read for new lines


def _follow(path: Path, offset: int, ended: threading.Event, on_output) -> None:
    """Pass each whole line written to ``path`` past ``offset`` to ``on_output``, read every
    `FOLLOW_S`, until ``ended`` (`stop` has ended the launch and swept its processes); then
    the rest, a last line without its newline included.

    The processes write to the file themselves, as a probe's ranks do, so what they print
    wakes nothing of ours: relayed through a pipe, each line woke a thread of ours on a core
    the ranks were using (two ranks of 2-3 ms steps read 0.94-0.98 of plain through
    ``autotune run``, 0.96-0.98 as a probe: docs/benchmarks.md, parity). A line reaches the
    terminal at most `FOLLOW_S` after it was written."""
    rest = b""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            while True:
                last = ended.wait(FOLLOW_S)
                *lines, rest = (rest + f.read()).split(b"\n")
                for line in lines:
                    on_output(line.decode(errors="replace") + "\n")
                if last:
                    break
    except OSError:
        return  # the log went away: nothing more to pass on
    if rest:
        on_output(rest.decode(errors="replace"))


@dataclass(frozen=True)
class CommandResult:
    """What a short command printed and how it ended."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


def run_command(argv, *, env: dict[str, str], input_text: str | None = None,
                timeout_s: float = 10.0, marker: str = "autotune-cmd") -> CommandResult:
    """Run a short control command (``echo quit | nvidia-cuda-mps-control``, say) to its end.

    Its own session, ``input_text`` on stdin, output collected through temporary files rather
    than pipes: a command that daemonises (``-d``) leaves a child holding its stdout, and a pipe
    would then never see EOF. Past ``timeout_s`` the command's group is killed and
    `LaunchError` names it. A daemon it forks stays alive; that is the caller's to stop.
    """
    import tempfile

    become_subreaper()
    env = dict(env)
    env.setdefault(protocol.ENV_TRIAL, marker)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        popen = None
        try:
            with signals_held():
                try:
                    popen = subprocess.Popen(
                        [str(a) for a in argv], env=env, stdin=subprocess.PIPE, stdout=out,
                        stderr=err, start_new_session=True, close_fds=True)
                except OSError as exc:
                    raise LaunchError(f"cannot start {argv[0]!r}: {exc.strerror or exc}; "
                                      f"check that it exists and is executable") from exc
                _ours.add(popen.pid)
            popen.communicate(input=(input_text or "").encode(), timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(popen)
            raise LaunchError(f"{' '.join(map(str, argv))!r} did not finish within "
                              f"{timeout_s:g} s and was killed") from None
        except BaseException:  # Ctrl-C while it ran: it must not outlive us
            if popen is not None:
                _kill_group(popen)
            raise
        out.seek(0)
        err.seek(0)
        return CommandResult(argv=tuple(str(a) for a in argv), returncode=popen.returncode,
                             stdout=out.read().decode(errors="replace"),
                             stderr=err.read().decode(errors="replace"))


def _kill_group(popen: subprocess.Popen) -> None:
    try:
        os.killpg(popen.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    popen.wait()


def signal_group(launched: Launched, sig: int) -> None:
    try:
        os.killpg(launched.pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop(launched: Launched, *, grace_s: float = 5.0) -> int | None:
    """TERM the group, wait up to ``grace_s``, KILL it, then sweep every straggler.

    Returns the root's exit code (negative signal number when killed).
    """
    launched.tree()
    if launched.poll() is None:
        signal_group(launched, signal.SIGTERM)
        # a group held with SIGSTOP (trials taking turns) takes SIGTERM only once continued
        signal_group(launched, signal.SIGCONT)
        deadline = time.monotonic() + grace_s
        while launched.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    signal_group(launched, signal.SIGKILL)
    try:
        launched.popen.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    else:
        _ours.discard(launched.pid)  # its status is collected: the pid may be reused
    sweep(launched)
    if _live.get(launched.pid) is launched:
        del _live[launched.pid]
    launched._ended.set()
    for t in launched._threads:
        t.join(timeout=5)
    return launched.popen.returncode


SWEEP_PASSES = 4  # scans of a launch's processes at its end; each kills what the last missed


def sweep(launched: Launched) -> list[int]:
    """Kill and reap anything of this launch still alive; returns the pids it had to kill.

    Looks at three things: descendants seen while it ran (matched on create time, so a reused
    pid is never hit), our own children (orphans re-parented to us), and every process of ours
    whose environment carries this launch's marker (a grandchild that escaped with setsid).
    """
    killed: list[int] = []
    # A victim may fork between the scan and its kill (a rank starting DataLoader workers for
    # its next epoch): what it forked is found by the next pass, once nothing is left to fork.
    for _ in range(SWEEP_PASSES):
        victims: dict[int, psutil.Process] = {}
        for pid, created in list(launched.known.items()):
            try:
                proc = psutil.Process(pid)
                if abs(proc.create_time() - created) < 1e-3:
                    victims[pid] = proc
            except psutil.Error:
                pass
        victims.update({p.pid: p for p in marked(launched.spec.marker)})
        victims.pop(os.getpid(), None)
        alive = [p for p in victims.values() if _alive(p)]
        if not alive:
            break
        killed += _kill_all(alive)
    reap_adopted()
    return killed


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def sweep_marker(marker: str) -> list[int]:
    """Kill and reap every process of ours carrying ``AUTOTUNE_TRIAL=marker``; their pids.

    For what `run_command` leaves behind (a daemon and the servers it forked).
    """
    return _kill_all(marked(marker))


def _kill_all(victims: list[psutil.Process]) -> list[int]:
    """SIGKILL each process and reap those that are our children; the pids that were alive."""
    killed = []
    for p in victims:
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                killed.append(p.pid)
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(victims, timeout=5)
    return killed


def marked(marker: str) -> list[psutil.Process]:
    """Processes of this user whose environment has ``AUTOTUNE_TRIAL=marker``."""
    found = []
    me = os.getuid()
    for proc in psutil.process_iter(["uids"]):
        try:
            if proc.info["uids"] is None or proc.info["uids"].real != me:
                continue
            if proc.pid == os.getpid():
                continue
            if proc.environ().get(protocol.ENV_TRIAL) == marker:
                found.append(proc)
        except psutil.Error:
            continue
    return found



class MarkedScan:
    """The processes of this host carrying one of some markers, and their descendants, found
    wherever they run: ranks an engine started (children of ``slurmstepd`` or of an ssh
    session, not of ours), their DataLoader workers; and the step's own processes, the
    ancestors of a marked one born since ``since`` (the ``slurmstepd`` of the trial's step, the
    ssh session and Hydra proxy mpirun started): they work for the trial alone. A daemon older
    than the trial (``slurmd``, ``sshd`` listening) is not the trial's.

    Reading every process's environment is costly, so each pid is read once (by pid and create
    time; a young one again until it has surely exec'd) and the process table is scanned for
    new pids at most every ``rescan_s``; between scans `processes` gives the ones already found
    that are still alive.
    """

    SETTLED_S = 2.0  # a process this old has the environment it will keep

    def __init__(self, markers, *, rescan_s: float = 1.0, since: float | None = None):
        self.markers = frozenset(markers)
        self.rescan_s = rescan_s
        self.since = birth_clock() if since is None else since  # as create_time reads
        self._next_scan = 0.0
        self._checked: set[tuple[int, float]] = set()  # (pid, create time) read once
        self._found: dict[tuple[int, float], psutil.Process] = {}

    def processes(self) -> list[psutil.Process]:
        """The marked processes and their descendants alive now (as of the last scan)."""
        now = time.monotonic()
        if now >= self._next_scan:
            self._scan()
            self._next_scan = time.monotonic() + self.rescan_s
        alive = []
        for key, p in list(self._found.items()):
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    alive.append(p)
                    continue
            except psutil.Error:
                pass
            del self._found[key]
        return alive

    def _scan(self) -> None:
        me, uid, now = os.getpid(), os.getuid(), time.time()
        children: dict[int, list[psutil.Process]] = {}
        table = []
        for p in psutil.process_iter(["ppid", "uids", "create_time"]):
            info = p.info
            if info["create_time"] is None or p.pid == me:
                continue
            table.append(p)
            if info["ppid"] is not None:
                children.setdefault(info["ppid"], []).append(p)
            key = (p.pid, info["create_time"])
            if key in self._checked or key in self._found:
                continue
            if info["uids"] is None or info["uids"].real != uid:
                self._checked.add(key)
                continue
            try:
                marker = p.environ().get(protocol.ENV_TRIAL)
            except psutil.Error:
                continue
            if marker in self.markers:
                self._found[key] = p
            elif now - info["create_time"] > self.SETTLED_S:
                # A younger one may be between fork and exec, still showing its parent's
                # environment: read again at the next scan.
                self._checked.add(key)
        by_pid = {p.pid: p for p in table}
        for p in list(self._found.values()):  # up: the step's processes, born for the trial
            parent = by_pid.get(p.info["ppid"])
            while parent is not None and parent.pid not in (me, 1) and \
                    parent.info["create_time"] >= self.since:
                key = (parent.pid, parent.info["create_time"])
                if key in self._found:
                    break
                self._found[key] = parent
                parent = by_pid.get(parent.info["ppid"])
        stack = [p.pid for p in self._found.values()]
        while stack:  # descendants: whatever environment they were given
            for child in children.get(stack.pop(), ()):
                key = (child.pid, child.info["create_time"])
                if key not in self._found:
                    self._found[key] = child
                    stack.append(child.pid)


def reap_adopted() -> list[int]:
    """Collect the exit status of orphans re-parented to us (we are their subreaper).

    Only processes we did not start ourselves: a Popen of ours keeps its status for its owner.
    """
    reaped = []
    try:
        children = psutil.Process().children()
    except psutil.Error:
        return reaped
    for child in children:
        if child.pid in _ours:
            continue
        try:
            if child.status() == psutil.STATUS_ZOMBIE and os.waitpid(child.pid, os.WNOHANG)[0]:
                reaped.append(child.pid)
        except (psutil.Error, ChildProcessError, OSError):
            continue
    return reaped
