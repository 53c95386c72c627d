"""Search benchmark: exhaustive grid vs ``autotune tune --budget``, on a bundled example or on a
third-party script's shape.

``--example image_classifier`` (the default: PNG decode and augmentation in the Dataset, a small
CNN) or ``compute_bound`` (an MLP on in-memory tensors: compute binds); the grid is measured with
autotune's own probes:

1. The baseline stage of ``autotune tune`` itself (`autotune.tuning.baseline.measure`: the
   example with its own settings, the two-rank probe that finds it data-parallel, the allreduce
   timing that bounds ``bucket_mb``) gives the space ``tune`` searches by default, or the one
   given with ``--space``.
2. Grid: every config of that space probed once, with the same probes the tuner uses
   (`run_trial` with the limits `tune` fits to the script from its baseline, or ``--seconds``);
   its best single measurement is "grid-best". Its wall time is what an exhaustive search costs.
3. Tune: ``autotune tune --budget`` (a subprocess, as a user runs it) with ``--budget-share`` of
   the grid's wall time, confirmation included.
4. Side by side: default, grid-best and tuned re-measured in one run, interleaved
   (A B C A B C ...), with longer probes; ratios with 95% intervals from the rounds.

``--shape word_lm|mingpt|nanogpt`` (`bench.shapes`: word_language_model without a DataLoader,
minGPT's chargpt with its 1 s steps, nanoGPT with ``--key=value`` flags and evaluation pauses):
the grid is measured by the script's own clock, not by autotune's meter.

1. The same baseline stage gives the space; every config must be one a user can set without
   autotune (`bench.shapes.plain_run`: flags through the placeholders, the thread share as the
   thread count autotune gives it, in ``OMP_NUM_THREADS``/``MKL_NUM_THREADS``). A space with a
   knob a plain run cannot set (ranks, a DataLoader setting without a flag) is refused (exit 2):
   restrict it with ``--space``.
2. Grid: every config a plain process (``python script ARGS``) for ``--grid-seconds``, then
   SIGINT; its figure the mean of the script's own throughput lines after the first, over
   ``--grid-rounds`` interleaved rounds; grid-best the best mean. The grid's cost is the wall
   time of one round (a user trying each config once).
3. Tune: ``autotune tune --budget B`` as a user runs it, for each of ``--budgets`` (default
   ``6m 5m``: 10% of a one-hour run, and a fixed five minutes), each in a fresh directory.
4. Side by side, plain processes by the script's own clock: default (the user's own run),
   grid-best and each budget's tuned config, interleaved over ``--rounds``; a config two entries
   share is run once per round and read for both.

Per budget: tuned/grid-best and tuned/default with 95% intervals, the tune's wall time over the
grid's cost, its stop reason, whether it kept the defaults, and the noise figures its summary
holds. Exits 1 when a budget's tuned/grid-best is below 0.95 or nothing was measured.

Prints the table and writes JSON (``--out``). Not a test: it takes tens of minutes (the default
space with ranks and buckets holds a few hundred configs; a shape's grid is its configs x
``--grid-seconds`` x ``--grid-rounds``, and each budget's tune its budget).

    .venv/bin/python bench/bench_search.py --rounds 3
    .venv/bin/python bench/bench_search.py --shape nanogpt --budgets 6m 5m --rounds 3
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.launching import engines  # noqa: E402
from autotune.hardware import fingerprint  # noqa: E402
from autotune.store.journal import Journal  # noqa: E402
from autotune.tuning import Prober, TuneSettings, TuneState, baseline, decision, space  # noqa: E402
from autotune.measuring.foreign_load import FOREIGN_CORES_LIMIT  # noqa: E402
from autotune import AutotuneError, UsageError  # noqa: E402
from autotune.tuning.space.parse import parse_values  # noqa: E402
from bench import shapes  # noqa: E402
from bench.common import ratio_interval, say, tune_as_user  # noqa: E402
from autotune.measuring.trial import TrialSpec, run_trial  # noqa: E402

TARGET = 0.95  # tuned / grid-best the search must reach; below it the bench exits 1

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


def fmt(cfg: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in cfg.items())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=None,
                   help="one probe, grid and tune (default: fitted to the script, as tune does; "
                        "--example only)")
    p.add_argument("--final-seconds", type=float, default=25.0,
                   help="one side-by-side probe, or plain run with --shape")
    p.add_argument("--rounds", type=int, default=3, help="side-by-side rounds")
    p.add_argument("--budget-share", type=float, default=None,
                   help="tune budget as a share of the grid's wall time (default 0.25; "
                        "--example only)")
    p.add_argument("--confirm-rounds", type=int, default=None,
                   help="tune's confirmation rounds (default: tune's own)")
    p.add_argument("--space", nargs="*", default=[], help="as autotune tune --space")
    p.add_argument("--example", choices=("image_classifier", "compute_bound"), default=None,
                   help="a bundled example, its grid probed by autotune (default "
                        "image_classifier)")
    p.add_argument("--shape", choices=shapes.SEARCHED, default=None,
                   help="a third-party script's shape, its grid run as plain processes and "
                        "read from the script's own clock")
    p.add_argument("--grid-seconds", type=float, default=30.0,
                   help="one plain run of the grid (--shape)")
    p.add_argument("--grid-rounds", type=int, default=2,
                   help="interleaved rounds of the grid; grid-best is the best mean (--shape)")
    p.add_argument("--budgets", nargs="+", default=["6m", "5m"], type=budget,
                   help="tune's --budget, one tune each (--shape; default: 6m, 10%% of a "
                        "one-hour run, and a fixed 5m)")
    p.add_argument("--num-images", type=int, default=512, help="image_classifier's dataset")
    p.add_argument("--foreign-limit", type=float, default=FOREIGN_CORES_LIMIT,
                   help="foreign CPU load (cores) that spoils a probe, for grid, tune and the "
                        "side-by-side alike (default: autotune's)")
    p.add_argument("--foreign-retries", type=int, default=2)
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = p.parse_args()
    if args.rounds < 2:
        p.error(f"--rounds must be at least 2 for an interval, but got {args.rounds}")
    if args.shape:
        given = [flag for flag, v in (("--example", args.example), ("--seconds", args.seconds),
                                      ("--budget-share", args.budget_share)) if v is not None]
        if given:
            p.error(f"--shape runs tune as a user does and grids by the script's own clock; "
                    f"drop {', '.join(given)}")
        if len(set(args.budgets)) != len(args.budgets):
            p.error(f"--budgets must differ, but got {' '.join(args.budgets)}")
        if args.grid_rounds < 1 or args.grid_seconds <= 0:
            p.error(f"--grid-rounds >= 1 and --grid-seconds > 0 must hold, but got "
                    f"{args.grid_rounds} and {args.grid_seconds:g}")
    try:
        space.parse_space(args.space)
    except UsageError as e:
        p.error(str(e))
    args.example = args.example or "image_classifier"
    args.budget_share = 0.25 if args.budget_share is None else args.budget_share
    args.work = Path(tempfile.mkdtemp(prefix="bench_search-"))
    try:
        return shape_mode(args) if args.shape else example_mode(args)
    except AutotuneError as e:  # the baseline stage's: nothing was measured
        say(f"FAILED: {e} (work dir {args.work})")
        return 2 if isinstance(e, UsageError) else 1


def budget(text: str) -> str:
    """A ``--budgets`` entry, checked as tune checks its ``--budget``, kept as typed."""
    try:
        space.parse_duration(text)
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def header(command: list[str]) -> str:
    fp = fingerprint.current(command)
    started = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    return (f"# bench_search {started} on {platform.node() or 'host'}: {fp.cores} cores "
            f"({fp.cpu_model}), {platform.machine()}, Python {platform.python_version()}, "
            f"torch {fp.torch_version}")


def baseline_stage(args, baseline_values: dict[str, int] | None = None) \
        -> tuple[Prober, TuneState]:
    """``autotune tune``'s own baseline stage on ``args.command``: the state holding the space
    it searches (``--space`` applied)."""
    stage_dir = args.work / "baseline-stage"
    stage_dir.mkdir()
    settings = TuneSettings(command=tuple(args.command), cwd=str(args.work), seconds=args.seconds,
                            ranges=space.parse_space(args.space),
                            baseline_values=baseline_values or {},
                            foreign_limit_cores=args.foreign_limit,
                            foreign_retries=args.foreign_retries)
    prober = Prober(stage_dir, Journal(stage_dir), engines.resolve("local"),
                    notify=lambda note: say(f"# {note.kind.value}: {note.text}"))
    stage_t0 = time.monotonic()
    state = baseline.measure(prober, TuneState.new(settings, stage_dir))
    sp = state.space
    say(f"# baseline stage: {time.monotonic() - stage_t0:.0f} s; notes: "
        f"{[n.text for n in sp.notes]}")
    say(f"# space: {json.dumps({k: list(v) for k, v in sp.domains.items()})} fixed "
        f"{json.dumps(dict(sp.fixed))}: {sp.size()} configs; default {fmt(sp.baseline)}")
    return prober, state


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


@dataclass(frozen=True)
class ClockGrid:
    """Every config of the space as a plain run, by the script's own clock."""

    configs: list[dict]
    runs: list[shapes.PlainRun]
    rates: list[list[float | None]]  # per config, per round; None: no figure printed
    cost_s: float  # the wall time of one round: each config tried once

    @property
    def best(self) -> int | None:
        """The config with the best mean over its rounds; None when none printed a figure."""
        means = [mean(r) for r in self.rates]
        measured = [i for i, m in enumerate(means) if m is not None]
        return max(measured, key=lambda i: means[i]) if measured else None


