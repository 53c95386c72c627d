"""Start the ranks of one launch (a probe or the full run): placed, and by the chosen engine.

Each rank is `autotune.launching.rank_command.rank_argv` with `autotune.launching.rank_command.rank_env`, plus its place from
`autotune.launching.placement` (threads, pinned cores, GPU, MPS share). The engine (`autotune.launching.engines`):

* ``local``: one process per rank, started here through `autotune.hardware.proc` (own session, marked for
  clean-up), each with its full environment;
* ``mpirun`` / ``srun``: one engine process, started the same way; the ranks it starts take their
  identity from its variables and their place from ``AUTOTUNE_PLACEMENT``
  (`probes.ranks_env`, at boot).

On GPUs, ranks that share a device run as clients of the controller's MPS daemon
(`autotune.hardware.mps.shared`), which is stopped when the controller exits, whatever the exit; a
background check confirms the daemon really serves them (`RankGroup.mps_check`).

`start_group` returns a `RankGroup`: the launched processes, the placement, the MPS daemon and
the check. A probe (`autotune.measuring.trial`), the full run (`autotune.measuring.fullrun`) and
the allreduce timing all start their ranks through it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from autotune.launching import rank_command, engines, placement

from autotune.hardware import proc
from autotune.hardware.allocation import slurm_allocation
from autotune.hardware.host import Gpu, host_cores, host_gpus
from autotune import LaunchError, Note
from probes import protocol
from probes.protocol import Mode

log = logging.getLogger(__name__)

_IDENTITY = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK")


@dataclass(frozen=True)
class RanksSpec:
    """What to start: the user's command (placeholders allowed), how many ranks, and where.

    ``instances`` is ranks per host on CPU and ranks per GPU on GPUs (a knob ``instances`` in
    ``knobs`` means the same and must agree). ``device``: "auto" (GPUs when NVML sees any),
    "cpu" or "gpu". ``gpus``: how many of the visible GPUs to use, like torchrun's
    ``--nproc-per-node``: 1 by default (a probe measures one GPU's worth), None for all of them;
    a knob ``gpus`` overrides it (0 also means all).
    """

    command: tuple[str, ...]
    knobs: Mapping[str, float] = field(default_factory=dict)
    instances: int = 1
    mode: Mode = Mode.FULL
    cwd: str = "."
    log_dir: Path = Path(".")
    name: str = "run"
    marker: str = "autotune"
    env: Mapping[str, str] | None = None  # base environment (default: ours)
    launcher: engines.Launcher = engines.Launcher()
    device: str = "auto"
    gpus: int | None = 1
    mps_verify_s: float = 120.0  # how long ranks may take to reach CUDA (and so MPS)

    def __post_init__(self):
        object.__setattr__(self, "mode", Mode(self.mode))  # "io" from a flag: parsed once


@dataclass
class RankGroup:
    """The started ranks of one launch and what they run on."""

    launched: list[proc.Launched]
    plan: placement.Plan
    launcher: engines.Launcher
    mps: object | None = None  # autotune.hardware.mps.MpsDaemon when ranks share GPUs
    mps_check: object | None = None  # autotune.hardware.mps.MpsCheck once the check has finished
    _checker: threading.Thread | None = None

    def notes(self) -> list[Note]:
        """What a probe or the full run should tell the user about where its ranks ran."""
        notes = [Note.info(n) for n in self.plan.notes]
        check = self.mps_check
        if check is not None and not check.ok:
            notes.append(Note.warning(check.text))
        return notes

    def wait_mps_check(self, timeout_s: float | None = None):
        """The MPS check once it has ended (None without MPS, or when ``timeout_s`` ran out)."""
        if self._checker is not None:
            self._checker.join(timeout_s)
        return self.mps_check

    def pids(self) -> set[int]:
        return {p.pid for lp in self.launched for p in lp.tree()}

    def service_processes(self) -> list:
        """Processes that work for the ranks but are not theirs: the MPS control daemon and the
        servers it starts (their CPU time is the trial's, not foreign load)."""
        import psutil

        pid = getattr(self.mps, "pid", None)
        if pid is None:
            return []
        try:
            daemon = psutil.Process(pid)
            return [daemon, *daemon.children(recursive=True)]
        except psutil.Error:
            return []

    def running(self) -> bool:
        return any(lp.poll() is None for lp in self.launched)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log_path(spec: RanksSpec, rank: int) -> Path:
    name = spec.name if rank == 0 else f"{spec.name}.rank{rank}"
    return Path(spec.log_dir) / f"{name}.log"


def resolve_instances(spec: RanksSpec) -> int:
    knob = spec.knobs.get("instances")
    if knob is None:
        return int(spec.instances)
    if spec.instances not in (1, int(knob)):
        raise ValueError(f"instances {spec.instances} and knob instances={knob} disagree")
    return int(knob)


def plan_for(spec: RanksSpec, base: Mapping[str, str]) -> placement.Plan:
    """The placement of ``spec`` on each host (hardware looked up here).

    Under ``srun`` a host's cores are the Slurm allocation's CPUs per node
    (`autotune.hardware.allocation`), not the controller's: a step asks for no more than the
    allocation holds, and ranks are not pinned (Slurm places each task's CPUs, and which cores
    another node gives is not known here). More ranks on a node than the allocation can start
    there is a `LaunchError` before anything starts.
    """
    gpus: list[Gpu] = []
    if spec.device != "cpu":
        gpus = host_gpus(base)
        wanted = spec.knobs.get("gpus", spec.gpus)
        if wanted and gpus:
            if int(wanted) > len(gpus):
                raise LaunchError(f"{int(wanted)} GPUs asked for, {len(gpus)} visible")
            gpus = gpus[:int(wanted)]
    knobs, cores, notes = dict(spec.knobs), host_cores(), []
    alloc = slurm_allocation(base) if spec.launcher.kind is engines.Kind.SRUN else None
    if alloc is not None:
        cores = list(range(alloc.node_cpus or len(cores)))
        if knobs.pop("pin", None):
            notes.append("ranks not pinned: under srun Slurm gives each task its CPUs "
                         "(--cpus-per-task), and which cores another node gives is not known "
                         "here")
    try:
        plan = placement.plan(knobs=knobs, instances=resolve_instances(spec), cores=cores,
                              gpus=gpus, device=spec.device)
    except ValueError as exc:
        raise LaunchError(f"cannot place the ranks: {exc}") from None
    most = alloc.ranks_per_node if alloc is not None else None
    if most is not None and plan.local_world_size > most:
        raise LaunchError(
            f"{plan.local_world_size} ranks per node do not fit the Slurm allocation "
            f"({alloc.describe()}): srun cannot start more tasks on a node than it holds; "
            f"lower instances (now {plan.instances}) or allocate more CPUs per node "
            f"(sbatch -c N or --ntasks-per-node N)")
    return dataclasses.replace(plan, notes=plan.notes + tuple(notes)) if notes else plan


def start_group(spec: RanksSpec, *, channel: Mapping[str, str], extra_env: Mapping[str, str] = (),
                stream_output: bool = False,
                on_output: Callable[[int, str], None] | None = None) -> RankGroup:
    """Place and start the ranks of ``spec``; see the module docstring."""
    base = dict(os.environ if spec.env is None else spec.env)
    base.update(dict(extra_env))
    plan = plan_for(spec, base)
    daemon = None
    if plan.needs_mps:
        if spec.launcher.multi_host:
            raise LaunchError("ranks sharing GPUs on several hosts need an MPS daemon on every "
                              "host; start them there (nvidia-cuda-mps-control -d) or use one "
                              "rank per GPU")
        from autotune.hardware import mps

        daemon = mps.shared(env=base)
    knobs = dict(spec.knobs)
    knobs["instances"] = plan.instances
    threads = placement.rank_threads(plan, base, rank_command.THREAD_VARS)
    if threads:
        knobs["threads"] = threads
    args = rank_command.substitute(spec.command[1:], knobs)
    argv = rank_command.rank_argv([spec.command[0], *args])
    skip = rank_command.placeholders(spec.command[1:])
    slot_envs = [_slot_env(slot, daemon) for slot in plan.slots]
    if spec.launcher.kind is engines.Kind.LOCAL:
        started = _start_local(spec, plan, base, knobs, skip, argv, slot_envs, channel,
                               stream_output, on_output)
    else:
        started = _start_engine(spec, plan, base, knobs, skip, argv, slot_envs, channel,
                                stream_output, on_output)
    try:
        group = RankGroup(launched=started, plan=plan, launcher=spec.launcher, mps=daemon)
        if daemon is not None:
            _check_mps_in_background(group, spec.mps_verify_s)
    except BaseException:  # Ctrl-C before the caller holds the ranks: stop them here
        for lp in started:
            proc.stop(lp, grace_s=1.0)
        raise
    return group


def _slot_env(slot: placement.Slot, daemon) -> dict[str, str]:
    env = dict(slot.env)
    if daemon is not None:
        from autotune.hardware import mps

        env.update(mps.client_env(daemon, None))
    return env


def _start_local(spec, plan, base, knobs, skip, argv, slot_envs, channel, stream_output,
                 on_output) -> list[proc.Launched]:
    world = plan.local_world_size
    port = free_port()
    started: list[proc.Launched] = []
    try:
        for rank in range(world):
            env = rank_command.rank_env(base, knobs=knobs, skip=skip, rank=rank, world_size=world,
                                  local_rank=rank, local_world_size=world,
                                  master_addr="127.0.0.1", master_port=port, mode=spec.mode,
                                  channel=channel, run_id=spec.marker)
            env.update(plan.common_env)
            env.update(slot_envs[rank])
            env[protocol.ENV_LAUNCHER] = engines.Kind.LOCAL.value
            env.pop(protocol.ENV_PLACEMENT, None)
            path = log_path(spec, rank)
            callback = None
            if on_output is not None:
                callback = (lambda r: (lambda line: on_output(r, line)))(rank)
            started.append(proc.start(proc.LaunchSpec(
                argv=tuple(argv), env=env, cwd=spec.cwd, marker=f"{spec.marker}-r{rank}",
                stdout_path=path, stderr_path=path, stream_output=stream_output,
                label=f"rank {rank}"), on_output=callback))
    except BaseException:  # by marker: one `proc.start` returned but not yet appended too
        for lp in proc.live():
            if lp.spec.marker.startswith(f"{spec.marker}-r"):
                proc.stop(lp, grace_s=1.0)
        raise
    return started


def engine_env(spec: RanksSpec, plan: placement.Plan, base, knobs, skip, slot_envs, channel,
               *, master_addr: str, master_port: int) -> dict[str, str]:
    """The environment of an mpirun/srun process: what every rank shares, the identity left for
    the ranks to take from the engine, their places in ``AUTOTUNE_PLACEMENT``."""
    hosts = spec.launcher.host_count
    env = rank_command.rank_env(base, knobs=knobs, skip=skip, rank=0,
                          world_size=plan.local_world_size * hosts, local_rank=0,
                          local_world_size=plan.local_world_size, master_addr=master_addr,
                          master_port=master_port, mode=spec.mode, channel=channel,
                          run_id=spec.marker)
    for name in _IDENTITY:
        env.pop(name, None)
    env.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port))  # one rank included
    env.update(plan.common_env)
    env[protocol.ENV_LAUNCHER] = spec.launcher.kind
    env[protocol.ENV_LOCAL_WORLD_SIZE] = str(plan.local_world_size)
    env[protocol.ENV_PLACEMENT] = json.dumps(slot_envs, separators=(",", ":"))
    return env


