"""Which engine starts the ranks, and its command line: local, ``mpirun`` or ``srun``.

Beyond one machine we use an existing engine, never a home-made one (DESIGN.md, "Running").
Command building is pure (`mpirun_argv`, `srun_argv`); the only I/O here is finding the
``mpirun`` and asking it what it is.

MPI facts: the ``mpirun`` must come from the MPI library mpi4py loads (mixing them gives
singleton ranks or exit 16), so we look next to our Python first (``pip install mpich`` puts
Hydra's ``mpirun`` there), then on ``PATH``. Open MPI binds each rank to one core by default
(``--bind-to none`` for multi-threaded ranks), refuses root without ``--allow-run-as-root``,
and forwards only the variables named with ``-x`` to other hosts. MPICH's Hydra forwards the
whole environment and binds nothing by default.
"""

from __future__ import annotations

import argparse
import enum
import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

# Slurm's environment is parsed in autotune.hardware.allocation (the machine is the allocation);
# its names are here too for the callers that choose a launcher.
from autotune.hardware.allocation import (SlurmAllocation, expand_nodelist,  # noqa: F401
                                          slurm_allocation)



class Kind(str, enum.Enum):
    """What starts the ranks; the value is what ``--launcher``, recipes and the journal say."""

    LOCAL = "local"
    MPIRUN = "mpirun"
    SRUN = "srun"

    def __str__(self) -> str:
        return self.value


KINDS = tuple(k.value for k in Kind)
MPIRUN_ENV = "AUTOTUNE_MPIRUN"
# Variables a rank needs from the controller; forwarded explicitly where the engine needs it.
FORWARD_PREFIXES = ("AUTOTUNE_", "MASTER_", "OMP_", "MKL_", "OPENBLAS_", "CUDA_", "NCCL_", "GLOO_",
                    "HOROVOD_", "PYTHON", "TORCH")


@dataclass(frozen=True)
class Host:
    name: str
    slots: int | None = None


@dataclass(frozen=True)
class MpiInfo:
    path: str
    flavor: str  # "openmpi" | "mpich" | "unknown"
    version: str


@dataclass(frozen=True)
class Launcher:
    """How ranks are started. ``hosts`` empty: this host only."""

    kind: Kind = Kind.LOCAL
    hosts: tuple[Host, ...] = ()
    hostfile: str | None = None
    mpi: MpiInfo | None = None
    extra_args: tuple[str, ...] = ()
    # what ranks on other hosts reach the controller at (`autotune.launching.reach.settle`);
    # "": found when a collector is opened
    controller_host: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"launcher must be one of {', '.join(KINDS)}, but got {self.kind!r}")
        object.__setattr__(self, "kind", Kind(self.kind))  # a kind given as its text

    @property
    def local(self) -> bool:
        """Our own processes are the ranks (no engine starts them)."""
        return self.kind is Kind.LOCAL

    @property
    def host_count(self) -> int:
        return max(1, len(self.hosts))

    @property
    def multi_host(self) -> bool:
        return len(self.hosts) > 1


# -- hosts ------------------------------------------------------------------------------------
def parse_hostfile(text: str) -> list[Host]:
    """Open MPI (``host slots=4``) and MPICH (``host:4``) hostfiles; ``#`` starts a comment."""
    hosts = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        words = line.split()
        name, _, count = words[0].partition(":")
        slots = int(count) if count.isdigit() else None
        for word in words[1:]:
            key, _, value = word.partition("=")
            if key == "slots" and value.isdigit():
                slots = int(value)
        hosts.append(Host(name, slots))
    return hosts


# -- MPI ----------------------------------------------------------------------------------------
def find_mpirun(env: Mapping[str, str], *, python: str | None = None) -> str | None:
    """``$AUTOTUNE_MPIRUN``, else the ``mpirun`` beside our Python, else the one on PATH."""
    import shutil

    explicit = env.get(MPIRUN_ENV)
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    beside = os.path.join(os.path.dirname(python or sys.executable), "mpirun")
    if os.access(beside, os.X_OK):
        return beside
    return shutil.which("mpirun", path=env.get("PATH"))


def mpi_flavor(version_text: str) -> str:
    """From ``mpirun --version`` or ``MPI.Get_library_version()`` text."""
    text = version_text.lower()
    if "open mpi" in text or "open-mpi" in text or "openrte" in text:
        return "openmpi"
    if "hydra" in text or "mpich" in text or "intel(r) mpi" in text:
        return "mpich"
    return "unknown"


