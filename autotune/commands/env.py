"""``autotune env``: what hardware and backends this machine offers, and why not when it doesn't.

Cores (and our share of them), NUMA nodes, memory, GPUs through NVML, MPS, the MPI launcher and
the MPI library mpi4py loads (they must match), a Slurm allocation (its nodes, CPUs, tasks and
GPUs per node), the machine tune searches over (a node of the allocation inside one, else this
host), torch and its distributed backends. ``--json`` prints the same as one JSON object.
"""

from __future__ import annotations

import os
import platform
import shutil
from pathlib import Path

import psutil

from autotune.hardware.allocation import slurm_allocation
from autotune.hardware.host import host_cores, node_cores
from autotune.store import jsontext
from probes import protocol


def add_parser(sub):
    p = sub.add_parser("env", help="what hardware/backends were detected, and why not",
                       description="Show the cores, memory, GPUs (NVML), MPS, MPI launcher, "
                                   "Slurm allocation and torch backends autotune sees here.")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plain", action="store_true", help="no colours")
    return p


def numa_nodes(root: str = "/sys/devices/system/node") -> list[dict]:
    """NUMA nodes and their CPUs, from sysfs (empty where there is none)."""
    nodes = []
    for path in sorted(Path(root).glob("node[0-9]*"), key=lambda p: int(p.name[4:])):
        try:
            cpus = sorted(protocol.parse_cpus((path / "cpulist").read_text().strip()))
        except (OSError, ValueError):
            continue
        nodes.append({"node": int(path.name[4:]), "cpus": cpus})
    return nodes


def collect(env=None) -> dict:
    """Everything `autotune env` reports, as plain data."""
    from autotune.launching import engines
    from autotune.hardware import mps, nvml

    env = dict(os.environ if env is None else env)
    vm = psutil.virtual_memory()
    affinity = host_cores()
    gpus_ok, gpus_why = nvml.available()
    mps_ok, mps_why = mps.available(env)
    mpi = engines.detect_mpi(env)
    library = engines.mpi4py_library()
    alloc = slurm_allocation(env)
    mpi_info = {"mpirun": mpi.path if mpi else None, "flavor": mpi.flavor if mpi else None,
                "version": mpi.version if mpi else None, "mpi4py_library": library,
                "match": None, "why_not": ""}
    if mpi is None:
        mpi_info["why_not"] = ("no mpirun beside Python or on PATH (pip install "
                               "'autotune[mpi]' for mpi4py + mpich)")
    if mpi and library:
        mpi_info["match"] = engines.mpi_flavor(library) == mpi.flavor
        if not mpi_info["match"]:
            mpi_info["why_not"] = (f"mpirun is {mpi.flavor} but mpi4py loads "
                                   f"{engines.mpi_flavor(library)}: ranks would start as "
                                   f"singletons; set {engines.MPIRUN_ENV}")
    return {
        "host": {"name": platform.node(), "os": platform.platform(),
                 "python": platform.python_version()},
        "cpu": {"logical": psutil.cpu_count(logical=True),
                "physical": psutil.cpu_count(logical=False), "usable": len(affinity),
                "affinity": affinity, "numa": numa_nodes()},
        "memory": {"total_bytes": vm.total, "available_bytes": vm.available},
        "gpus": {"available": gpus_ok, "why_not": gpus_why, "driver": nvml.driver_version(),
                 "devices": [d.to_dict() for d in nvml.devices()]},
        "mps": {"available": mps_ok, "why_not": mps_why,
                "control": mps.find_binary(env)},
        "mpi": mpi_info,
        "slurm": None if alloc is None else {
            "job_id": alloc.job_id, "nodes": list(alloc.nodes), "nnodes": alloc.node_count,
            "cpus_on_node": alloc.cpus_on_node, "cpus_per_node": list(alloc.cpus_per_node),
            "node_cpus": alloc.node_cpus, "ntasks": alloc.ntasks,
            "tasks_per_node": alloc.tasks_per_node, "ranks_per_node": alloc.ranks_per_node,
            "gpus_per_node": alloc.gpus_per_node, "srun": shutil.which("srun")},
        # what tune searches over: a node of the allocation inside one, else this host
        "machine": {"cores_per_node": node_cores(env),
                    "nodes": alloc.node_count if alloc is not None else 1,
                    "ranks_per_node": alloc.ranks_per_node if alloc is not None else None,
                    "from": "slurm allocation" if alloc is not None else "this host"},
        "torch": _torch(),
    }