def engine_argv(spec: RanksSpec, plan: placement.Plan, argv, env) -> list[str]:
    """The mpirun/srun command line for ``spec``."""
    lz = spec.launcher
    per_host = plan.local_world_size
    total = per_host * lz.host_count
    if lz.kind is engines.Kind.MPIRUN:
        if lz.mpi is None:
            raise LaunchError("launcher mpirun without an mpirun; see 'autotune env'")
        forward = engines.forwarded(env) if lz.mpi.flavor == "openmpi" else ()
        return engines.mpirun_argv(mpi=lz.mpi, ranks=total, ranks_per_host=per_host,
                                     hosts=lz.hosts, hostfile=lz.hostfile, forward=forward,
                                     as_root=os.geteuid() == 0, extra_args=lz.extra_args,
                                     rank_argv=argv)
    return engines.srun_argv(ranks=total, ranks_per_host=per_host, nodes=lz.host_count,
                             cpus_per_task=plan.cpus_per_rank, extra_args=lz.extra_args,
                             rank_argv=argv)


def _start_engine(spec, plan, base, knobs, skip, argv, slot_envs, channel, stream_output,
                  on_output) -> list[proc.Launched]:
    master = spec.launcher.hosts[0].name if spec.launcher.multi_host else "127.0.0.1"
    env = engine_env(spec, plan, base, knobs, skip, slot_envs, channel, master_addr=master,
                     master_port=free_port())
    full_argv = engine_argv(spec, plan, argv, env)
    path = log_path(spec, 0)
    callback = None
    if on_output is not None:
        callback = (lambda line: on_output(0, line))
    return [proc.start(proc.LaunchSpec(
        argv=tuple(full_argv), env=env, cwd=spec.cwd, marker=f"{spec.marker}-r0",
        stdout_path=path, stderr_path=path, stream_output=stream_output,
        label=spec.launcher.kind), on_output=callback)]


def _check_mps_in_background(group: RankGroup, timeout_s: float) -> None:
    daemon = group.mps

    def check():
        result = daemon.verify(group.pids, expected=group.plan.local_world_size,
                               timeout_s=timeout_s, still_running=group.running)
        group.mps_check = result
        if result.ok:
            log.info("%s", result.text)
        else:
            log.warning("%s", result.text)

    group._checker = threading.Thread(target=check, name="autotune-mps-check", daemon=True)
    group._checker.start()