def detect_mpi(env: Mapping[str, str]) -> MpiInfo | None:
    """The ``mpirun`` we would use and what it is, or None when there is none."""
    from autotune.hardware import proc
    from autotune import LaunchError

    path = find_mpirun(env)
    if path is None:
        return None
    try:
        result = proc.run_command([path, "--version"], env=dict(env), timeout_s=20.0,
                                  marker="autotune-mpirun-version")
    except LaunchError:
        return MpiInfo(path, "unknown", "")
    text = result.stdout + result.stderr
    version = ""
    m = re.search(r"(?:Version:\s*|Open MPI\)\s*)([\w.]+)", text)
    if m:
        version = m.group(1)
    return MpiInfo(path, mpi_flavor(text), version)


def mpi4py_library(python: str | None = None, timeout_s: float = 30.0) -> str | None:
    """The first line of ``MPI.Get_library_version()`` of the MPI mpi4py loads (in a child
    process, so this one never loads MPI), or None without mpi4py."""
    code = ("import mpi4py; mpi4py.rc.initialize = False; mpi4py.rc.finalize = False\n"
            "from mpi4py import MPI; print(MPI.Get_library_version().strip().splitlines()[0])")
    from autotune.hardware import proc
    from autotune import LaunchError

    try:
        out = proc.run_command([python or sys.executable, "-c", code], env=dict(os.environ),
                               timeout_s=timeout_s, marker="autotune-mpi4py-version")
    except LaunchError:
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def forwarded(env: Mapping[str, str]) -> list[str]:
    """Names of the variables a remote rank needs from us."""
    return sorted(k for k in env if k.startswith(FORWARD_PREFIXES))


def mpirun_argv(*, mpi: MpiInfo, ranks: int, ranks_per_host: int, hosts: Sequence[Host] = (),
                hostfile: str | None = None, forward: Iterable[str] = (),
                as_root: bool = False, extra_args: Sequence[str] = (),
                rank_argv: Sequence[str]) -> list[str]:
    """``mpirun`` running ``rank_argv`` as ``ranks`` processes, ``ranks_per_host`` on each host."""
    if ranks < 1 or ranks_per_host < 1:
        raise ValueError(f"ranks >= 1 and ranks_per_host >= 1 must hold, but got {ranks} and "
                         f"{ranks_per_host}")
    argv = [mpi.path, "-n", str(ranks)]
    if mpi.flavor == "openmpi":
        argv += ["--bind-to", "none", "--oversubscribe"]
        if as_root:
            argv.append("--allow-run-as-root")
        if hostfile:
            argv += ["--hostfile", hostfile]
        elif hosts:
            argv += ["--host", ",".join(f"{h.name}:{ranks_per_host}" for h in hosts)]
        if hosts or hostfile:
            argv += ["--map-by", f"ppr:{ranks_per_host}:node"]
        for name in forward:
            argv += ["-x", name]
    else:  # MPICH / Hydra and compatibles (Intel MPI)
        if hostfile:
            argv += ["-f", hostfile]
        elif hosts:
            argv += ["-hosts", ",".join(h.name for h in hosts)]
        if hosts or hostfile:
            argv += ["-ppn", str(ranks_per_host)]
    argv += list(extra_args)
    return argv + list(rank_argv)


def srun_argv(*, ranks: int, ranks_per_host: int, nodes: int, cpus_per_task: int | None,
              extra_args: Sequence[str] = (), rank_argv: Sequence[str]) -> list[str]:
    """``srun`` inside an allocation: one job step of ``ranks`` tasks."""
    argv = ["srun", f"--ntasks={ranks}", f"--ntasks-per-node={ranks_per_host}",
            f"--nodes={nodes}", "--kill-on-bad-exit=1", "--export=ALL", "--cpu-bind=none"]
    if cpus_per_task:
        argv.append(f"--cpus-per-task={cpus_per_task}")
    return argv + list(extra_args) + list(rank_argv)


# -- Slurm steps -------------------------------------------------------------------------------
# Steps of a job that are not ranks of ours: the batch script's, the extern step, an salloc's
# interactive step.
SERVICE_STEPS = ("batch", "extern", "interactive")


def other_steps(squeue_text: str, *, own_step: str | None = None) -> list[str]:
    """The step ids ``squeue -h -s -o %i`` lists, less the service steps and our own."""
    steps = []
    for word in squeue_text.split():
        _, _, step = word.partition(".")
        if step and step not in SERVICE_STEPS and word != own_step:
            steps.append(word)
    return steps