@dataclass(frozen=True)
class BudgetTune:
    """One ``autotune tune --budget`` as a user runs it, and its winner as a plain run."""

    budget: str
    wall_s: float
    summary: dict | None
    error: str = ""
    knobs: dict | None = None
    run: shapes.PlainRun | None = None  # None: nothing to measure (the tune failed)

    @property
    def name(self) -> str:
        return f"tuned {self.budget}"


@dataclass(frozen=True)
class SideBySide:
    """Named plain runs re-measured in interleaved rounds; names sharing a run share its
    figures (one run per round)."""

    entries: dict[str, shapes.PlainRun]
    rates: dict[str, list[float | None]]

    def shared(self, name: str) -> list[str]:
        """The other names measured by the same runs as ``name``."""
        return [n for n, r in self.entries.items()
                if n != name and r.key == self.entries[name].key]


def shape_mode(args) -> int:
    """The grid by the script's own clock (module docstring, second list)."""
    shape = shapes.SHAPES[args.shape]
    args.command = [*shape.script, *shape.placeholders]
    head = header(args.command)
    say(head)
    say(f"# shape {args.shape}: {shape.what}; {Path(shape.script[0]).relative_to(ROOT)}; grid "
        f"of plain runs of {args.grid_seconds:g} s x {args.grid_rounds} rounds; tune --budget "
        f"{' and '.join(args.budgets)}; side by side {args.rounds} rounds of "
        f"{args.final_seconds:g} s; work dir {args.work}")

    # 1. tune's own baseline stage -> the space it searches, each config as a plain run
    _, state = baseline_stage(args, parse_values(list(shape.baseline)))
    sp = state.space
    configs = sp.configs()
    runs, refused = [], []
    for cfg in configs:
        try:
            runs.append(shapes.plain_run(shape, cfg, sp))
        except shapes.NotPlain as e:
            refused.append(f"{fmt(cfg)}: {e}")
    if refused:
        for line in refused:
            say(f"ERROR: a plain run cannot set {line}")
        say(f"HINT: hold such knobs at the script's own value with --space NAME=VALUE (its own: "
            f"{fmt(sp.baseline)}), the same for the grid and the tune")
        return 2
    say(f"# the grid covers: {coverage(sp, shape)}")

    grid = clock_grid(args, shape, configs, runs)  # 2.
    if grid.best is None:
        say("FAILED: no config of the grid printed its own rate; nothing was measured")
        return 1
    tunes = [tune_budget(args, shape, i, b, sp) for i, b in enumerate(args.budgets)]  # 3.
    entries = {"default": shapes.default_run(shape), "grid-best": grid.runs[grid.best],
               **{t.name: t.run for t in tunes if t.run is not None}}
    final = side_by_side(args, shape, entries)  # 4.
    return report(args, head, sp, grid, tunes, final)


