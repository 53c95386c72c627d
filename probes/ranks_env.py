"""Inside a rank, before the user's script (and torch) load: its identity and its placement.

Ranks started by autotune itself already carry torchrun's variables. Ranks started by another
engine carry that engine's instead, and get torchrun's derived from them here:

=============  =========================  ====================  ============================
torchrun       Open MPI                   MPICH (Hydra)         Slurm (srun)
=============  =========================  ====================  ============================
RANK           OMPI_COMM_WORLD_RANK       PMI_RANK              SLURM_PROCID
WORLD_SIZE     OMPI_COMM_WORLD_SIZE       PMI_SIZE              SLURM_NTASKS
LOCAL_RANK     OMPI_COMM_WORLD_LOCAL_RANK MPI_LOCALRANKID       SLURM_LOCALID
LOCAL_WORLD_   OMPI_COMM_WORLD_LOCAL_SIZE MPI_LOCALNRANKS       SLURM_STEP_TASKS_PER_NODE
SIZE                                                            (at SLURM_NODEID)
=============  =========================  ====================  ============================

``MASTER_ADDR``/``MASTER_PORT`` come from the controller through the launcher's environment.
Then the rank's entry of ``AUTOTUNE_PLACEMENT`` (by host-local rank) is applied, and the rank is
pinned to ``AUTOTUNE_CPUS`` when set. Standard library only; safe to call twice.
"""

from __future__ import annotations

import json
import os
import re
import sys

from probes import protocol

_OMPI = ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
         "OMPI_COMM_WORLD_LOCAL_SIZE")
_PMI = ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")
_SLURM = ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", None)


def _int(env, name) -> int | None:
    if name is None:
        return None
    raw = env.get(name)
    try:
        return int(raw) if raw not in (None, "") else None
    except ValueError:
        return None


def slurm_tasks_on_node(tasks_per_node: str, node_id: int) -> int | None:
    """Tasks on node ``node_id`` from Slurm's compressed list, e.g. ``"2(x3),1"``."""
    counts: list[int] = []
    for part in tasks_per_node.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not m:
            return None
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    return counts[node_id] if 0 <= node_id < len(counts) else None


def identity(env) -> dict[str, str] | None:
    """torchrun's identity variables from whatever launcher started this process, or None."""
    order = [_OMPI, _PMI, _SLURM]
    if env.get(protocol.ENV_LAUNCHER) == "srun":
        order = [_SLURM, _OMPI, _PMI]
    for names in order:
        rank, size = _int(env, names[0]), _int(env, names[1])
        if rank is None or size is None:
            continue
        local_size = _int(env, names[3])
        if local_size is None and names is _SLURM:
            per_node = env.get("SLURM_STEP_TASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
            node = _int(env, "SLURM_NODEID")
            if per_node and node is not None:
                local_size = slurm_tasks_on_node(per_node, node)
        if local_size is None:
            local_size = _int(env, protocol.ENV_LOCAL_WORLD_SIZE) or size
        local_rank = _int(env, names[2])
        if local_rank is None:
            local_rank = rank % local_size  # ranks laid out in blocks per host
        return {"RANK": str(rank), "WORLD_SIZE": str(size), "LOCAL_RANK": str(local_rank),
                "LOCAL_WORLD_SIZE": str(local_size), "GROUP_RANK": str(rank // local_size)}
    return None


def placement_entry(env) -> dict[str, str]:
    """This rank's entry of ``AUTOTUNE_PLACEMENT`` (empty when there is none)."""
    raw = env.get(protocol.ENV_PLACEMENT)
    if not raw:
        return {}
    table = json.loads(raw)
    host_local = _int(env, protocol.ENV_HOST_LOCAL_RANK)
    if host_local is None:
        host_local = _int(env, "LOCAL_RANK") or 0
    if not 0 <= host_local < len(table):
        raise ValueError(f"local rank {host_local} has no entry in {protocol.ENV_PLACEMENT} "
                         f"({len(table)} entries): more ranks on this host than planned")
    return {str(k): str(v) for k, v in table[host_local].items()}


def apply(env=None) -> list[str]:
    """Complete this rank's environment in place and pin it; returns warnings (also printed)."""
    env = os.environ if env is None else env
    warnings = []
    if "RANK" not in env:
        ident = identity(env)
        if ident is not None:
            env.update(ident)
            env.setdefault(protocol.ENV_HOST_LOCAL_RANK, ident["LOCAL_RANK"])
    try:
        env.update(placement_entry(env))
    except (ValueError, TypeError) as exc:
        warnings.append(f"placement not applied: {exc}")
    cpus = env.get(protocol.ENV_CPUS)
    if cpus and hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, protocol.parse_cpus(cpus))
        except (OSError, ValueError) as exc:
            warnings.append(f"cannot pin to cores {cpus}: {exc}")
    for w in warnings:
        print(f"autotune: WARNING: {w}", file=sys.stderr)
    return warnings
