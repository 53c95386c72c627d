"""The side-by-side: one rank with the whole GPU against 2, 3, 4 ranks co-located on it under MPS
(at the shares the tuner picked, else fixed ones), time-sliced (no MPS), and the tuned recipe
through ``autotune run``; each run its own processes, configurations interleaved over rounds in
rotated order (variance lives between processes), each rate the script's own steady samples/s.

During every run NVML is sampled (utilisation, memory, power, energy) and, for MPS runs, the
daemon's ``get_server_list`` / ``get_client_list`` and NVML's MPS process list are polled until
every rank shows up as a client. The kit's own daemon lives for one run: started before the
ranks, stopped with ``quit`` after them, checked gone.
"""

from __future__ import annotations

import json
import os
import re
import socket
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from gpuproof import mpsd, procs
from gpuproof.context import ROOT, Context
from gpuproof.nvmlread import Nvml, Sampler
from gpuproof.record import Step
from gpuproof.steps import product_mps_after

RATE = re.compile(r"steady samples/s ([0-9.]+)")


@dataclass(frozen=True)
class Config:
    """One configuration: ``via`` is ``plain`` (the kit starts the ranks) or ``autotune-run``."""

    key: str
    label: str
    ranks: int
    mps: bool
    share: float | None = None
    share_source: str = ""
    via: str = "plain"
    threads: int | None = None  # OMP/MKL threads per rank; None: torchrun's (1 when several)
    clock: str = ""  # through autotune run: AUTOTUNE_STEP_CLOCK ("host": no CUDA events)


def fixed_share(ranks: int) -> float:
    """The share when the tuner gave none: an even split, at least 25% (AccDP ran 4 at ~30%)."""
    return float(max(25, round(100 / ranks)))


def plan(*, instances, mps_ok: bool, time_sliced, shares: dict,
         recipe: dict | None, recipe_threads: int | None = None) -> list[Config]:
    """Pure: the configurations to compare, the baseline first.

    ``recipe_threads``: the threads autotune gives each of the recipe's ranks. When they differ
    from torchrun's one, the recipe's ranks are also started plain with that many threads, so
    that a gap between the recipe through ``autotune run`` and the plain ranks is told apart:
    the thread count, or autotune's meter; and through ``autotune run`` with its step clock on
    the host, which tells the meter's CUDA events apart from the rest of it.
    """
    configs = [Config("1x100", "1 rank, whole GPU (the plain script)", 1, False)]
    for n in instances:
        if mps_ok:
            picked = shares.get(n)
            share = float(picked["thread_pct"]) if picked else fixed_share(n)
            source = (f"tuner's {picked['trial']}" if picked
                      else "fixed (no tuned trial at this count)")
            configs.append(Config(f"{n}xmps{share:g}", f"{n} ranks under MPS, {share:g}% each", n,
                                  True, share, source))
    for n in (time_sliced if time_sliced is not None
              else (max(instances),) if mps_ok and instances else instances):
        configs.append(Config(f"{n}xts", f"{n} ranks time-sliced (no MPS)", n, False))
    ranks = int(recipe["knobs"].get("instances", 1)) if recipe else 1
    if recipe and mps_ok and ranks > 1 and recipe_threads not in (None, 1):
        share = recipe["knobs"].get("thread_pct", 100)
        configs.append(Config(f"{ranks}xmps{share:g}-t{recipe_threads}",
                              f"{ranks} ranks under MPS, {share:g}% each, started plain with "
                              f"autotune's {recipe_threads} threads each", ranks, True,
                              float(share), "the recipe's", threads=recipe_threads))
    if recipe and mps_ok and ranks > 1:
        configs.append(Config("recipe-hostclock", "tuned recipe through autotune run, its step "
                              "clock on the host (AUTOTUNE_STEP_CLOCK=host: no CUDA events)",
                              ranks, True, recipe["knobs"].get("thread_pct"), "tuner's best",
                              via="autotune-run", clock="host"))
    if recipe:
        configs.append(Config("recipe", f"tuned recipe through autotune run {recipe['knobs']}",
                              int(recipe["knobs"].get("instances", 1)),
                              bool(mps_ok and (int(recipe["knobs"].get("instances", 1)) > 1 or
                                               recipe["knobs"].get("thread_pct", 100) < 100)),
                              recipe["knobs"].get("thread_pct"), "tuner's best",
                              via="autotune-run"))
    return configs


