"""``bench/bench_search.py --example``: a bundled example's grid probed by autotune's own
probes, against ``autotune tune`` with a share of the grid's time (the first list of
bench_search's docstring)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from autotune.tuning import Prober, TuneState, decision, space  # noqa: E402
from autotune.measuring.trial import TrialSpec, run_trial  # noqa: E402
from bench.common import ratio_interval, say  # noqa: E402
from bench.search_common import TARGET, baseline_stage, fmt, header, verdict  # noqa: E402

EXAMPLES = ROOT / "examples"


def probe(args, work: Path, cfg: dict | None, sp: space.Space | None, name: str,
          seconds: float | None, prober: Prober | None = None,
          state: TuneState | None = None):
    """One probe, re-run (up to --foreign-retries times) while foreign load spoils it, as the
    tuner does; the last attempt stands either way, its foreign load reported. Its limits are
    ``seconds``, or (None) the tuner's own fitted ones from ``prober`` and the baseline
    stage's ``state``."""
    knobs, instances = sp.trial_knobs(cfg) if (sp and cfg) else ({}, 1)
    if seconds is None:
        spec = prober.spec(state, knobs, instances, name)
    else:
        spec = TrialSpec.of(command=tuple(args.command), knobs=knobs, instances=instances,
                            cwd=str(work), log_dir=work / "logs", name=name, max_s=seconds,
                            min_measure_s=min(5.0, 0.4 * seconds),
                            foreign_limit_cores=args.foreign_limit)
    for attempt in range(args.foreign_retries + 1):
        t0 = time.monotonic()
        r = run_trial(spec)
        args.last_probe_s = time.monotonic() - t0  # the attempt that stands
        if not r.foreign_flagged:
            break
        args.reruns += 1
        if attempt < args.foreign_retries:
            time.sleep(5.0)
    return r