def _torch() -> dict:
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        return {"version": None, "why_not": str(exc)}
    backends = {}
    if dist.is_available():
        backends = {"gloo": dist.is_gloo_available(), "nccl": dist.is_nccl_available(),
                    "mpi": dist.is_mpi_available()}
    return {"version": torch.__version__, "cuda": torch.version.cuda,
            "cuda_available": torch.cuda.is_available(), "threads": torch.get_num_threads(),
            "distributed": backends}


def lines(info: dict) -> list[str]:
    """The human report: one line per fact, 'no (why)' where something is missing."""
    gib = 2**30
    cpu, mem, gpus, mpi, t = info["cpu"], info["memory"], info["gpus"], info["mpi"], info["torch"]
    out = [f"host      {info['host']['name']} ({info['host']['os']}, Python "
           f"{info['host']['python']})",
           f"cores     {cpu['logical']} logical, {cpu['physical']} physical, "
           f"{cpu['usable']} usable by us",
           "numa      " + (", ".join(f"node {n['node']}: {len(n['cpus'])} cpus"
                                    for n in cpu["numa"]) or "none reported"),
           f"memory    {mem['total_bytes'] / gib:.1f} GiB, {mem['available_bytes'] / gib:.1f} "
           f"GiB available"]
    if gpus["available"]:
        out.append(f"gpus      {len(gpus['devices'])} (driver {gpus['driver']})")
        for d in gpus["devices"]:
            mem_gib = (d["mem_total_bytes"] or 0) / gib
            out.append(f"  gpu {d['index']}  {d['name']}  {mem_gib:.0f} GiB  {d['uuid']}")
    else:
        out.append(f"gpus      none ({gpus['why_not']})")
    m = info["mps"]
    out.append("mps       " + (f"{m['control']} found (a daemon starts when ranks share a GPU)"
                               if m["available"] else f"no ({m['why_not']})"))
    if mpi["mpirun"]:
        match = {True: "matches mpi4py", False: "DOES NOT match mpi4py", None: "mpi4py absent"}
        out.append(f"mpirun    {mpi['mpirun']} ({mpi['flavor']} {mpi['version']}; "
                   f"{match[mpi['match']]})")
    else:
        out.append(f"mpirun    none ({mpi['why_not']})")
    if mpi["mpi4py_library"]:
        out.append(f"mpi4py    {mpi['mpi4py_library']}")
    if mpi["match"] is False:
        out.append(f"WARNING: {mpi['why_not']}")
    s = info["slurm"]
    if s is None:
        out.append("slurm     no allocation (no SLURM_JOB_ID)")
    else:
        cpus = "?" if s["node_cpus"] is None else s["node_cpus"]
        extra = "".join(f", {v} {what}" for v, what in ((s["tasks_per_node"], "tasks/node"),
                                                         (s["gpus_per_node"], "gpus/node"))
                        if v is not None)
        out.append(f"slurm     job {s['job_id']}: {s['nnodes']} node(s) {','.join(s['nodes'])}, "
                   f"{cpus} cpus/node{extra}, srun {s['srun'] or 'not on PATH'}")
    m = info["machine"]
    most = f", at most {m['ranks_per_node']} rank(s) per node" if m["ranks_per_node"] else ""
    out.append(f"machine   {m['nodes']} node(s) x {m['cores_per_node']} core(s){most} "
               f"(from {m['from']}: what tune searches over)")
    launch = ["local"] + (["mpirun"] if mpi["mpirun"] else []) + (
        ["srun"] if s is not None and s["srun"] else [])
    out.append(f"launchers {', '.join(launch)}")
    if t.get("version"):
        dist = ", ".join(k for k, v in t["distributed"].items() if v) or "none"
        out.append(f"torch     {t['version']} (CUDA {t['cuda'] or 'none'}, "
                   f"{'GPU usable' if t['cuda_available'] else 'no GPU'}), distributed: {dist}, "
                   f"{t['threads']} threads")
    else:
        out.append(f"torch     not importable ({t['why_not']})")
    return out


def run(args) -> int:
    info = collect()
    if args.json:
        print(jsontext.dumps(info))
        return 0
    from autotune.monitor import console

    out = console.make_console(plain=args.plain)
    for line in lines(info):
        out.print(line, markup=False)
    return 0
