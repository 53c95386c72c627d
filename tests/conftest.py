"""Shared fixtures and helpers: paths to the tiny scripts, a private runs dir, a leftover-process
check, the autotune command line as a user runs it and its JSON output, a run's journal, waiting
on a condition with a deadline, and the mpirun the tests use."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ROOT / "tests" / "scripts"
EXAMPLES = ROOT / "examples"


# A suite started in the background (`nohup`, `cmd &` in a script) starts with SIGINT or SIGHUP
# ignored, and every process it starts would inherit that: the tests that send those signals
# (Ctrl-C to the controller, a hang-up) would wait on processes that cannot hear them. A handled
# signal is reset to its default across exec, so handling them here gives children the defaults.
for _sig, _handler in ((signal.SIGINT, signal.default_int_handler),
                       (signal.SIGHUP, signal.SIG_DFL)):
    if signal.getsignal(_sig) == signal.SIG_IGN:
        signal.signal(_sig, _handler)

# The suite's workers each start ranks that use every core (two threads on two), and
# OpenMP's threads spin while they wait for work by default: two such ranks at once spun
# against each other and took 2-5 times the wall and CPU time of the same two ranks whose
# threads sleep while they wait (measured here, ok.py twice at once). Every process the tests
# start inherits this; a value set outside the suite stands.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@pytest.fixture(autouse=True)
def _private_runs_dir(tmp_path, monkeypatch):
    """Every test writes its run directories under its own tmp dir, never in ~."""
    monkeypatch.setenv("AUTOTUNE_RUNS_DIR", str(tmp_path / "runs"))


def trial_processes(prefix: str) -> list[psutil.Process]:
    """Live processes of ours whose AUTOTUNE_TRIAL marker starts with ``prefix``."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid == os.getpid():
                continue
            marker = proc.environ().get("AUTOTUNE_TRIAL", "")
            if marker.startswith(prefix) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


class Child(psutil.Process):
    """A live descendant that says what it runs when a test fails on it (an orphan's command
    line and which trial started it are the clue; psutil's repr gives only the name)."""

    def __repr__(self):
        try:
            cmd = " ".join(self.cmdline())[:200]
            trial = self.environ().get("AUTOTUNE_TRIAL", "")
            ppid = self.ppid()
        except psutil.Error:
            return super().__repr__()
        return f"Child(pid={self.pid}, ppid={ppid}, trial={trial!r}, cmd={cmd!r})"


def live_children() -> list[psutil.Process]:
    """Live descendants of this process, but the cluster bed's daemons: a worker that ran
    autotune is a subreaper (`autotune.hardware.proc`), so the daemons the bed started for the
    session, orphaned by their starter, become its children; they are the session's, no test's."""
    out = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE and \
                    "AUTOTUNE_CLUSTERBED" not in child.environ():
                out.append(Child(child.pid))
        except psutil.Error:
            continue
    return out


@pytest.fixture
def python():
    return sys.executable


def autotune(*args, cwd=None, timeout=240, env=None) -> subprocess.CompletedProcess:
    """``python -m autotune ARGS`` in ``cwd`` (default: ours), output captured as text."""
    return subprocess.run([sys.executable, "-m", "autotune", *args], cwd=cwd, text=True,
                          capture_output=True, timeout=timeout, env=env)