def rotations(count: int, rounds: int) -> list[list[int]]:
    """Pure: round r runs the configurations in order rotated by r (A B C, B C A, C A B...)."""
    return [[(i + r) % count for i in range(count)] for r in range(rounds)]


def parse_rate(text: str) -> float | None:
    """Pure: the last 'steady samples/s X' the script printed (None for none or 'n/a')."""
    found = RATE.findall(text)
    return float(found[-1]) if found else None


def summarise(configs: list[Config], runs: list[dict]) -> list[dict]:
    """Pure: per configuration, its rounds, the median, and the ratio to the baseline's median."""
    rows = []
    for c in configs:
        mine = [r for r in runs if r["key"] == c.key]
        rates = [r["samples_per_s"] for r in mine if r["samples_per_s"]]
        power = [r["gpu"]["power_w_mean"] for r in mine if r.get("gpu", {}).get("power_w_mean")]
        util = [r["gpu"]["util_pct_mean"] for r in mine
                if r.get("gpu", {}).get("util_pct_mean") is not None]
        mem = [r["gpu"]["mem_used_bytes_max"] for r in mine
               if r.get("gpu", {}).get("mem_used_bytes_max") is not None]
        median = statistics.median(rates) if rates else None
        rows.append({**asdict(c), "rates": [r["samples_per_s"] for r in mine], "median": median,
                     "util_pct": statistics.fmean(util) if util else None,
                     "mem_used_bytes_max": max(mem) if mem else None,
                     "power_w": statistics.fmean(power) if power else None,
                     "j_per_sample": (statistics.fmean(power) / median)
                     if power and median else None,
                     "mps_verified": [r.get("mps", {}).get("verified") for r in mine],
                     "failed": [r["error"] for r in mine if r.get("error")]})
    base = rows[0]["median"] if rows else None
    for row in rows:
        row["vs_baseline"] = row["median"] / base if base and row["median"] else None
    return rows


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(ctx: Context) -> Step:
    step = Step("measure")
    if why := ctx.gate():
        return step.skip(why)
    s = ctx.settings
    mps_facts = ctx.facts.get("mps", {})
    mps_ok = bool(mps_facts.get("started"))
    if not mps_ok:
        step.partial(f"MPS cannot start here ({mps_facts.get('why_not') or 'not checked'}): "
                     f"co-located ranks measured time-sliced only")
    tune = _tune_record(ctx.out)
    shares = {int(k): v for k, v in (tune.get("data", {}).get("shares") or {}).items()}
    summary = tune.get("data", {}).get("summary") or {}
    recipe = None
    if tune.get("status") in ("ok", "incomplete") and summary.get("recipe"):
        # OUT/recipes first: OUT may have been carried here from the machine that tuned
        path = ctx.out / "recipes" / Path(summary["recipe"]).name
        recipe = {"path": str(path if path.exists() else summary["recipe"]),
                  "knobs": summary["best"]["knobs"]}
    else:
        step.partial("no tuned recipe (the tune step did not run or failed): the recipe through "
                     "autotune run is not measured, shares are fixed")
    threads = autotune_threads(recipe["knobs"], len(os.sched_getaffinity(0))) if recipe else None
    configs = plan(instances=s.instances, mps_ok=mps_ok, time_sliced=s.time_sliced,
                   shares=shares, recipe=recipe, recipe_threads=threads)
    step.data["configs"] = [asdict(c) for c in configs]
    for c in configs:
        step.say(f"config {c.key}: {c.label}" + (f" (share: {c.share_source})" if c.mps else ""))
    nvml = Nvml()
    if not nvml.ok:
        step.say(f"no NVML readings during the runs: {nvml.why}")
    runs = []
    for r, order in enumerate(rotations(len(configs), s.rounds), start=1):
        for i in order:
            res = one_run(ctx, configs[i], nvml, mps_facts.get("binary"), recipe, r)
            runs.append(res)
            step.say(describe(res))
            if res.get("error"):
                step.fail(f"{res['key']} round {r}: {res['error']}")
            if res.get("leftovers"):
                step.fail(f"{res['key']} round {r}: processes left (stopped now): "
                          f"{res['leftovers']}")
    step.data["runs"] = runs
    step.data["table"] = summarise(configs, runs)
    for row in step.data["table"]:
        step.say(f"{row['key']:>10}: median {_f(row['median'])} samples/s "
                 f"(x{_f(row['vs_baseline'], 2)} vs 1 rank) rounds {row['rates']}")
    return step


