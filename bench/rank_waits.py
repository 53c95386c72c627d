"""Where the ranks of a config wait: each of bench_parity's three ways left running alone.

`bench/bench_parity.py` measures the script's own rate started plain, through `autotune run`
and as a probe, taking turns. This bench asks the kernel why a way is slower. Each way is
started alone, left to run (no holds), and after its warm-up the script's own rate lines and
the scheduler's counters of every thread are read over a window:

- per thread, ``/proc/<pid>/task/<tid>/schedstat``: time on a core and time spent runnable but
  waiting for one (the run queue), and ``se.nr_migrations`` from ``sched``;
- per thread, the voluntary and involuntary context switches from ``status``;
- the same for the controller's threads (autotune's, or torchrun's agent started plain).

``--hold-controllers`` adds ``plain-held`` and ``run-held``: the same starts, with every process
but the ranks (torchrun's agent, autotune's controller) stopped (SIGSTOP) over the window and
continued after it, so that nothing of theirs wakes beside the ranks while they are read.

The ways run one after another, their order reversed every other round; on a shared machine
their rates move more between runs than the costs sought, so the counters, not the rates,
are what tell the ways apart. It prints one JSON line a way and round, then the means per way.

    .venv/bin/python bench/rank_waits.py --rounds 4 --out bench/results/rank-waits-DATE.json
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psutil  # noqa: E402

from bench import bench_parity as bp  # noqa: E402
from bench import turns  # noqa: E402

WAYS = ("plain", "run", "probe")
HELD = ("plain-held", "run-held")  # --hold-controllers: the controller stopped over the window


def thread_counters(pid: int) -> dict[int, dict[str, float]]:
    """Each live thread of ``pid``: seconds on a core, seconds waiting for one, migrations,
    voluntary and involuntary switches (a thread gone meanwhile is left out)."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        base = f"/proc/{pid}/task/{tid}"
        try:
            on, waited, _ = open(f"{base}/schedstat").read().split()
            migrations = next(int(line.split(":")[1]) for line in open(f"{base}/sched")
                              if line.startswith("se.nr_migrations"))
            status = dict(line.split(":", 1) for line in open(f"{base}/status")
                          if ":" in line)
        except (OSError, StopIteration, ValueError):
            continue
        out[int(tid)] = {"on_s": int(on) / 1e9, "wait_s": int(waited) / 1e9,
                         "migrations": migrations,
                         "voluntary": int(status["voluntary_ctxt_switches"]),
                         "involuntary": int(status["nonvoluntary_ctxt_switches"])}
    return out


def is_rank(cmdline: list[str], script: str) -> bool:
    """Pure: a process running the script itself (not torchrun's agent, autotune's controller
    or the bench's probe driver)."""
    text = " ".join(cmdline)
    return (script in text and "torch.distributed.run" not in text and "bench_parity" not in text
            and not any(a == "autotune" for a in cmdline[:3]))


def per_second(before: dict, after: dict, seconds: float) -> dict[str, float]:
    """Pure: the counters' growth a second, summed over the threads alive at both reads."""
    total = dict.fromkeys(("on_s", "wait_s", "migrations", "voluntary", "involuntary"), 0.0)
    for key, b in before.items():
        a = after.get(key)
        if a is None:
            continue
        for name in total:
            total[name] += a[name] - b[name]
    return {name: value / seconds for name, value in total.items()}


