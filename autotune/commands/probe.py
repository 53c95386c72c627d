"""``autotune probe``: where is the bottleneck? full vs synthetic (compute) vs io (input)."""

from __future__ import annotations

import dataclasses
import math
import os
import sys

from autotune.monitor import console
from autotune.store import jsontext, rundir
from autotune.launching import engines, reach
from autotune.measuring import bottleneck
from autotune.monitor.text import cost_text
from autotune.commands import common
from autotune.store.journal import Journal
from autotune.measuring.outcome import Outcome
from autotune.monitor import watch
from autotune.measuring.probe_state import TrialSpec
from autotune.measuring.trial import run_trial
from autotune.tuning import fitting
from autotune.measuring.trial_events import TrialEvents
from autotune.tuning import baseline
from autotune.store.events import Event, RunKind
from probes import protocol
from probes.protocol import Mode


def add_parser(sub):
    p = sub.add_parser("probe", help="diagnose: I/O-bound or compute-bound, and by how much",
                       description="Run the script in three short probes: full (as is), "
                                   "synthetic (first batches replayed, no input pipeline) and "
                                   "io (loader drained, no training), and say which bound holds.")
    p.add_argument("--seconds", type=common.positive_float, default=30.0,
                   help="time limit of each mode, start-up included (default 30)")
    p.add_argument("--modes", default="full,synthetic,io",
                   help="comma-separated subset of full,synthetic,io")
    p.add_argument("--allreduce", action="store_true",
                   help="also time allreduce by message size (4 KB to 256 MB) on 2 ranks "
                        "and show the bucket_mb range it suggests")
    p.add_argument("--instances", type=common.positive_int, default=1, metavar="N",
                   help="data-parallel ranks to start (torchrun-style env; default 1)")
    engines.add_launcher_args(p)
    common.add_probe_args(p)
    common.add_script_args(p)
    return p


def run(args) -> int:
    target = common.resolve_target(args)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    bad = [m for m in modes if m not in protocol.MODES]
    if bad or not modes:
        from autotune import UsageError
        raise UsageError(f"--modes: unknown mode {bad[0] if bad else args.modes!r}; "
                         f"choose from {','.join(protocol.MODES)}")
    launcher, reached = reach.settle(engines.from_args(args))
    if reached:
        print(f"autotune: {reached.text()}", file=sys.stderr, flush=True)
    knobs, guessed = baseline.placeholder_values(target[1:])
    for name in guessed:
        print(f"autotune: placeholder {{{name}}} = {knobs[name]} (its conventional value; "
              f"'autotune tune' searches it)", file=sys.stderr, flush=True)
    watched = common.watch_dirs(target)
    cwd = common.probe_cwd(args)
    target = common.absolute_script(target, cwd)
    root = rundir.Path(args.runs_dir).expanduser() if args.runs_dir else None
    run_dir = rundir.new_run_dir(RunKind.PROBE, target[0], root=root)
    journal = Journal(run_dir)
    journal.emit(Event.RUN_STARTED, kind=RunKind.PROBE, command=list(target), cwd=cwd, modes=modes,
                 budget_s=args.seconds * len(modes))
    say = (lambda msg: print(msg, file=sys.stderr, flush=True))
    results = {}
    try:
        with watch(run_dir, plain=args.plain or args.json,
                   title=f"autotune probe · {os.path.basename(target[0])}") as watching:
            for mode in modes:
                say(f"autotune: probing mode '{mode}' (up to {args.seconds:.0f} s)...")
                told = TrialEvents(journal, f"probe-{mode}", None, mode)
                told.started({})

                def live(est, told=told) -> bool:  # the live estimate, as tune's probes give it
                    told.progress(est)
                    return False  # never pruned

                result = run_trial(TrialSpec.of(
                    command=target, knobs=knobs, cwd=cwd, log_dir=run_dir / "logs",
                    instances=args.instances, launcher=launcher,
                    name=f"probe-{mode}",
                    mode=mode, max_s=args.seconds, samples_per_step=args.samples_per_step,
                    hang_s=fitting.UNTIMED_BUSY_HANG_S, idle_hang_s=fitting.UNTIMED_IDLE_HANG_S,
                    metric=args.metric if mode != "io" else None, watch_dirs=watched,
                    noise=True,  # the report prints the noise scale
                    **({"foreign_limit_cores": args.foreign_limit}
                       if args.foreign_limit is not None else {})),
                    on_progress=live)
                told.finished(result)
                results[mode] = result
                if not result.ok:
                    console.error(f"mode '{mode}' {result.outcome.value}: {result.reason} "
                                  f"(log: {result.log_path})")
            v = _verdict(results)
            summary = {
                "command": list(target), "run_dir": str(run_dir),
                "modes": {m: r.to_dict() for m, r in results.items()},
                "verdict": v.to_dict(),
            }
            if args.allreduce:
                summary["allreduce"] = _allreduce(run_dir, cwd, say)
            rundir.write_atomic(run_dir / "probe.json", jsontext.dumps(summary, indent=2))
            journal.emit(Event.PROBE_VERDICT, verdict=summary["verdict"])
            code = 0 if all(_measured(r) for r in results.values()) else 1
            watching.quiet()  # no device sample after run_ended
            journal.emit(Event.RUN_ENDED, exit_code=code)
    except BaseException as exc:  # the journal says the run is over, however it ended
        journal.emit(Event.RUN_ENDED, exit_code=130 if isinstance(exc, KeyboardInterrupt) else 1,
                     error=f"{type(exc).__name__}: {exc}")
        raise
    if args.json:
        print(jsontext.dumps(summary))
    else:
        _print_table(results, v, run_dir, plain=args.plain)
        _print_allreduce(summary.get("allreduce"), plain=args.plain)
    return code


