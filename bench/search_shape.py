"""``bench/bench_search.py --shape``: a third-party script's shape, its grid run as plain
processes and read from the script's own clock, against ``autotune tune --budget`` as a user
runs it (the second list of bench_search's docstring)."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from autotune.tuning import decision, space  # noqa: E402
from autotune.tuning.space.parse import parse_values  # noqa: E402
from bench import shapes, turns  # noqa: E402
from bench.common import ratio_interval, say, tune_as_user  # noqa: E402
from bench.search_common import TARGET, baseline_stage, fmt, header, mean, verdict  # noqa: E402


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

    def top(self, n: int) -> list[int]:
        """The ``n`` configs with the best means, best first (those with a figure)."""
        means = [mean(r) for r in self.rates]
        return sorted((i for i, m in enumerate(means) if m is not None),
                      key=lambda i: -means[i])[:n]

    def ratio_to_best(self, sp: space.Space, knobs: Mapping | None) -> float | None:
        """The grid's own figure for the config ``knobs`` over its best's (the script's own
        config: the grid's run of it, with the thread count autotune gives it); None when the
        grid does not hold it or either printed no figure."""
        best = self.best
        top = mean(self.rates[best]) if best is not None else None
        if knobs is None or not top:
            return None
        key = sp.key(sp.config(dict(knobs)))
        for cfg, rates in zip(self.configs, self.rates):
            if sp.key(cfg) == key:
                m = mean(rates)
                return m / top if m is not None else None
        return None


@dataclass(frozen=True)
class Judged:
    """The grid's top configs measured again in rounds that take turns (`bench.turns`), so
    that the machine's drift, which plain runs one after another carry into their ranking,
    falls on each alike; grid-best is the best of these."""

    indices: list[int]  # into the grid's configs, in the grid's own order of merit
    rates: list[list[float | None]]  # per judged config, per round
    wall_s: float

    @property
    def best(self) -> int | None:
        """The grid index of the judged config with the best mean; None when none printed a
        figure inside its slices."""
        means = [mean(r) for r in self.rates]
        measured = [j for j, m in enumerate(means) if m is not None]
        return self.indices[max(measured, key=lambda j: means[j])] if measured else None

    def text(self, grid: ClockGrid) -> str:
        """Each judged config's mean over the rounds, in the grid's order of merit."""
        return ", ".join(f"{fmt(grid.configs[i])} "
                         f"{mean(r) if mean(r) is not None else math.nan:.1f}"
                         for i, r in zip(self.indices, self.rates))

    def ratio_to_best(self, grid: ClockGrid, sp: space.Space,
                      knobs: Mapping | None) -> float | None:
        """The judging's figure for the config ``knobs`` over its best's; None when it was not
        among those judged or either has no figure."""
        best = self.best
        if knobs is None or best is None:
            return None
        key = sp.key(sp.config(dict(knobs)))
        top = mean(self.rates[self.indices.index(best)])
        for i, rates in zip(self.indices, self.rates):
            if sp.key(grid.configs[i]) == key:
                m = mean(rates)
                return m / top if m is not None and top else None
        return None


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
        f"{args.final_seconds:g} s" + (" each, taking turns" if args.side_by_side == "turns"
                                       else ", one after another") +
        f"; work dir {args.work}")

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

    if args.grid_from is not None:  # 2., from an earlier run of this shape and space
        try:
            grid = reused_grid(args, sp, configs, runs)
        except ValueError as e:
            say(f"ERROR: --grid-from {args.grid_from}: {e}")
            say("HINT: run without --grid-from to measure the grid afresh")
            return 2
    else:
        grid = clock_grid(args, shape, configs, runs)  # 2.
    if grid.best is None:
        say("FAILED: no config of the grid printed its own rate; nothing was measured")
        return 1
    judged = None  # 2b.
    if args.judge_top > 1:
        judged = reused_judging(args, sp, grid) if args.grid_from is not None else None
        judged = judged or judge_top(args, shape, grid)
    best = judged.best if judged is not None and judged.best is not None else grid.best
    tunes = [tune_budget(args, shape, i, b, sp) for i, b in enumerate(args.budgets)]  # 3.
    entries = {"default": shapes.default_run(shape), "grid-best": grid.runs[best],
               **{t.name: t.run for t in tunes if t.run is not None}}
    final = side_by_side(args, shape, entries)  # 4.
    return report(args, head, sp, grid, tunes, final, judged)


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


def reused_grid(args, sp: space.Space, configs: list[dict],
                runs: list[shapes.PlainRun]) -> ClockGrid:
    """The grid an earlier run of this shape wrote (``--out``), read from ``--grid-from``:
    its figures by the script's own clock, for the same configs as this run's space. The
    grid only names the best config; the side by side measures it afresh beside the tuned.
    Raises ValueError, saying what differs, for a file of another shape or space."""
    try:
        d = json.loads(args.grid_from.read_text())
        rows, cost_s = d["grid"], float(d["grid_s"])
        by_key = {sp.key(sp.config(dict(r["knobs"]))): [x if x is None else float(x)
                                                        for x in r["rates"]] for r in rows}
    except OSError as e:
        raise ValueError(f"cannot be read ({e.strerror})") from None
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"is not a grid that bench_search --shape wrote ({e!r})") from None
    if d.get("shape") != args.shape:
        raise ValueError(f"holds the grid of shape {d.get('shape')!r}, not {args.shape!r}")
    want = {sp.key(c) for c in configs}
    if set(by_key) != want or len(rows) != len(configs):
        raise ValueError(f"its {len(rows)} configs are not this run's space of {len(configs)} "
                         f"({fmt(sp.baseline)} and --space {' '.join(args.space) or 'default'})")
    args.grid_seconds, args.grid_rounds = float(d["grid_seconds"]), int(d["grid_rounds"])
    grid = ClockGrid(configs, runs, [by_key[sp.key(c)] for c in configs], cost_s)
    b = grid.best
    say(f"# grid reused from {args.grid_from} ({d.get('header', '').lstrip('# ')}): "
        f"{len(configs)} configs, {args.grid_rounds} round(s) of {args.grid_seconds:g} s, one "
        f"round {cost_s:.0f} s wall; best {fmt(configs[b])} ({runs[b].text()}) "
        f"{mean(grid.rates[b]):.1f} samples/s" if b is not None else
        f"# grid reused from {args.grid_from}: no config printed a figure")
    for cfg, r in zip(configs, grid.rates):
        say(f"grid (reused) {fmt(cfg):40s} " + " ".join(
            f"{x:8.1f}" if x else "    none" for x in r))
    return grid


def judge_top(args, shape: shapes.Shape, grid: ClockGrid) -> Judged:
    """The grid's ``--judge-top`` best configs by its own means, again in ``--rounds`` rounds
    that take turns, ``--final-seconds`` each: plain runs one after another rank configs 5-10%
    apart by when they ran (word_lm's sixth grid put 32 7% above 64, and every measurement in
    turns put 64 above 32)."""
    top = grid.top(args.judge_top)
    t0 = time.monotonic()
    rates = in_turns(args, shape, [grid.runs[i] for i in top],
                     lambda j: f"judge {fmt(grid.configs[top[j]])}")
    judged = Judged(top, rates, time.monotonic() - t0)
    b = judged.best
    say(f"# judged: the grid's top {len(top)} in {args.rounds} rounds taking turns, "
        f"{judged.wall_s:.0f} s: {judged.text(grid)}" +
        (f"; grid-best {fmt(grid.configs[b])}" +
         (f" (the grid's own rounds put {fmt(grid.configs[grid.best])} first)"
          if b != grid.best else " (as the grid's own rounds)") if b is not None else
         "; no figure inside a slice, grid-best stays the grid's own"))
    return judged


def reused_judging(args, sp: space.Space, grid: ClockGrid) -> Judged | None:
    """The judging an earlier run wrote beside the grid ``--grid-from`` reused, when it judged
    the same ``--judge-top`` configs, in this grid's order of merit; None (judge afresh)
    otherwise, saying why."""
    try:
        d = json.loads(args.grid_from.read_text()).get("judged")
        knobs, rates, wall_s = d["knobs"], d["rates"], float(d["wall_s"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        say(f"# --grid-from {args.grid_from} holds no judging of the grid's top configs: "
            f"judging them afresh")
        return None
    top = grid.top(args.judge_top)
    if [sp.key(sp.config(dict(k))) for k in knobs] != [sp.key(grid.configs[i]) for i in top]:
        say(f"# --grid-from {args.grid_from} judged {len(knobs)} configs, not this run's top "
            f"{len(top)} (--judge-top {args.judge_top}): judging them afresh")
        return None
    judged = Judged(top, [[x if x is None else float(x) for x in r] for r in rates], wall_s)
    b = judged.best
    say(f"# judged (reused from {args.grid_from}): {judged.text(grid)}" +
        (f"; grid-best {fmt(grid.configs[b])}" if b is not None else ""))
    return judged


def in_turns(args, shape: shapes.Shape, runs: list[shapes.PlainRun],
             label) -> list[list[float | None]]:
    """``runs`` in ``--rounds`` rounds taking turns (`bench.turns`), each measuring
    ``--final-seconds`` in its slices, who starts (and warms up alone) first rotating round to
    round; per run, its rate per round. ``label(j)`` names run j in the lines printed."""
    rates: list[list[float | None]] = [[] for _ in runs]
    for rnd in range(1, args.rounds + 1):
        order = [(rnd - 1 + j) % len(runs) for j in range(len(runs))]
        readings = turns.take_turns([runs[j] for j in order], shape.rate, args.work,
                                    measure_s=args.final_seconds)
        for j, reading in zip(order, readings):
            rates[j].append(reading.rate)
            say(f"{label(j)} round {rnd}: " + (
                f"{reading.rate:8.1f} samples/s ({len(reading.counted)} of its lines inside "
                f"its {len(reading.slices)} slices; {len(reading.left_out)} spanning a hold "
                f"left out)" if reading.rate else f"no line inside a slice: {reading.tail}"))
    return rates


def side_by_side(args, shape: shapes.Shape, entries: dict[str, shapes.PlainRun]) -> SideBySide:
    """Each distinct run of ``entries`` once per round, ``--rounds`` rounds: taking turns
    (`bench.turns`, each run measuring ``--final-seconds`` in its slices; the default), or
    interleaved one after another, ``--final-seconds`` each (``--side-by-side sequential``)."""
    distinct = {r.key: r for r in entries.values()}
    by_key: dict[tuple, list[float | None]] = {k: [] for k in distinct}
    if args.side_by_side == "turns":
        keys = list(distinct)
        rates = in_turns(args, shape, [distinct[k] for k in keys], lambda j: "final " + ", ".join(
            n for n, r in entries.items() if r.key == keys[j]))
        by_key = dict(zip(keys, rates))
        return SideBySide(entries, {n: by_key[r.key] for n, r in entries.items()})
    for rnd, k in decision.interleave(list(distinct), args.rounds):
        rate, _, tail = clocked(distinct[k], shape, args.work, args.final_seconds)
        by_key[k].append(rate)
        names = ", ".join(n for n, r in entries.items() if r.key == k)
        say(f"final round {rnd} {names:30s} " + (f"{rate:8.1f} samples/s" if rate else
                                                 f"no rate printed: {tail}"))
    return SideBySide(entries, {n: by_key[r.key] for n, r in entries.items()})


def report(args, head: str, sp: space.Space, grid: ClockGrid, tunes: list[BudgetTune],
           final: SideBySide, judged: Judged | None = None) -> int:
    """The table, the JSON, and the exit code (`verdict` for every budget)."""
    rates = final.rates
    best = judged.best if judged is not None and judged.best is not None else grid.best
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
    say(f"{'budget':7s} {'tuned/grid-best':>17s} {'by the grid':>11s} {'judged':>7s} "
        f"{'tuned/default':>17s} {'tune / grid cost':>24s}  stopped")
    ratios = {}
    for t in tunes:
        if t.run is None:
            say(f"{t.budget:7s} {'not measured':>17s}  {t.error}")
            continue
        tg = ratio_interval(rates[t.name], rates["grid-best"])
        td = ratio_interval(rates[t.name], rates["default"])
        by_grid = grid.ratio_to_best(sp, t.knobs)
        by_judged = judged.ratio_to_best(grid, sp, t.knobs) if judged is not None else None
        ratios[t.budget] = {"tuned/grid-best": tg, "tuned/default": td,
                            "tuned/grid-best by the grid": by_grid,
                            "tuned/grid-best judged in turns": by_judged}
        cost = f"{t.wall_s:.0f} s / {grid.cost_s:.0f} s = {t.wall_s / grid.cost_s:.0%}"
        say(f"{t.budget:7s} {tg[0]:8.3f} ± {tg[1]:6.3f} "
            f"{by_grid if by_grid is not None else math.nan:11.3f} "
            f"{by_judged if by_judged is not None else math.nan:7.3f} {td[0]:8.3f} ± {td[1]:6.3f} "
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
            "grid_best": grid.configs[best], "grid_best_by_the_grid": grid.configs[grid.best],
            "judged": None if judged is None else {
                "knobs": [grid.configs[i] for i in judged.indices], "rates": judged.rates,
                "wall_s": judged.wall_s},
            "grid_s": grid.cost_s,
            "grid_from": str(args.grid_from) if args.grid_from else None,
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
            by_grid = ratios[t.budget]["tuned/grid-best by the grid"]
            by_judged = ratios[t.budget]["tuned/grid-best judged in turns"]
            say(f"tune --budget {t.budget}: tuned / grid-best {tg[0]:.3f} ± {tg[1]:.3f}; by "
                f"the grid's own rounds {by_grid if by_grid is not None else math.nan:.3f}"
                + (f"; by the judging in turns {by_judged:.3f}" if by_judged is not None
                   else ""))
            code = verdict(*tg)
            codes.append(code)
            reference = by_judged if by_judged is not None else by_grid
            if code == 0 and not grid_agrees(reference):
                judged_it = by_judged is not None
                by = "the judging in turns" if judged_it else \
                    "the grid's plain runs, one after another,"
                told = math.isfinite(gd[1]) and abs(gd[0] - 1) > gd[1]
                why = (f"the side by side told the grid's best from the defaults (grid-best / "
                       f"default {gd[0]:.3f} ± {gd[1]:.3f}) and puts the tuned config at "
                       f"{tg[0]:.3f} of it, where {by} does not" if told else
                       f"the side by side could not tell them apart (grid-best / default "
                       f"{gd[0]:.3f} ± {gd[1]:.3f})")
                source = "the judging in turns" if judged_it else "the grid's own rounds"
                say(f"WARNING: tune --budget {t.budget} passes on the side by side alone: by "
                    f"{source} its config is {reference:.3f} of the grid's best, below the "
                    f"target {TARGET:.2f}; {why}")
    return max(codes)


def grid_agrees(by_grid: float | None) -> bool:
    """Whether the grid's own rounds (or, where the tuned config was among them, the judging
    of the grid's top configs in turns) put the tuned config within `TARGET` of the grid's
    best (True when neither holds it). Not the gate: the grid's best is the best of many
    noisy figures, so its own figure runs high, and the side by side re-measures it fresh.
    But a side by side too noisy to tell the grid's best from the defaults passes a tune that
    kept them (nanoGPT's shape, 2026-11-27: 0.966 on a machine moving 25% between rounds, where
    the grid had put its best at 1.18x the defaults), and the report says so."""
    return by_grid is None or by_grid >= TARGET


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