def wait_steps_ended(env: Mapping[str, str], *, timeout_s: float = 60.0,
                     poll_s: float = 0.5) -> str:
    """Inside a Slurm allocation, wait until no step but ours holds its CPUs: ``""`` once so,
    else why not (the deadline, or ``squeue`` failing).

    A step whose ``srun`` was killed is torn down by Slurm a few seconds later (up to its
    ``KillWait``); until then a new step waits ("Requested nodes are busy") inside the next
    probe's time. Polled with ``squeue``, through `autotune.hardware.proc`.
    """
    import time

    from autotune.hardware import proc
    from autotune import LaunchError

    alloc = slurm_allocation(env)
    if alloc is None:
        return ""
    own = env.get("SLURM_STEP_ID") or env.get("SLURM_STEPID")
    own_step = f"{alloc.job_id}.{own}" if own else None
    deadline = time.monotonic() + timeout_s
    left: list[str] = []
    while True:
        try:
            out = proc.run_command(["squeue", "-h", "-s", "-j", alloc.job_id, "-o", "%i"],
                                   env=dict(env), timeout_s=20.0, marker="autotune-squeue")
        except LaunchError as exc:
            return f"cannot list the allocation's steps: {exc}"
        if out.returncode != 0:
            return (f"cannot list the allocation's steps: squeue exited {out.returncode}: "
                    f"{out.stderr.strip()[:200]}")
        left = other_steps(out.stdout, own_step=own_step)
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(poll_s)
    if left:
        return (f"step(s) {', '.join(left)} still hold the allocation's CPUs {timeout_s:g} s "
                f"after their srun ended; the next step waits for them")
    return ""


# -- command line ---------------------------------------------------------------------------
def add_launcher_args(p: argparse.ArgumentParser) -> None:
    """``--launcher local|mpirun|srun`` and ``--hostfile``, for the commands that start ranks."""
    p.add_argument("--launcher", choices=KINDS, default=None,
                   help="what starts the ranks: local processes (default; srun inside a Slurm "
                        "allocation of several nodes), mpirun, or srun")
    p.add_argument("--hostfile", metavar="FILE",
                   help="hosts for mpirun (Open MPI 'host slots=N' or MPICH 'host:N' lines)")


def from_args(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> Launcher:
    """The launcher the user asked for, checked; `UsageError` says what is missing."""
    return resolve(getattr(args, "launcher", None), getattr(args, "hostfile", None), env)


def resolve(kind: Kind | str | None, hostfile: str | None = None,
            env: Mapping[str, str] | None = None) -> Launcher:
    """A `Launcher` from its kind (None: local, or mpirun with a hostfile, or srun inside a Slurm
    allocation of several nodes) and hostfile, checked; `UsageError` says what is missing."""
    from autotune import UsageError

    env = os.environ if env is None else env
    alloc = slurm_allocation(env)
    if kind is None:
        kind = Kind.MPIRUN if hostfile else \
            (Kind.SRUN if alloc and len(alloc.nodes) > 1 else Kind.LOCAL)
    if kind not in KINDS:
        raise UsageError(f"--launcher must be one of {', '.join(KINDS)}, but got {kind!r}")
    kind = Kind(kind)
    hosts: tuple[Host, ...] = ()
    if hostfile:
        if kind is not Kind.MPIRUN:
            raise UsageError(f"--hostfile needs --launcher mpirun, not {kind}")
        try:
            with open(hostfile) as f:
                hosts = tuple(parse_hostfile(f.read()))
        except OSError as exc:
            raise UsageError(f"--hostfile {hostfile!r}: {exc.strerror}") from None
        if not hosts:
            raise UsageError(f"--hostfile {hostfile!r} lists no host")
        hostfile = os.path.abspath(hostfile)  # a resumed run may start elsewhere
    mpi = None
    if kind is Kind.MPIRUN:
        mpi = detect_mpi(env)
        if mpi is None:
            raise UsageError("--launcher mpirun: no mpirun found beside Python or on PATH; "
                             "pip install 'autotune[mpi]' (mpi4py + mpich) or set "
                             f"{MPIRUN_ENV}")
    if kind is Kind.SRUN:
        if alloc is None:
            raise UsageError("--launcher srun: not inside a Slurm allocation (no SLURM_JOB_ID); "
                             "run under salloc/sbatch")
        hosts = tuple(Host(n) for n in alloc.nodes)
    return Launcher(kind=kind, hosts=hosts, hostfile=hostfile, mpi=mpi)


def describe(launcher: Launcher) -> str:
    """One phrase for messages and the journal: ``mpirun (mpich) on 2 hosts``."""
    text = launcher.kind.value
    if launcher.mpi is not None:
        text += f" ({launcher.mpi.flavor})"
    if launcher.multi_host:
        text += f" on {len(launcher.hosts)} hosts"
    return text