def example_mode(args) -> int:
    """The grid probed by autotune (module docstring, first list)."""
    args.reruns = 0
    args.last_probe_s = 0.0
    work = args.work
    data = work / "data"
    example = EXAMPLES / args.example / "train.py"
    dataset = (["--num-images", str(args.num_images), "--data-dir", str(data)]
               if args.example == "image_classifier" else [])
    args.command = [str(example), *dataset, "--epochs", "1000"]
    head = header(args.command)
    say(head)
    say(f"# example: {example.relative_to(ROOT)} {' '.join(dataset[:2])}; probes "
        + (f"of {args.seconds:.0f} s" if args.seconds else "fitted to the script")
        + f"; work dir {work}")

    # The dataset is generated once, before anything is timed: a user's data already exists,
    # and its generation would otherwise count as the baseline's start-up (fitting every probe).
    if dataset:
        t_data = time.monotonic()
        subprocess.run([sys.executable, str(example), *dataset, "--max-steps", "1"], cwd=work,
                       check=True, capture_output=True)
        say(f"# dataset generated in {time.monotonic() - t_data:.0f} s")

    # 1. tune's own baseline stage -> the space it searches
    prober, state = baseline_stage(args)
    sp = state.space
    configs = sp.configs()

    # 2. grid
    t0 = time.monotonic()
    grid = []
    grid_cost_s = 0.0  # one attempt per config: what the grid costs on a quiet host
    for i, cfg in enumerate(configs):
        r = probe(args, work, cfg, sp, f"grid-{i}", args.seconds, prober, state)
        grid_cost_s += args.last_probe_s
        if args.seconds is None and i == 0:
            say(f"# grid probe limits, e.g. {fmt(cfg)}: {prober.spec(state, *sp.trial_knobs(cfg), 'x').max_s:.1f} s")
        grid.append((cfg, r.samples_per_s, r))  # 0 without an estimate
        say(f"grid {i + 1:3d}/{len(configs)} {fmt(cfg):55s} "
            f"{r.samples_per_s:8.1f} ± {r.ci_half:6.1f} {r.outcome.value}"
            f" (foreign load {r.foreign_cores:.2f} cores)")
    say(f"# grid probes re-run for foreign load: {args.reruns}")
    grid_wall_s = time.monotonic() - t0
    # The grid's cost is one attempt per config (the one that stands): re-runs for foreign
    # load would otherwise lengthen the grid, and with it the tune's budget and the ratio.
    grid_s = grid_cost_s
    grid_best = max(grid, key=lambda g: g[1])[0]
    say(f"# grid: {grid_s:.0f} s for one probe per config ({grid_wall_s:.0f} s wall with the "
        f"re-runs), best {fmt(grid_best)}")

    # 3. tune with a share of the grid's time
    budget_s = args.budget_share * grid_s
    cmd = [sys.executable, "-m", "autotune", "tune", "--json", "--plain",
           "--budget", f"{budget_s:.0f}s", "--foreign-limit", str(args.foreign_limit), "--no-warm-start", "--recipe-dir",
           str(work / "recipes")]
    if args.seconds:
        cmd += ["--seconds", str(args.seconds), "--confirm-seconds", str(args.seconds)]
    if args.confirm_rounds is not None:
        cmd += ["--confirm-rounds", str(args.confirm_rounds)]
    if args.space:
        cmd += ["--space", *args.space]
    cmd += ["--", *args.command]
    env = dict(os.environ, AUTOTUNE_RUNS_DIR=str(work / "runs"))
    t0 = time.monotonic()
    tuned_run = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True)
    tune_s = time.monotonic() - t0
    if tuned_run.returncode != 0:
        say(f"tune failed ({tuned_run.returncode}):\n{tuned_run.stderr[-3000:]}")
        return 1
    summary = json.loads(tuned_run.stdout.strip().splitlines()[-1])
    tuned = summary["best"]["knobs"]
    say(f"# tune: {tune_s:.0f} s wall (budget {budget_s:.0f} s), {summary['trials']} probes, "
        f"stopped: {summary['stop_reason']}; {summary['reason']}")
    say(f"# tuned {fmt(tuned)}")

    # 4. side by side, interleaved
    entries = {"default": dict(sp.baseline), "grid-best": grid_best, "tuned": tuned}
    rates: dict[str, list[float]] = {n: [] for n in entries}
    for rnd, name in decision.interleave(list(entries), args.rounds):
        r = probe(args, work, entries[name], sp, f"final{rnd}-{name}", args.final_seconds)
        rates[name].append(r.samples_per_s)
        say(f"final round {rnd} {name:9s} {r.samples_per_s:8.1f} ± {r.ci_half:6.1f} "
            f"{r.outcome.value} (foreign load {r.foreign_cores:.2f} cores)")
    means = {n: sum(v) / len(v) for n, v in rates.items()}
    tg, tg_ci = ratio_interval(rates["tuned"], rates["grid-best"])
    td, td_ci = ratio_interval(rates["tuned"], rates["default"])
    gd, gd_ci = ratio_interval(rates["grid-best"], rates["default"])
    say("")
    say(f"{'config':10s} {'samples/s':>10s}  knobs")
    for n in entries:
        say(f"{n:10s} {means[n]:10.1f}  {fmt(entries[n])}")
    say(f"tuned / grid-best   {tg:.3f} ± {tg_ci:.3f}  (target >= {TARGET:.2f})")
    say(f"tuned / default     {td:.3f} ± {td_ci:.3f}  (target: not below 1 beyond the noise)")
    say(f"grid-best / default {gd:.3f} ± {gd_ci:.3f}")
    say(f"probes re-run for foreign load (grid + side by side): {args.reruns}")
    say(f"wall time: grid {grid_s:.0f} s ({len(configs)} probes), tune {tune_s:.0f} s "
        f"({summary['trials']} probes + confirmation) = {tune_s / grid_s:.0%} of the grid")
    if args.out:
        args.out.write_text(json.dumps({
            "header": head, "space": sp.to_dict(), "grid": [
                {"knobs": c, "samples_per_s": v, "outcome": r.outcome.value,
                 "foreign_cores": r.foreign_cores} for c, v, r in grid],
            "grid_s": grid_s, "grid_wall_s": grid_wall_s, "tune_s": tune_s, "budget_s": budget_s, "tune": summary,
            "final": {"knobs": entries, "rates": rates},
            "ratios": {"tuned/grid-best": [tg, tg_ci], "tuned/default": [td, td_ci],
                       "grid-best/default": [gd, gd_ci]}}, indent=2, default=str))
    return verdict(tg, tg_ci)