# The xdist group of the suite's heaviest tunes (minutes each, judged on timings): they run on
# one worker, one after another (pyproject's `--dist loadgroup`). Two at once on two cores put
# 1-1.6 cores of load under each other's probes and ran one past its timeout.
HEAVY = "heavy-tunes"


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Every test of the `HEAVY` group is also marked ``heavy`` (before ``-m`` selects) and
    moved to the end, so that CI runs them in its second pytest run after the cluster tests,
    one after another, and the three workers never wait on them (README's test command)."""
    heavy = [item for item in items
             if any(m.args[:1] == (HEAVY,) for m in item.iter_markers("xdist_group"))]
    for item in heavy:
        item.add_marker(pytest.mark.heavy)
    items[:] = [item for item in items if item not in heavy] + heavy


PROBE_TRIES = 3  # a probe that got no figure because other programs loaded the CPU


def quiet_try(attempt, *, spoiled):
    """``attempt(n)`` for n = 1 .. `PROBE_TRIES`, until ``spoiled(result)`` finds nothing: that
    result. ``spoiled`` names the load that spoiled a result (other programs' CPU: in CI the
    other test worker once slowed a tiny step 25x for 14 of 16 s), or returns None; it fails the
    test where nothing excuses what it sees. After the last spoiled try the test is skipped with
    the load named."""
    for n in range(1, PROBE_TRIES + 1):
        result = attempt(n)
        why = spoiled(result)
        if not why:
            return result
    pytest.skip(f"{PROBE_TRIES} tries spoiled by other programs' CPU load (last: {why}); run "
                f"on a quieter machine")


def probe_full(tmp_path, *args, seconds=15, options=()) -> dict:
    """`autotune probe --modes full` (with ``options``) on ``args``: the mode's result, with
    its figure. A probe that got no figure while other programs loaded the CPU past the default
    limit is tried again (`quiet_try`); one that got none on a quiet machine fails the test."""
    from autotune.measuring.foreign_load import FOREIGN_CORES_LIMIT

    def attempt(n):
        r = subprocess.run([sys.executable, "-m", "autotune", "probe", "--json", "--modes",
                            "full", "--seconds", str(seconds), *options, "--runs-dir",
                            str(tmp_path / f"try{n}"), *map(str, args)],
                           capture_output=True, text=True, timeout=180)
        return r, json.loads(r.stdout)["modes"]["full"]

    def spoiled(got):
        r, full = got
        if full["samples_per_s"] > 0:
            assert r.returncode == 0, r.stderr[-2000:]
            return None
        assert full["foreign_cores"] > FOREIGN_CORES_LIMIT, r.stderr[-2000:]
        return full["reason"]

    return quiet_try(attempt, spoiled=spoiled)[1]


def last_json(p: subprocess.CompletedProcess) -> dict:
    """The JSON a ``--json`` command printed last (its summary), once it exited 0."""
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def journal(run_dir, name: str | None = None) -> list[dict]:
    """A run's journal events, all of them or those named ``name``."""
    from autotune.store.journal import read_events

    evs, _ = read_events(Path(run_dir))
    return [e for e in evs if name is None or e["event"] == name]


def wait_for(condition, *, timeout_s: float = 20.0, what: str = "condition", poll_s=0.05):
    """``condition()``'s first true value, polled until ``timeout_s``; fails naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def assert_one_error_line(p: subprocess.CompletedProcess, *words) -> None:
    """A usage error as promised: exit 2, one ``ERROR:`` line naming ``words``, no traceback."""
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert p.returncode == 2, p.stderr
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith("ERROR: ") and "Traceback" not in p.stderr
    for w in words:
        assert w in lines[0], lines[0]


@pytest.fixture(scope="module")
def mpi():
    """The mpirun autotune would use (the one mpi4py's library belongs to); skips without it."""
    pytest.importorskip("mpi4py")
    from autotune.launching import engines

    info = engines.detect_mpi(os.environ)
    if info is None:
        pytest.skip("no mpirun beside Python or on PATH")
    return info


# ---------------------------------------------------------------- the cluster bed (issue 22)
# A real two-host cluster (network namespaces, Slurm, sshd; bench/clusterbed.py), built once per
# test run and shared by the xdist workers: the first to need it builds it under a file lock, each
# user is counted, the last one out tears it down. It is built by the bed's CLI in a child that
# exits, so its daemons are nobody's children here (tests that check for leftover children of
# the worker stay right).
CLUSTER_RATE = "100mbit"


def cluster_skip_reason():
    import shutil

    if os.geteuid() != 0:
        return "the cluster bed needs root (network namespaces, tc, daemons)"
    try:
        ok = subprocess.run(["ip", "netns", "list"], capture_output=True,
                            timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if not ok:
        return "`ip netns` is not available (iproute2)"
    path = os.environ.get("PATH", "") + ":/usr/sbin:/sbin"
    missing = [t for t in ("slurmctld", "slurmd", "srun", "sbatch", "munged", "sshd", "ssh",
                           "tc", "nsenter", "unshare", "taskset", "setpriv")
               if shutil.which(t, path=path) is None]
    if missing:
        return (f"not installed: {', '.join(missing)} (apt-get install slurm-wlm munge "
                "openssh-server openssh-client iproute2)")
    return None


def bed_slurm(bed, *argv, timeout_s=90.0, env=None, job_name=None):
    """A Slurm client against the cluster bed (its env), in its own session: on timeout its
    whole group is killed (salloc's script and its sruns with it). ``job_name`` names the jobs
    it submits, so that a test can cancel its own and no other worker's."""
    env = bed.env(env)
    if job_name:
        env.update(SLURM_JOB_NAME=job_name, SALLOC_JOB_NAME=job_name, SBATCH_JOB_NAME=job_name)
    p = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=env, start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
        raise AssertionError(f"{argv[0]} timed out after {timeout_s} s:\n{out}\n{err}")
    return subprocess.CompletedProcess(list(argv), p.returncode, out, err)


@pytest.fixture(scope="session")
def cluster():
    """The running cluster bed (``bench.clusterbed.ClusterBed``, with ``.facts`` and ``.env()``);
    skips with the reason where it cannot be built."""
    import fcntl
    import shutil

    reason = cluster_skip_reason()
    if reason:
        pytest.skip(reason)
    sys.path.insert(0, str(ROOT / "bench"))
    from clusterbed import ClusterBed

    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID", f"solo{os.getpid()}")[:12]
    root = Path("/tmp") / f"atb-pytest-{run_id}"
    workdir, users = root / "bed", root / "users"

    def locked(update):
        root.mkdir(exist_ok=True)
        with open(root.with_name(root.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            return update()

    def join():
        if not (workdir / "bed.json").exists():
            p = subprocess.run([sys.executable, str(ROOT / "bench" / "clusterbed.py"), "up",
                                "--rate", CLUSTER_RATE, "--workdir", str(workdir)],
                               capture_output=True, text=True, timeout=180)
            if p.returncode != 0:
                pytest.fail(f"the cluster bed did not come up:\n{p.stderr}", pytrace=False)
        n = int(users.read_text()) if users.exists() else 0
        users.write_text(str(n + 1))
        return ClusterBed.attach(workdir)

    def leave():
        n = int(users.read_text()) - 1
        users.write_text(str(n))
        if n == 0:
            ClusterBed.attach(workdir).down()
            shutil.rmtree(root, ignore_errors=True)
            root.with_name(root.name + ".lock").unlink(missing_ok=True)

    bed = locked(join)
    try:
        yield bed
    finally:
        locked(leave)


@pytest.fixture
def cluster_nodes(cluster):
    """The bed with its nodes to this test alone: the xdist workers share one bed, and a test
    whose job holds every node for minutes (a tune) would make another's ``srun``/``salloc``
    wait past its timeout. Tests that submit jobs take this exclusive lock for their duration;
    the wait for it is not on their clocks."""
    import fcntl

    with open(Path(cluster.workdir).parent / "nodes.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield cluster


# A finished job's steps are gone; Slurm may take a few seconds to tear a killed one down.
BED_SETTLE_S = 30.0


def bed_job_state(bed, job_id) -> tuple[str, str]:
    """(JobState, ExitCode) from ``scontrol show job``; ("", "") once Slurm forgot it."""
    p = bed_slurm(bed, "scontrol", "show", "job", "-o", job_id)
    state = re.search(r"\bJobState=(\S+)", p.stdout)
    code = re.search(r"\bExitCode=(\S+)", p.stdout)
    return (state.group(1) if state else "", code.group(1) if code else "")


def bed_wait_job(bed, job_id, timeout_s: float) -> tuple[str, str]:
    """Wait for a bed job to leave the queue; its (JobState, ExitCode)."""
    wait_for(lambda: bed_job_state(bed, job_id)[0] not in ("PENDING", "RUNNING", "CONFIGURING",
                                                          "COMPLETING"),
             timeout_s=timeout_s, what=f"job {job_id} to end", poll_s=1.0)
    return bed_job_state(bed, job_id)


def bed_leftovers(bed, marks) -> list[str]:
    """Processes in the bed's hosts that belong to a test's run (by the unique paths in their
    command line or environment): ranks, DataLoader workers, a controller."""
    left = []
    for ns in bed.facts.namespaces:
        p = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True,
                           timeout=30)
        for pid in p.stdout.split():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
                with open(f"/proc/{pid}/environ", "rb") as f:
                    environ = f.read().decode(errors="replace")
            except OSError:
                continue  # gone meanwhile
            if any(m in cmdline or m in environ for m in marks):
                left.append(f"{ns}: {pid} {cmdline[:200]}")
    return left


def bed_settled(bed, marks) -> list[str]:
    """What is left of a test's processes once Slurm had `BED_SETTLE_S` to tear steps down."""
    deadline = time.monotonic() + BED_SETTLE_S
    while bed_leftovers(bed, marks) and time.monotonic() < deadline:
        time.sleep(0.5)
    return bed_leftovers(bed, marks)