def clock_grid(args, shape: shapes.Shape, configs: list[dict],
               runs: list[shapes.PlainRun]) -> ClockGrid:
    """Every config a plain run of ``--grid-seconds``, in ``--grid-rounds`` interleaved
    rounds."""
    rates: list[list[float | None]] = [[] for _ in configs]
    round_s: dict[int, float] = {}
    for rnd, i in decision.interleave(list(range(len(configs))), args.grid_rounds):
        rate, wall_s, tail = clocked(runs[i], shape, args.work, args.grid_seconds)
        rates[i].append(rate)
        round_s[rnd] = round_s.get(rnd, 0.0) + wall_s
        say(f"grid round {rnd} {i + 1:3d}/{len(configs)} {fmt(configs[i]):40s} "
            f"{runs[i].text():35s} " + (f"{rate:8.1f} samples/s" if rate else
                                        f"no rate printed: {tail}"))
    grid = ClockGrid(configs, runs, rates, sum(round_s.values()) / len(round_s))
    b = grid.best
    if b is not None:
        say(f"# grid: {len(configs)} configs, {sum(1 for r in rates if mean(r) is None)} "
            f"without a figure; one round {grid.cost_s:.0f} s wall (its cost); best "
            f"{fmt(configs[b])} ({runs[b].text()}) {mean(rates[b]):.1f} samples/s, the mean "
            f"of the {sum(1 for r in rates[b] if r)} of {args.grid_rounds} round(s) with a "
            f"figure")
    return grid