def _f(v, digits=1) -> str:
    return "n/a" if v is None else f"{v:.{digits}f}"


def _u(v, unit: str, digits: int = 1) -> str:
    return "n/a" if v is None else f"{v:.{digits}f} {unit}"


def _tune_record(out: Path) -> dict:
    try:
        return json.loads((out / "steps" / "tune.json").read_text())
    except (OSError, ValueError):
        return {}


def describe(res: dict) -> str:
    g = res.get("gpu", {})
    mps = res.get("mps") or {}
    mem = g.get("mem_used_bytes_max")
    text = (f"round {res['round']} {res['key']}: {_u(res['samples_per_s'], 'samples/s')}, "
            f"exit {res['exits']}, GPU util {_u(g.get('util_pct_mean'), '%')}, mem max "
            f"{_u(None if mem is None else mem / 2**30, 'GiB', 2)}, power "
            f"{_u(g.get('power_w_mean'), 'W')}, energy {_u(g.get('energy_j'), 'J')}")
    if mps.get("verified") is not None:
        text += (f"; MPS {'served all ' if mps['verified'] else 'did NOT serve all '}"
                 f"{res['ranks']} rank(s) (daemon clients {mps.get('clients')}, NVML MPS pids "
                 f"{mps.get('nvml_mps_pids')})")
    elif mps.get("without_mps") is not None:
        text += ("; no rank was an MPS client, as meant" if mps["without_mps"] else
                 f"; SOME RANKS WERE MPS CLIENTS (NVML MPS pids {mps.get('nvml_mps_pids')})")
    if mps.get("stop"):
        text += f"; daemon stopped by {mps['stop']['how']}, gone: {mps['stop']['gone']}"
    return text + (f"; ERROR {res['error']}" if res.get("error") else "")


def _rank_env(ctx: Context, c: Config, rank: int, port: int, extra) -> dict:
    """torchrun's environment for one rank on the measured GPU; like torchrun, several ranks get
    ``OMP_NUM_THREADS=1`` unless it is set, one rank keeps torch's default (the plain script)."""
    env = ctx.env(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(c.ranks),
                  LOCAL_WORLD_SIZE=str(c.ranks), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                  CUDA_VISIBLE_DEVICES=str(ctx.settings.gpu), **extra)
    if c.threads is not None:
        env.update(OMP_NUM_THREADS=str(c.threads), MKL_NUM_THREADS=str(c.threads))
    elif c.ranks > 1:
        env.setdefault("OMP_NUM_THREADS", "1")
    return env