def _verdict(results: dict):
    """The bottleneck verdict from the modes measured. A probe flagged for foreign load still
    measured something: the verdict uses it and says so, rather than giving none on a busy
    machine."""
    rate = {m: (r.samples_per_s if _measured(r) else None) for m, r in results.items()}
    full = results.get("full")
    parts = full.breakdown if full is not None and _measured(full) else None
    v = bottleneck.decide(rate.get("full"), rate.get("synthetic"), rate.get("io"), parts)
    if any(r.outcome == Outcome.FOREIGN_LOAD for r in results.values()):
        v = dataclasses.replace(v, text=v.text + " (WARNING: measured while other programs "
                                "loaded the CPU; re-run on a quiet machine)")
    return v


def _measured(r) -> bool:
    return (r.ok or r.outcome == Outcome.FOREIGN_LOAD) and r.samples_per_s > 0


def _allreduce(run_dir, cwd, say) -> dict:
    """``--allreduce``: the probe's result as a dict, or {"error": ...} (the probe goes on)."""
    from autotune.measuring import allreduce
    from autotune import LaunchError

    say("autotune: timing allreduce by message size on 2 ranks...")
    try:
        return allreduce.measure(ranks=2, log_dir=run_dir / "logs", cwd=cwd).to_dict()
    except LaunchError as exc:
        say(f"autotune: WARNING: allreduce probe failed: {exc}")
        return {"error": str(exc)}


def _print_allreduce(data, *, plain: bool) -> None:
    if not data:
        return
    out = console.make_console(plain=plain)
    if "error" in data:
        out.print(f"allreduce: failed: {data['error']}")
        return
    from autotune.measuring import allreduce

    result = allreduce.parse(data)
    table = console.Table(title=f"allreduce · {result.backend} · {result.world_size} ranks")
    for col in ("size", "latency", "bus bandwidth"):
        table.add_column(col, justify="right")
    for row in allreduce.rows(result):
        table.add_row(*row)
    out.print(table)
    low, high = data["bucket_mb_range"]
    out.print(f"bucket_mb worth searching: {low:g} to {high:g} MB")


def _print_table(results, v, run_dir, *, plain: bool) -> None:
    out = console.make_console(plain=plain)
    table = console.Table(title="autotune probe", show_lines=False)
    for col in ("mode", "samples/s", "± 95% CI", "source", "outcome", "note"):
        table.add_column(col, justify="right" if col in ("samples/s", "± 95% CI") else "left")
    for mode, r in results.items():
        rate = f"{r.samples_per_s:.1f}" if _measured(r) else "-"
        ci = (f"{r.ci_half:.1f} ({r.ci_half / r.samples_per_s:.1%})"
              if _measured(r) and math.isfinite(r.ci_half) else "-")
        note = r.reason or (f"foreign load {r.foreign_cores:.2f} cores" if r.foreign_flagged
                            else "")
        table.add_row(mode, rate, ci, r.source, r.outcome.value, note)
    out.print(table)
    for mode, r in results.items():
        b = r.breakdown
        if b is not None and _measured(r):
            out.print(f"where the time goes ({mode}, share of wall time ±95%): {b.describe()}")
        if _measured(r) and (r.core_s_per_sample or r.gpu_s_per_sample):
            out.print(f"a sample costs ({mode}): "
                      f"{cost_text(r.core_s_per_sample, r.gpu_s_per_sample)}")
        if _measured(r) and r.energy is not None:
            out.print(f"energy per sample ({mode}): {r.energy.describe()}")
        if _measured(r) and r.noise is not None and mode == Mode.FULL:
            out.print(f"gradient noise scale ({mode}): {r.noise.describe()}")
    out.print(f"verdict: {v.text}")
    out.print(f"run directory: {run_dir}", soft_wrap=True)  # whole, never folded