def one(way: str, c: bp.Config, ctx: bp.Ctx, rnd: int, warm_s: float, window_s: float) -> dict:
    held = way.endswith("-held")
    start = bp.turn_start(way.removesuffix("-held"), c, ctx, rnd)
    out = ctx.work / f"{way}-{rnd}.out"
    with open(out, "wb") as f:
        p = subprocess.Popen(list(start.argv), env=dict(start.env), stdout=f,
                             stderr=subprocess.STDOUT, start_new_session=True, cwd=str(ctx.work))
    others: list[psutil.Process] = []  # held over the window (``-held``): continued after it
    try:
        time.sleep(warm_s)
        root = psutil.Process(p.pid)
        procs = [root, *root.children(recursive=True)]
        ranks = {q.pid for q in procs if is_rank(q.cmdline(), c.script[0])}
        logs = sorted(glob.glob(str(start.log))) if start.log else [str(out)]
        if not logs:
            raise RuntimeError(f"{way}: no log matches {start.log} after {warm_s:g} s")
        log = Path(logs[0])
        others = [q for q in procs if q.pid not in ranks]
        if held:
            for q in others:
                q.send_signal(signal.SIGSTOP)
        seen = len(c.rate.findall(log.read_text(errors="replace")))
        before = {(q.pid, t): v for q in procs for t, v in thread_counters(q.pid).items()}
        time.sleep(window_s)
        after = {(q.pid, t): v for q in procs for t, v in thread_counters(q.pid).items()}
        rates = [float(r) for r in c.rate.findall(log.read_text(errors="replace"))[seen:]]
    finally:
        for q in others if held else ():  # a stopped controller could not stop its ranks
            try:
                q.send_signal(signal.SIGCONT)
            except psutil.Error:
                pass
        bp._stop_group(p)
    mine = {k: v for k, v in before.items() if k[0] in ranks}
    theirs = {k: v for k, v in before.items() if k[0] not in ranks}
    return {"way": way, "round": rnd, "ranks": len(ranks),
            "rate": sum(rates) / len(rates) if rates else None, "lines": len(rates),
            "rank_threads": per_second(mine, after, window_s),
            "controller_threads": per_second(theirs, after, window_s)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="short-2r", help="a bench_parity CPU config (short-2r)")
    p.add_argument("--rounds", type=int, default=4, help="rounds of the three ways (4)")
    p.add_argument("--warm", type=float, default=8.0, help="seconds before the window (8)")
    p.add_argument("--window", type=float, default=12.0, help="seconds read (12)")
    p.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS a user writes (1)")
    p.add_argument("--hold-controllers", action="store_true",
                   help="add plain-held and run-held: the controller stopped over the window")
    p.add_argument("--out", type=Path, help="the report (JSON)")
    args = p.parse_args(argv)
    named = {c.name: c for c in bp.configs_for("cpu", args.threads)}
    if args.config not in named:
        p.error(f"--config: {args.config} is not one of {', '.join(named)}")
    c = named[args.config]
    work = Path(tempfile.mkdtemp(prefix="rank_waits-"))
    ctx = bp.Ctx(work=work, seconds=args.warm + args.window + 60,
                 env={**bp.user_env(os.environ), "PYTHONUNBUFFERED": "1",
                      "AUTOTUNE_RUNS_DIR": str(work / "runs")})
    ctx.recipes[c.name] = bp.write_recipe(c, work)
    ways = (*WAYS, *(HELD if args.hold_controllers else ()))
    rows = []
    for rnd in range(args.rounds):
        for way in (ways if rnd % 2 == 0 else ways[::-1]):
            row = one(way, c, ctx, rnd, args.warm, args.window)
            rows.append(row)
            print(json.dumps(row), flush=True)
            time.sleep(2.0)
    print(f"{'way':6s} {'rate':>9s} {'rank on':>8s} {'rank wait':>9s} {'migr/s':>7s} "
          f"{'ctl on':>7s} {'ctl wakes/s':>11s}  (means over {args.rounds} rounds; cores, /s)")
    for way in ways:
        mine = [r for r in rows if r["way"] == way]
        rates = [r["rate"] for r in mine if r["rate"]]

        def mean(group: str, name: str) -> float:
            return sum(r[group][name] for r in mine) / len(mine)

        print(f"{way:6s} {sum(rates) / max(1, len(rates)):9.0f} "
              f"{mean('rank_threads', 'on_s'):8.3f} {mean('rank_threads', 'wait_s'):9.3f} "
              f"{mean('rank_threads', 'migrations'):7.0f} {mean('controller_threads', 'on_s'):7.4f} "
              f"{mean('controller_threads', 'voluntary'):11.1f}")
    if args.out:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True).stdout.strip()
        args.out.write_text(json.dumps({"config": c.name, "commit": commit, "cores": os.cpu_count(),
                                        "ways": list(ways), "warm_s": args.warm, "window_s": args.window,
                                        "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    turns.end_on_sigterm()
    sys.exit(main())