def side_by_side(args, shape: shapes.Shape, entries: dict[str, shapes.PlainRun]) -> SideBySide:
    """Each distinct run of ``entries`` once per round, ``--rounds`` interleaved rounds of
    ``--final-seconds``."""
    distinct = {r.key: r for r in entries.values()}
    by_key: dict[tuple, list[float | None]] = {k: [] for k in distinct}
    for rnd, k in decision.interleave(list(distinct), args.rounds):
        rate, _, tail = clocked(distinct[k], shape, args.work, args.final_seconds)
        by_key[k].append(rate)
        names = ", ".join(n for n, r in entries.items() if r.key == k)
        say(f"final round {rnd} {names:30s} " + (f"{rate:8.1f} samples/s" if rate else
                                                 f"no rate printed: {tail}"))
    return SideBySide(entries, {n: by_key[r.key] for n, r in entries.items()})


def report(args, head: str, sp: space.Space, grid: ClockGrid, tunes: list[BudgetTune],
           final: SideBySide) -> int:
    """The table, the JSON, and the exit code (`verdict` for every budget)."""
    rates = final.rates
    say("")
    say(f"{'config':14s} {'samples/s':>10s} {'rounds':>7s}  run (knobs)")
    for n, run in final.entries.items():
        m = mean(rates[n])
        got = sum(1 for r in rates[n] if r)
        shared = final.shared(n)
        say(f"{n:14s} {m if m is not None else math.nan:10.1f} {got:3d}/{len(rates[n]):<3d}  "
            f"{run.text()}{'' if run.env else ' (its own threads)'}"
            + (f"  (the same runs as {', '.join(shared)})" if shared else ""))
    say("")
    say(f"{'budget':7s} {'tuned/grid-best':>17s} {'tuned/default':>17s} {'tune / grid cost':>24s}"
        f"  stopped")
    ratios = {}
    for t in tunes:
        if t.run is None:
            say(f"{t.budget:7s} {'not measured':>17s}  {t.error}")
            continue
        tg = ratio_interval(rates[t.name], rates["grid-best"])
        td = ratio_interval(rates[t.name], rates["default"])
        ratios[t.budget] = {"tuned/grid-best": tg, "tuned/default": td}
        cost = f"{t.wall_s:.0f} s / {grid.cost_s:.0f} s = {t.wall_s / grid.cost_s:.0%}"
        say(f"{t.budget:7s} {tg[0]:8.3f} ± {tg[1]:6.3f} {td[0]:8.3f} ± {td[1]:6.3f} "
            f"{cost:>24s}  {t.summary['stop_reason']}")
    gd = ratio_interval(rates["grid-best"], rates["default"])
    say(f"grid-best / default {gd[0]:.3f} ± {gd[1]:.3f}; target tuned / grid-best >= "
        f"{TARGET:.2f}")
    for t in tunes:
        if t.summary is None:
            continue
        s = t.summary
        say(f"# {t.budget}: {s['trials']} probes; "
            f"{'kept the defaults' if s['kept_baseline'] else 'replaced the defaults'}; "
            f"{s['reason']}")
        say(f"# {t.budget}: process_noise: {brief(s.get('process_noise'))}")
        others = [(path, v) for path, v in noise_fields(s) if path != "process_noise"]
        for path, value in others:
            say(f"# {t.budget}: {path}: {brief(value)}")
        if not others:
            say(f"# {t.budget}: no other entry of the summary names noise")
    if args.out:
        args.out.write_text(json.dumps({
            "header": head, "shape": args.shape, "space": sp.to_dict(),
            "grid": [{"knobs": c, "run": r.text(), "env": dict(r.env), "rates": g}
                     for c, r, g in zip(grid.configs, grid.runs, grid.rates)],
            "grid_best": grid.configs[grid.best], "grid_s": grid.cost_s,
            "grid_seconds": args.grid_seconds, "grid_rounds": args.grid_rounds,
            "tunes": [{"budget": t.budget, "wall_s": t.wall_s, "summary": t.summary,
                       "error": t.error, "knobs": t.knobs,
                       "run": t.run.text() if t.run else None} for t in tunes],
            "final": {"runs": {n: r.text() for n, r in final.entries.items()},
                      "rates": rates},
            "ratios": {**ratios, "grid-best/default": gd}}, indent=2, default=str))
    codes = []
    for t in tunes:
        if t.budget not in ratios:
            say(f"FAILED: tune --budget {t.budget} gave no config to measure: {t.error}")
            codes.append(1)
        else:
            tg = ratios[t.budget]["tuned/grid-best"]
            say(f"tune --budget {t.budget}: tuned / grid-best {tg[0]:.3f} ± {tg[1]:.3f}")
            codes.append(verdict(*tg))
    return max(codes)