def autotune_threads(knobs: dict, cores: int) -> int | None:
    """The threads autotune's placement gives each rank of ``knobs`` on one GPU of this host
    (None where autotune cannot be imported here)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    try:
        from autotune.hardware.host import Gpu
        from autotune.launching import placement
        from autotune.tuning import space
    except ImportError:
        return None

    ranks_knobs, instances = space.rank_knobs(knobs, cores=cores, device="gpu")
    laid = placement.plan(knobs=ranks_knobs, instances=instances,
                          cores=tuple(range(cores)), gpus=(Gpu(0, "GPU-0"),), device="gpu")
    return laid.slots[0].threads


def one_run(ctx: Context, c: Config, nvml: Nvml, binary: str | None, recipe, rnd: int) -> dict:
    res = {"key": c.key, "round": rnd, "ranks": c.ranks, "samples_per_s": None, "exits": [],
           "error": ""}
    daemon = None
    try:
        if c.via == "autotune-run":
            _run_recipe(ctx, c, nvml, binary, recipe, res)
            return res
        if c.mps:
            daemon = mpsd.Daemon(binary, env=ctx.env(), work=ctx.work,
                                 start_timeout_s=ctx.settings.mps_start_timeout_s).start()
        _run_plain(ctx, c, nvml, daemon, res)
    except mpsd.MpsStartError as exc:
        res["error"] = f"MPS daemon: {exc}"
    finally:
        if daemon is not None:
            res.setdefault("mps", {})["stop"] = stop = daemon.stop()
            if not stop["gone"]:
                res["error"] = res["error"] or f"MPS daemon {stop['pid']} outlived quit/TERM/KILL"
        res["leftovers"] = procs.sweep(ctx.marker)
    return res


def _run_plain(ctx: Context, c: Config, nvml: Nvml, daemon, res: dict) -> None:
    s = ctx.settings
    port = free_port()
    if daemon is not None:
        extra = daemon.client_env(c.share)
    else:  # a pipe directory with no daemon in it: the driver runs these ranks without MPS
        empty = ctx.work / "no-mps"
        empty.mkdir(parents=True, exist_ok=True)
        extra = {mpsd.PIPE_ENV: str(empty)}
    argv = [ctx.python, str(s.script), *s.script_args, "--seconds", f"{s.seconds:g}"]
    if c.ranks > 1:
        argv += ["--backend", "gloo"]  # NCCL refuses two ranks on one GPU
    cwd = ctx.work / "cwd"
    cwd.mkdir(parents=True, exist_ok=True)
    logs = [ctx.log(f"{c.key}-r{res['round']}-rank{r}") for r in range(c.ranks)]
    popens = []
    seen: set[int] = set()
    nvml_mps: set[int] = set()
    with Sampler(nvml, s.gpu) as sampler:
        try:
            for r in range(c.ranks):
                popens.append(procs.start(argv, env=_rank_env(ctx, c, r, port, extra),
                                          cwd=str(cwd), log_path=logs[r]))
            pids = {p.pid for p in popens}
            deadline = time.monotonic() + s.seconds + 240
            while any(p.poll() is None for p in popens) and time.monotonic() < deadline:
                if daemon is not None and not pids <= seen:
                    try:
                        seen |= {pid for cs in daemon.clients().values() for pid in cs}
                    except mpsd.MpsStartError as exc:
                        res["error"] = f"MPS daemon stopped answering: {exc}"
                if nvml.ok:
                    nvml_mps |= set(nvml.mps_pids(s.gpu) or ())
                time.sleep(1.0)
            if any(p.poll() is None for p in popens):
                res["error"] = f"ranks still running {s.seconds + 240:g} s after start"
        finally:
            res["exits"] = [p.returncode if p.poll() is not None else procs.stop(p)
                            for p in popens]
    res["gpu"] = sampler.summary()
    res["samples_per_s"] = parse_rate(logs[0].read_text(errors="replace"))
    res["logs"] = [str(p) for p in logs]
    if c.mps or c.ranks > 1:
        pids = {p.pid for p in popens}
        verified = pids <= (seen | nvml_mps)
        res["mps"] = {**res.get("mps", {}), "expected": sorted(pids), "clients": sorted(seen),
                      "nvml_mps_pids": sorted(nvml_mps), "verified": verified if c.mps else None,
                      "without_mps": not (pids & (seen | nvml_mps)) if not c.mps else None}
        if c.mps and not verified and not res["error"]:
            res["error"] = (f"MPS did not serve every rank: ranks {sorted(pids)}, daemon clients "
                            f"{sorted(seen)}, NVML MPS pids {sorted(nvml_mps)}")
        if not c.mps and not res["mps"]["without_mps"] and not res["error"]:
            res["error"] = f"ranks meant to run without MPS were MPS clients: {res['mps']}"
    _check_exits(res, logs)


def _check_exits(res: dict, logs) -> None:
    if res["error"]:
        return
    if any(code != 0 for code in res["exits"]):
        bad = next(i for i, code in enumerate(res["exits"]) if code != 0)
        tail = " | ".join(Path(logs[bad]).read_text(errors="replace").strip().splitlines()[-3:])
        res["error"] = f"rank {bad} exited {res['exits'][bad]}: {tail}"
    elif res["samples_per_s"] is None:
        res["error"] = "the script printed no 'steady samples/s' (ran too short to leave warm-up?)"


def _run_recipe(ctx: Context, c: Config, nvml: Nvml, binary, recipe, res: dict) -> None:
    """``autotune run --recipe`` of the tuned recipe; its MPS daemon checked by its pipe."""
    s = ctx.settings
    env, mps_dir = ctx.autotune_env()
    if c.clock:
        env["AUTOTUNE_STEP_CLOCK"] = c.clock
    argv = [ctx.python, "-m", "autotune", "run", "--plain", "--recipe", recipe["path"],
            str(s.script), *s.script_args, "--seconds", f"{s.seconds:g}"]
    log = ctx.log(f"{c.key}-r{res['round']}")
    (ctx.work / "cwd").mkdir(parents=True, exist_ok=True)
    seen: set[int] = set()
    nvml_mps: set[int] = set()
    ours: set[int] = set()  # clients that carry the kit's marker, checked while they live
    with Sampler(nvml, s.gpu) as sampler:
        popen = procs.start(argv, env=env, cwd=str(ctx.work / "cwd"), log_path=log)
        try:
            deadline = time.monotonic() + s.seconds + 300
            while popen.poll() is None and time.monotonic() < deadline:
                if c.mps and binary and len(ours) < c.ranks:
                    for pipe in mps_dir.glob("*/pipe"):
                        try:
                            table = mpsd.clients_at(binary, ctx.env(), pipe,
                                                    log_dir=ctx.work / "mpsq")
                            seen |= {p for cs in table.values() for p in cs}
                        except mpsd.MpsStartError:
                            pass  # not up yet, or gone already
                    if nvml.ok:
                        nvml_mps |= set(nvml.mps_pids(s.gpu) or ())
                    ours |= {p for p in seen | nvml_mps if _carries(p, ctx.marker)}
                time.sleep(1.0)
            if popen.poll() is None:
                res["error"] = f"autotune run still running {s.seconds + 300:g} s after start"
        finally:
            res["exits"] = [popen.returncode if popen.poll() is not None else procs.stop(popen)]
    res["gpu"] = sampler.summary()
    res["samples_per_s"] = parse_rate(log.read_text(errors="replace"))
    res["logs"] = [str(log)]
    if c.mps:
        res["mps"] = {"expected": c.ranks, "clients": sorted(seen),
                      "nvml_mps_pids": sorted(nvml_mps), "ours": sorted(ours),
                      "verified": len(ours) >= c.ranks}
        if not res["mps"]["verified"] and not res["error"]:
            res["error"] = (f"the kit saw {len(ours)} of autotune's {c.ranks} ranks as MPS "
                            f"clients")
    step_like = Step("recipe-run")
    res["product_mps"] = product_mps_after(mps_dir, step_like)
    if step_like.status == "failed" and not res["error"]:
        res["error"] = step_like.reason
    _check_exits(res, [log])


def _carries(pid: int, marker: str) -> bool:
    """Whether ``pid`` was started by this kit (directly or not). A pid of another namespace
    (NVML in a container) reads as not ours."""
    try:
        return f"{procs.MARKER_ENV}={marker}".encode() in \
            Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
