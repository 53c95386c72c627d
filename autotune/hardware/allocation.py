"""The Slurm allocation we run inside, if any: its nodes, and what each node holds for us.

Pure: parsed from the environment Slurm gives a job (``sbatch``/``salloc``) and its steps. Inside
an allocation the machine is the allocation, not the host the controller runs on (DESIGN.md,
"Running"): a node's CPUs are ``SLURM_JOB_CPUS_PER_NODE`` (``"1(x2)"``, ``"4,2"``; one entry
per node of ``SLURM_JOB_NODELIST``, in its order), which is what a job step may ask for, whatever
the hardware has. A step that asks for more fails with "More processors requested than
permitted".
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class SlurmAllocation:
    """A Slurm job's allocation, as its environment describes it.

    ``cpus_per_node``: the CPUs allocated on each node, in the order of ``nodes`` (empty when
    Slurm did not say); ``cpus_on_node``: this node's (``SLURM_CPUS_ON_NODE``).
    ``tasks_per_node``: ``--ntasks-per-node`` when the job was given one. ``gpus_per_node``:
    the GPUs allocated on a node, None when none were asked for.
    """

    job_id: str
    nodes: tuple[str, ...]
    cpus_on_node: int | None = None
    cpus_per_node: tuple[int, ...] = ()
    ntasks: int | None = None
    tasks_per_node: int | None = None
    gpus_per_node: int | None = None
    nnodes: int | None = None  # SLURM_NNODES, when set

    @property
    def node_count(self) -> int:
        return max(1, self.nnodes or len(self.nodes) or len(self.cpus_per_node) or 1)

    @property
    def node_cpus(self) -> int | None:
        """CPUs a step may use on every node: the fewest any node of the allocation holds
        (a step places as many ranks on each node), else this node's; None when unknown."""
        if self.cpus_per_node:
            return min(self.cpus_per_node)
        return self.cpus_on_node

    @property
    def ranks_per_node(self) -> int | None:
        """The most ranks (tasks of one CPU) a step can start on every node: its CPUs, or the
        job's ``--ntasks-per-node`` when smaller; None when unknown."""
        limits = [n for n in (self.node_cpus, self.tasks_per_node) if n]
        return min(limits) if limits else None

    def describe(self) -> str:
        """``job 42: 2 nodes (node1,node2), 1 CPU per node``."""
        cpus = self.node_cpus
        per = f", {cpus} CPU{'s' if cpus != 1 else ''} per node" if cpus else ""
        tasks = f", {self.tasks_per_node} tasks per node" if self.tasks_per_node else ""
        gpus = f", {self.gpus_per_node} GPUs per node" if self.gpus_per_node else ""
        names = f" ({','.join(self.nodes)})" if self.nodes else ""
        n = self.node_count
        return f"job {self.job_id}: {n} node{'s' if n != 1 else ''}{names}{per}{tasks}{gpus}"


def expand_nodelist(text: str) -> list[str]:
    """Slurm's compressed node list: ``"gpu[01-03,07],login5"`` -> gpu01 gpu02 gpu03 gpu07 login5."""
    names: list[str] = []
    for m in re.finditer(r"([^,\[]+)(?:\[([^\]]+)\])?(?:,|$)", text):
        prefix, ranges = m.group(1), m.group(2)
        if not prefix and not ranges:
            continue
        if ranges is None:
            names.append(prefix)
            continue
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            if not hi:
                names.append(prefix + lo)
                continue
            width = len(lo)
            names.extend(f"{prefix}{i:0{width}d}" for i in range(int(lo), int(hi) + 1))
    return names


def expand_counts(text: str) -> tuple[int, ...]:
    """Slurm's compressed per-node counts: ``"2(x3),1"`` -> 2 2 2 1; ``"4,2"`` -> 4 2.

    ValueError names the text when it is not of that form.
    """
    counts: list[int] = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)\s*(?:\(x(\d+)\))?\s*", part)
        if not m:
            raise ValueError(f"not a Slurm per-node count list: {text!r} (expected e.g. "
                             f"'2(x3),1')")
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    return tuple(counts)


def gpu_count(text: str) -> int | None:
    """GPUs from ``SLURM_GPUS_PER_NODE``/``SLURM_GPUS_ON_NODE`` (``"4"``, ``"a100:2"``,
    ``"gpu:a100:2"``); None when it names no count."""
    m = re.search(r"(\d+)\s*$", text.strip())
    return int(m.group(1)) if m else None


def slurm_allocation(env: Mapping[str, str]) -> SlurmAllocation | None:
    """The Slurm job we run inside, if any (``SLURM_JOB_ID`` and friends). A value Slurm wrote
    in a form we cannot read is left unknown (None or empty) rather than guessed."""
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if not job:
        return None

    def num(name):
        m = re.match(r"\s*(\d+)", env.get(name, ""))
        return int(m.group(1)) if m else None

    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
    try:
        cpus_per_node = expand_counts(env["SLURM_JOB_CPUS_PER_NODE"]) \
            if env.get("SLURM_JOB_CPUS_PER_NODE") else ()
    except ValueError:
        cpus_per_node = ()
    tasks_per_node = None
    if env.get("SLURM_NTASKS_PER_NODE"):
        try:
            tasks_per_node = min(expand_counts(env["SLURM_NTASKS_PER_NODE"]))
        except ValueError:
            pass
    gpus = None
    for name in ("SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE"):
        if env.get(name):
            gpus = gpu_count(env[name])
            if gpus is not None:
                break
    if gpus is None and env.get("SLURM_JOB_GPUS"):  # indices of the job's GPUs on this node
        gpus = len([g for g in env["SLURM_JOB_GPUS"].split(",") if g.strip()])
    return SlurmAllocation(job_id=job, nodes=tuple(expand_nodelist(nodelist)),
                           cpus_on_node=num("SLURM_CPUS_ON_NODE"), cpus_per_node=cpus_per_node,
                           ntasks=num("SLURM_NTASKS") or num("SLURM_NPROCS"),
                           tasks_per_node=tasks_per_node, gpus_per_node=gpus,
                           nnodes=num("SLURM_NNODES") or num("SLURM_JOB_NUM_NODES"))