def coverage(sp: space.Space, shape: shapes.Shape) -> str:
    """How the grid's plain runs set each knob of the space (every config passed
    `shapes.plain_run`, so this is all of it)."""
    args = shape.placeholders

    def how(name: str, values: list[int]) -> str:
        if name == "thread_pct":
            return (f"(OMP_NUM_THREADS and MKL_NUM_THREADS "
                    f"{[space.threads_per_rank(v, sp.cores) for v in values]} of {sp.cores} "
                    f"cores)")
        at = [i for i, a in enumerate(args) if "{" + name + "}" in a]
        if at:  # the flag with its placeholder, or the flag before a bare placeholder
            i = at[0]
            return f"({args[i] if args[i].startswith('-') else ' '.join(args[i - 1:i + 1])})"
        return "(one process)" if name == "instances" else "(the script's own)"

    searched = [f"{n} {list(v)} {how(n, list(v))}" for n, v in sp.domains.items()]
    fixed = [f"{n}={v} {how(n, [v])}" for n, v in sp.fixed.items()]
    return "; ".join(searched) + (f"; fixed: {', '.join(fixed)}" if fixed else "")


def clocked(run: shapes.PlainRun, shape: shapes.Shape, work: Path,
            seconds: float) -> tuple[float | None, float, str]:
    """One plain run for ``seconds``: the script's own rate (None: fewer than two lines), the
    wall time it took, and its last line of output (what a failed run said)."""
    t0 = time.monotonic()
    out = shapes.timed_run(run.argv(sys.executable), work, seconds, run.environ(os.environ))
    lines = out.strip().splitlines()
    return shapes.own_rate(out, shape.rate), time.monotonic() - t0, lines[-1] if lines else ""


