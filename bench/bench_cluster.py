"""autotune on a real two-node Slurm cluster (the cluster bed), at two link speeds: does the
tuned recipe find what a bucket grid finds, and does it beat the script's defaults when the
script's own clock measures it, under ``srun``?

For each link rate (``--rates``; each a bed of two network-namespace hosts, one core each,
their links shaped with ``tc``):

1. ``salloc -N 2 -n 2 autotune tune --budget B --json`` on ``bench/scripts/ddp_wide.py`` (a DDP
   MLP whose gradients are megabytes), as a user runs it with the placeholders ``-b
   {batch_size} -j {workers}``: ranks per node, threads, workers, batch and bucket searched
   across the nodes, the allreduce timed over the link. Its wall time is the tuning cost.
2. Interleaved rounds (``--rounds``): the script alone under a plain ``srun -N 2 -n 2`` with
   each bucket of the grid (``--bucket-cap-mb``: the script's own DDP setting; its default,
   25 MB, is in the grid) and the rest at its defaults, then ``autotune run --recipe`` inside
   ``salloc -N 2 -n 2``; each for ``--run-seconds``, its figure the mean of the script's own
   ``samples/s`` lines after the first two (start-up, warm-up).
3. Per rate: tuned / grid-best and tuned / defaults (25 MB) as per-round ratios with 95%
   intervals; tuning cost / grid cost (the grid's own run time over all rounds).

Exits 1 when a rate measured nothing (no tune, or fewer than two rounds with both figures) or
tuned / grid-best falls below `TARGET`; 2 for ``--rounds`` below 2. Needs root (the bed).

    .venv/bin/python bench/bench_cluster.py --rates 100mbit 1gbit --budget 4m --rounds 3
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench.common import interval, say  # noqa: E402
from clusterbed import BedSpec, ClusterBed  # noqa: E402

TARGET = 0.95  # tuned / grid-best; below it the bench exits 1
SCRIPT = ROOT / "bench" / "scripts" / "ddp_wide.py"
RATE = re.compile(r"^step \d+ samples/s ([0-9.]+)", re.M)  # the script's own lines
SKIP_LINES = 2  # its first lines hold start-up and warm-up


def own_rate(text: str) -> float | None:
    rates = [float(m.group(1)) for m in RATE.finditer(text)][SKIP_LINES:]
    return sum(rates) / len(rates) if len(rates) >= 2 else None


def stop_tree(p: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGTERM to ``p`` and every descendant (salloc runs its command in a group of its own),
    then SIGKILL to what is left after ``grace_s``."""
    try:
        procs = [psutil.Process(p.pid), *psutil.Process(p.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for q in procs:
        try:
            q.send_signal(signal.SIGTERM)
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for q in alive:
        try:
            q.kill()
        except psutil.NoSuchProcess:
            pass


def timed(argv: list[str], env: dict, seconds: float, cwd: Path) -> tuple[str, float]:
    """Run ``argv`` for ``seconds`` (then stop its tree); its output and wall time."""
    t0 = time.monotonic()
    p = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=seconds)
    except subprocess.TimeoutExpired:
        stop_tree(p)
        out, _ = p.communicate()
    return out, time.monotonic() - t0


def one_rate(rate: str, args, work: Path) -> dict:
    bed = ClusterBed(BedSpec(rate=rate, workdir=work / f"bed-{rate}"))
    say(f"# {rate}: bringing the bed up")
    f = bed.up()
    try:
        return measure(bed, f, rate, args, work)
    finally:
        subprocess.run(["scancel", "--user", "root"], env=bed.env(), capture_output=True)
        bed.down()


def measure(bed: ClusterBed, f, rate: str, args, work: Path) -> dict:
    # autotune runs in the root namespace (salloc's command runs where salloc does), whose name
    # the nodes do not resolve: its address on the bed's bridge is where they reach it
    env = bed.env(dict(os.environ, PYTHONPATH=str(ROOT), GLOO_SOCKET_IFNAME=f.ifname,
                       AUTOTUNE_RUNS_DIR=str(work / f"runs-{rate}"),
                       AUTOTUNE_COLLECTOR_HOST=f.controller_address))
    script = [str(SCRIPT), "--log-every", str(args.log_every)]
    alloc = ["salloc", "-N", "2", "-n", "2", "-t", "60"]
    tune = [*alloc, sys.executable, "-m", "autotune", "tune", "--json", "--plain", "--budget",
            args.budget, "--recipe-dir", str(work / f"recipes-{rate}"), "--no-warm-start",
            *(["--foreign-limit", str(args.foreign_limit)] if args.foreign_limit else []),
            "--", *script, "-b", "{batch_size}", "-j", "{workers}"]
    t0 = time.monotonic()
    p = subprocess.run(tune, cwd=work, env=env, capture_output=True, text=True)
    tune_s = time.monotonic() - t0
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        say(f"{rate}: tune failed ({p.returncode}):\n{p.stderr[-3000:]}")
        return {"rate": rate, "error": p.stderr[-3000:]}
    s = json.loads(lines[-1])
    low, high = s.get("speedup_interval", [math.nan, math.nan])
    say(f"# {rate}: tune {tune_s:.0f} s, {s['trials']} probes, stopped: {s['stop_reason']}")
    say(f"# {rate}: best {s['best']['knobs']}; claim {s['speedup']:.3f}x ({low:.3f}x-"
        f"{high:.3f}x){' (kept the defaults)' if s['kept_baseline'] else ''}")
    plain = ["srun", "-N", "2", "-n", "2", "--ntasks-per-node=1", "--export=ALL",
             "--kill-on-bad-exit=1", sys.executable, *script, "--slurm"]
    run = [*alloc, sys.executable, "-m", "autotune", "run", "--plain", "--recipe", s["recipe"],
           "--", *script, "-b", "{batch_size}", "-j", "{workers}"]
    configs = {f"bucket {b:g} MB": [*plain, "--bucket-cap-mb", str(b)] for b in args.grid}
    configs["recipe"] = run
    rates: dict[str, list[float | None]] = {name: [] for name in configs}
    grid_s = 0.0
    for rnd in range(1, args.rounds + 1):
        order = list(configs)
        random.Random(rnd).shuffle(order)  # interleaved, in a new order each round
        for name in order:
            port = str(random.randint(20000, 40000))
            out, wall = timed(configs[name], dict(env, MASTER_ADDR=f.addresses[0],
                                                  MASTER_PORT=port), args.run_seconds, work)
            if name != "recipe":
                grid_s += wall
            r = own_rate(out)
            rates[name].append(r)
            say(f"{rate} round {rnd} {name:16s} "
                + (f"{r:9.2f} samples/s (the script's own)" if r else
                   f"no rate printed: {out.strip()[-300:]!r}"))
    means = {n: sum(x for x in v if x) / max(1, sum(1 for x in v if x))
             for n, v in rates.items() if n != "recipe"}
    best = max(means, key=means.get)
    default = f"bucket {25:g} MB"

    def ratio(a: str, b: str) -> tuple[float, float]:
        return interval([x / y for x, y in zip(rates[a], rates[b]) if x and y])

    tg, tg_half = ratio("recipe", best)
    td, td_half = ratio("recipe", default) if default in rates else (math.nan, math.nan)
    say(f"{rate}: grid-best {best} ({means[best]:.2f} samples/s); tuned / grid-best "
        f"{tg:.3f} ± {tg_half:.3f}; tuned / defaults {td:.3f} ± {td_half:.3f}; tuning cost / "
        f"grid cost {tune_s / grid_s:.2f} ({tune_s:.0f} s / {grid_s:.0f} s)")
    return {"rate": rate, "tune_s": tune_s, "grid_s": grid_s, "summary": s, "rates": rates,
            "grid_best": best, "tuned_over_grid_best": [tg, tg_half],
            "tuned_over_defaults": [td, td_half], "cost_ratio": tune_s / grid_s}


def verdict(results: list[dict]) -> int:
    """0 when every rate was measured and tuned / grid-best reached `TARGET`; else 1."""
    code = 0
    for r in results:
        if "error" in r:
            say(f"FAILED: {r['rate']}: the tune failed")
            code = 1
            continue
        m, half = r["tuned_over_grid_best"]
        if not math.isfinite(m) or not math.isfinite(half):
            say(f"FAILED: {r['rate']}: fewer than two rounds gave both figures; nothing measured")
            code = 1
        elif m < TARGET:
            say(f"FAILED: {r['rate']}: tuned / grid-best {m:.3f} is below the target "
                f"{TARGET:.2f}")
            code = 1
    return code


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rates", nargs="+", default=["100mbit", "1gbit"])
    p.add_argument("--budget", default="4m", help="tune's --budget at each rate")
    p.add_argument("--grid", nargs="+", type=float, default=[1, 4, 25, 64],
                   help="bucket sizes (MB) of the grid; 25 is DDP's default")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds outside autotune")
    p.add_argument("--run-seconds", type=float, default=40.0, help="one run of the grid")
    p.add_argument("--log-every", type=int, default=5, help="the script's steps per line")
    p.add_argument("--foreign-limit", type=float, default=None,
                   help="tune's --foreign-limit (on a shared machine the bed's nodes share its "
                        "cores with other work)")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = p.parse_args()
    if args.rounds < 2:
        print("--rounds must be at least 2: one round shows no spread", file=sys.stderr)
        return 2
    if 25 not in args.grid:
        print("--grid must hold 25 (DDP's default bucket): the defaults are measured in it",
              file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("the cluster bed needs root (network namespaces, tc, daemons)", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    os.chmod(work, 0o755)  # the munge user reaches the bed's files under it
    say(f"# bench_cluster {datetime.datetime.now():%Y-%m-%d %H:%M}, {platform.node()}, "
        f"{os.cpu_count()} cores; work in {work}")
    results = [one_rate(rate, args, work) for rate in args.rates]
    if args.out:
        args.out.write_text(json.dumps(results, indent=2, default=str))
    return verdict(results)


if __name__ == "__main__":
    sys.exit(main())
