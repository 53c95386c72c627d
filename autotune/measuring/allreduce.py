"""Allreduce cost by message size on this host's ranks, and the bucket_mb range it suggests.

`measure` runs ``python -m probes.allreduce`` as the ranks of a job, through the same launcher
as training (`autotune.launching.group`), and reads rank 0's JSON. `bucket_range` is pure: fusion buckets
smaller than the size where the bus bandwidth reaches half its peak pay mostly latency; beyond a
few times the size where it saturates, bigger buckets only delay the overlap of communication
with the backward pass. The search (issue 3) can take its bounds for ``bucket_mb`` from there.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from autotune.launching import engines

from autotune.hardware import proc
from autotune.hardware.allocation import slurm_allocation
from autotune.measuring import logs
from autotune import LaunchError

MB = 1024 * 1024


@dataclass(frozen=True)
class Point:
    bytes: int
    latency_s: float
    algbw_gbps: float
    busbw_gbps: float
    iters: int = 0


@dataclass(frozen=True)
class AllreduceResult:
    backend: str
    world_size: int
    device: str
    points: tuple[Point, ...]

    def to_dict(self) -> dict:
        return {"backend": self.backend, "world_size": self.world_size, "device": self.device,
                "points": [p.__dict__ for p in self.points],
                "bucket_mb_range": list(bucket_range(self))}


def parse(data: dict) -> AllreduceResult:
    """Rank 0's JSON (see `probes.allreduce`) as a result; ValueError when malformed."""
    try:
        points = tuple(Point(**{k: p[k] for k in Point.__dataclass_fields__ if k in p})
                       for p in data["points"])
        result = AllreduceResult(backend=str(data["backend"]), world_size=int(data["world_size"]),
                                 device=str(data.get("device", "cpu")), points=points)
    except (KeyError, TypeError) as exc:
        raise ValueError(f"not an allreduce result: {exc}") from None
    if not points:
        raise ValueError("an allreduce result without a single message size")
    return result


def bucket_range(result: AllreduceResult, *, low_share: float = 0.5, high_share: float = 0.9,
                 floor_mb: float = 1.0, ceiling_mb: float = 256.0) -> tuple[float, float]:
    """(low, high) bounds for ``bucket_mb`` from measured bus bandwidth by message size.

    low: the smallest size reaching ``low_share`` of the peak bus bandwidth (at least
    ``floor_mb``); high: four times the smallest size reaching ``high_share`` of the peak
    (at most ``ceiling_mb``, at least 4 x low). Powers of two in MB.
    """
    points = sorted(result.points, key=lambda p: p.bytes)
    peak = max(p.busbw_gbps for p in points)
    if peak <= 0:
        return floor_mb, ceiling_mb

    def first_reaching(share):
        return next(p.bytes for p in points if p.busbw_gbps >= share * peak)

    low = max(floor_mb, _pow2_mb(first_reaching(low_share)))
    high = min(ceiling_mb, max(4 * low, 4 * _pow2_mb(first_reaching(high_share))))
    return low, max(low, high)


def _pow2_mb(nbytes: int) -> float:
    mb = nbytes / MB
    p = 1.0 / 1024
    while p < mb:
        p *= 2
    return p


def placement_for(ranks: int, gpu_count: int) -> tuple[str, int, int | None]:
    """(device, instances, gpus) for ``ranks`` allreduce ranks: one rank per GPU on NCCL when
    there are enough GPUs, else CPU ranks on gloo (no MPS needed for a probe)."""
    if gpu_count >= ranks:
        return "gpu", 1, ranks
    return "cpu", ranks, None


def ranks_per_host(ranks: int, launcher: engines.Launcher, env) -> int:
    """Ranks to start on each host for ``ranks`` in all: spread over the launcher's hosts (one
    on each of two nodes: the allreduce crosses the link between them, as training's will),
    and under ``srun`` no more on a node than the Slurm allocation can start there
    (`autotune.hardware.allocation`), as a probe's ranks."""
    per_host = max(1, -(-ranks // launcher.host_count))
    alloc = slurm_allocation(env) if launcher.kind is engines.Kind.SRUN else None
    if alloc is not None and alloc.ranks_per_node:
        per_host = min(per_host, alloc.ranks_per_node)
    return per_host


def measure(*, ranks: int = 2, log_dir: Path, cwd: str = ".",
            launcher: engines.Launcher = engines.Launcher(), device: str = "auto",
            min_bytes: int = 4096, max_bytes: int = 256 * MB, seconds_per_size: float = 0.3,
            timeout_s: float = 300.0, env=None) -> AllreduceResult:
    """Run the allreduce probe as ``ranks`` ranks (`ranks_per_host` on each of the launcher's
    hosts) and return rank 0's result. ``device="auto"``: see `placement_for`.

    Raises `LaunchError` with the log's tail when the probe fails or runs out of time.
    """
    from autotune.hardware.host import host_gpus
    from autotune.launching.group import RanksSpec, start_group

    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    out = log_dir / "allreduce.json"
    out.unlink(missing_ok=True)
    command = (sys.executable, "-m", "probes.allreduce", "--out", str(out),
               "--min-bytes", str(min_bytes), "--max-bytes", str(max_bytes),
               "--seconds-per-size", str(seconds_per_size))
    base = os.environ if env is None else env
    instances, gpus = ranks_per_host(ranks, launcher, base), None
    if device == "auto":  # the GPUs we may use: CUDA_VISIBLE_DEVICES honoured
        visible = host_gpus(base)
        device, instances, gpus = placement_for(instances, len(visible))
    if device == "cpu":
        # CPU ranks on a GPU host must not pick NCCL because CUDA is there: each would take
        # cuda:LOCAL_RANK, and a host with fewer GPUs than ranks has no such device.
        command += ("--backend", "gloo")
    spec = RanksSpec(command=command, instances=instances, gpus=gpus, cwd=cwd, log_dir=log_dir,
                     name="allreduce", marker=f"allreduce-{time.monotonic_ns()}", env=env,
                     launcher=launcher, device=device)
    group = start_group(spec, channel={})
    deadline = time.monotonic() + timeout_s
    try:
        while group.running() and time.monotonic() < deadline:
            if any(lp.poll() not in (None, 0) for lp in group.launched):
                break  # one rank failed: the others would wait for it forever
            time.sleep(0.1)
        timed_out = group.running() and time.monotonic() >= deadline
    finally:
        codes = [proc.stop(lp, grace_s=2.0) for lp in group.launched]
        if launcher.kind is engines.Kind.SRUN and -signal.SIGKILL in codes:
            engines.wait_steps_ended(base)  # the next step would wait for a killed one
    log = log_dir / "allreduce.log"
    if timed_out or any(c != 0 for c in codes) or not out.exists():
        why = f"ran past {timeout_s:g} s" if timed_out else f"exit codes {codes}"
        raise LaunchError(f"the allreduce probe failed ({why}); see {log}:\n"
                          f"{logs.tail(log, 10) or '(no log)'}")
    return parse(json.loads(out.read_text()))


def rows(result: AllreduceResult) -> list[tuple[str, str, str]]:
    """(size, latency, bus bandwidth) as text, for tables."""
    out = []
    for p in result.points:
        size = f"{p.bytes / MB:g} MB" if p.bytes >= MB else f"{p.bytes / 1024:g} KB"
        out.append((size, f"{p.latency_s * 1e6:.0f} us", f"{p.busbw_gbps:.3f} GB/s"))
    return out