def tune_budget(args, shape: shapes.Shape, index: int, budget: str,
                sp: space.Space) -> BudgetTune:
    """``autotune tune --budget`` as a user runs it, in its own recipe and runs directories (no
    warm start from another budget's recipe), and its winner as a plain run: the script's own
    run when it kept the defaults."""
    work = args.work / f"tune-{index}-{budget}"
    work.mkdir()
    env = dict(os.environ, AUTOTUNE_RUNS_DIR=str(work / "runs"))
    extra = [*shape.tune_args(), "--foreign-limit", str(args.foreign_limit)]
    if args.confirm_rounds is not None:
        extra += ["--confirm-rounds", str(args.confirm_rounds)]
    if args.space:
        extra += ["--space", *args.space]
    tuned = tune_as_user(extra, script=[*shape.script, *shape.placeholders], budget=budget,
                         work=work, env=env, label=f"tune {budget}")
    out = BudgetTune(budget, tuned.wall_s, tuned.summary, tuned.error)
    s = tuned.summary
    if s is None:
        return out
    low, high = s.get("speedup_interval", [math.nan, math.nan])
    say(f"# tune {budget}: {tuned.wall_s:.0f} s wall, {s['trials']} probes, stopped: "
        f"{s['stop_reason']}; claim {s['speedup']:.3f}x ({low:.3f}x-{high:.3f}x); best "
        f"{fmt(s['best']['knobs'])}{' (kept the defaults)' if s['kept_baseline'] else ''}")
    tuned_sp = space.Space.from_dict(s["space"])
    if dict(tuned_sp.domains) != dict(sp.domains):
        say(f"WARNING: tune {budget} searched "
            f"{json.dumps({k: list(v) for k, v in tuned_sp.domains.items()})}, not the grid's "
            f"space: its own baseline saw the script otherwise")
    if s["kept_baseline"]:
        return replace(out, knobs=dict(tuned_sp.baseline), run=shapes.default_run(shape))
    try:
        run = shapes.plain_run(shape, s["best"]["knobs"], tuned_sp)
    except shapes.NotPlain as e:
        say(f"ERROR: tune {budget}'s winner cannot be run plainly: {e}")
        return replace(out, error=f"its winner cannot be run plainly: {e}")
    return replace(out, knobs=dict(s["best"]["knobs"]), run=run)


def mean(values) -> float | None:
    """The mean of the figures there are (None: a run without one); None without any."""
    got = [v for v in values if v]
    return sum(got) / len(got) if got else None


def noise_fields(d, path: str = "") -> list[tuple[str, object]]:
    """Every entry of the tune's summary whose key speaks of noise, at any depth, as
    ``(dotted.path, value)``; another developer adds ``process_noise`` beside those there are."""
    out = []
    if isinstance(d, dict):
        for k, v in d.items():
            here = f"{path}.{k}" if path else str(k)
            if "noise" in str(k).lower():
                out.append((here, v))
            else:
                out.extend(noise_fields(v, here))
    return out


def brief(value, limit: int = 300) -> str:
    """``value`` as compact JSON, cut at ``limit`` characters; "(none)" for None."""
    if value is None:
        return "(none in this summary)"
    text = json.dumps(value, default=str, separators=(",", ":"))
    return text if len(text) <= limit else text[:limit] + "..."


def verdict(ratio: float, half: float) -> int:
    """0 when tuned / grid-best meets `TARGET`; 1 when it misses it, or when the side by side
    measured nothing (no ratio, or no interval)."""
    if not math.isfinite(ratio) or not math.isfinite(half):
        say("FAILED: the side by side gave no ratio with an interval; nothing was measured")
        return 1
    if ratio < TARGET:
        say(f"FAILED: tuned / grid-best {ratio:.3f} is below the target {TARGET:.2f}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
