"""``autotune tune``: search the knobs on measured throughput, confirm the winner, save a recipe.

`prepare` and `tune_in` are shared with ``autotune wrap``, which then launches the full run.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from autotune.measuring import energy
from autotune.monitor import console
from autotune.monitor.text import cost_text
from autotune.hardware import fingerprint
from autotune.store import controller as controllers, jsontext, rundir
from autotune.tuning import recipes, state as states
from autotune.launching import rank_command, engines, reach
from autotune.tuning import objective, payback, records, space
from autotune.commands import common, detach
from autotune import AutotuneError, Note, NoteKind, UsageError
from autotune.store.journal import Journal, read_events
from autotune.tuning.confirm_rounds import Earlier, earlier_rounds
from autotune.tuning import (TuneReport, TuneSettings, TuneState, Tuner, check_not_running,
                             load_state)
from autotune.tuning.decision import claim_text
from autotune.tuning.state import check_budget
from autotune.tuning.space.parse import parse_values
from autotune.store.events import Event, RunKind


def add_parser(sub):
    p = sub.add_parser("tune", help="search the knobs, confirm the best, save a recipe",
                       description="Probe the script with its own settings (the baseline), "
                                   "search batch size, workers, threads, instances and "
                                   "bucket size with Optuna on measured samples/s, re-measure "
                                   "the best against the baseline, and save the winner as a "
                                   "recipe.")
    add_tune_args(p)
    return p


CONFIRM_ROUNDS = 3  # --confirm-rounds when not given


def _count(text: str) -> int:
    return 0 if text.strip() == "0" else common.positive_int(text)


def add_tune_args(p: argparse.ArgumentParser) -> None:
    s = p.add_argument_group("search")
    s.add_argument("--trials", type=common.positive_int, metavar="N",
                   help=f"probes in the search, baseline included (default: as many as the "
                        f"budget allows; with neither --trials nor --budget, "
                        f"{records.DEFAULT_TRIALS} when the script's arguments do not give the "
                        f"run's length, else the default budget decides; --trials alone sets "
                        f"no time limit)")
    s.add_argument("--budget", type=space.parse_duration, metavar="TIME",
                   help=f"wall time for the whole tuning, confirmation included: 90s, 10m, 1h "
                        f"(default, without --trials: {payback.SHARE * 100:.0f}%% of the full "
                        f"run at the baseline's speed when the script's arguments give its length, "
                        f"--epochs or --max-steps and the like, at least "
                        f"{payback.minutes(payback.MIN_BUDGET_S)} and at most "
                        f"{payback.minutes(payback.MAX_BUDGET_S)}; said before the search "
                        f"starts)")
    s.add_argument("--seconds", type=common.positive_float, default=None, metavar="S",
                   help="time limit of one probe, start-up included (default: fitted to the "
                        "script: the baseline runs until its interval is tight, and every "
                        "later probe gets the start-up, warm-up and measuring time the "
                        "baseline showed, longer for configs with longer steps)")
    s.add_argument("--space", nargs="+", action="extend", default=[], metavar="NAME=RANGE",
                   help="candidates of a knob: batch_size=16:512 (powers of two between), "
                        "workers=0:4, thread_pct=25:100 (or threads=1,2,4: threads per "
                        "rank, on CPU), instances=1:2, bucket_mb=5:100, prefetch=2:8, "
                        "persistent=0:1, pin_memory=0:1, on GPU hosts host_threads=0,2,4 and "
                        "pin=0:1; end the list with '--' before the script")
    s.add_argument("--fix", nargs="+", action="extend", default=[], metavar="NAME=VALUE",
                   help="hold a knob at one value, any knob --space takes: workers=2, "
                        "thread_pct=50 (or threads=4)")
    s.add_argument("--global-batch", type=common.positive_int, metavar="N",
                   help="keep the full run's global batch at N: per-rank batch = N / world size "
                        "(instances x GPUs x hosts the full run uses), so only world sizes "
                        "that divide N are tried")
    s.add_argument("--baseline", nargs="+", action="extend", default=[], metavar="NAME=VALUE",
                   help="the script's own value of a knob you pass as a {placeholder}, for "
                        "the baseline probe (default: batch_size=32, workers=0)")
    s.add_argument("--confirm-rounds", type=_count, default=None, metavar="N",
                   help="interleaved re-measurements of the best two and the baseline "
                        "(default 3; a budget may hold fewer, or more when the search stops "
                        "for it or ends early with a gain that needs them). The script's "
                        "defaults are replaced only when the speed-up's 95%% interval, "
                        "corrected for the candidates compared, lies above 1.0 after 2 "
                        "rounds at least, or after 1 where the spread between processes was "
                        "measured and even its upper bound cannot explain the gain; with 0 "
                        "(no confirmation) they are kept. With --resume of a finished tune: "
                        "N rounds more of its confirmation, judged with those it had")
    s.add_argument("--confirm-seconds", type=common.positive_float, metavar="S",
                   help="time limit of one confirmation probe (default 1.5 x --seconds, or "
                        "each config's fitted probe)")
    s.add_argument("--objective", metavar="NAME", default=None,
                   help="what the search maximises: throughput (samples/s, the default), "
                        "goodput (samples/s x statistical efficiency of the global batch, "
                        "from the gradient noise scale of a data-parallel trial), energy "
                        "(samples per joule, from NVML or RAPL), or throughput,energy (both: "
                        "the winner is picked from the Pareto front)")
    s.add_argument("--seed", type=int, help="seed of the sampler, for a reproducible search")
    s.add_argument("--verdict", action="store_true",
                   help="also probe the winner in synthetic and io modes and record the "
                        "bottleneck verdict in the recipe")
    st = p.add_argument_group("study")
    st.add_argument("--storage", metavar="URL",
                    help="Optuna storage URL (default: SQLite in the run directory)")
    st.add_argument("--study-name", metavar="NAME", help="study name (default: from the run)")
    st.add_argument("--resume", metavar="RUN",
                    help="continue an interrupted tune/wrap run (its directory, id, or a "
                         "unique prefix of its id): finished trials are kept, the interrupted "
                         "one is re-run; with --confirm-rounds N, a finished tune's "
                         "confirmation is extended by N rounds")
    r = p.add_argument_group("recipes")
    r.add_argument("--recipe-dir", metavar="DIR",
                   help="where recipes are saved and looked up (default ./recipes; with "
                        "--resume, the run's own)")
    r.add_argument("--no-warm-start", action="store_true",
                   help="do not try a matching recipe's knobs first")
    engines.add_launcher_args(p.add_argument_group("ranks"))
    detach.add_detach_arg(p)
    common.add_probe_args(p)
    common.add_script_args(p)


@dataclass
class Prepared:
    """A tuning run ready to start: its directory, journal and state, and what to run."""

    run_dir: Path
    journal: Journal
    state: TuneState  # settings, the full run's command and cwd, a warm start
    fp: fingerprint.Fingerprint
    recipe_dir: Path
    resume: bool
    launcher: engines.Launcher = engines.Launcher()
    warm_note: str = ""
    reach_note: str = ""  # where ranks on other hosts reach the controller, and why there
    earlier: Earlier | None = None  # a finished confirmation that this session extends

    @property
    def settings(self) -> TuneSettings:
        return self.state.settings

    @property
    def target(self) -> tuple[str, ...]:  # for the full run: as the user typed it
        return self.state.run_command

    @property
    def run_cwd(self) -> str:
        return self.state.run_cwd


def _settings(args, target: tuple[str, ...], cwd: str, launcher: engines.Launcher,
              ranges: dict[str, space.Range], fixed: dict[str, space.Range],
              baseline_values: dict[str, int],
              goal: objective.Objective = objective.THROUGHPUT) -> TuneSettings:
    space.check_request(space.SpaceRequest(ranges=ranges, fixed=fixed,
                                           global_batch=args.global_batch))
    space.explicit_fixes(target[1:], ranges, fixed, global_batch=args.global_batch)
    extra = {}
    if args.foreign_limit is not None:
        extra["foreign_limit_cores"] = args.foreign_limit
    return TuneSettings(
        command=target, cwd=cwd, seconds=args.seconds, trials=args.trials,
        budget_s=args.budget,
        confirm_rounds=CONFIRM_ROUNDS if args.confirm_rounds is None else args.confirm_rounds,
        confirm_s=args.confirm_seconds, ranges=ranges, fixed=fixed,
        baseline_values=baseline_values, global_batch=args.global_batch,
        samples_per_step=args.samples_per_step, seed=args.seed, verdict=args.verdict,
        storage=args.storage, study_name=args.study_name, launcher=launcher.kind,
        hostfile=launcher.hostfile, recipe_dir=os.path.abspath(
            os.path.expanduser(args.recipe_dir or recipes.DEFAULT_DIR)), objective=goal,
        **extra)


def check_energy_readable(goal: objective.Objective) -> None:
    """An energy objective on a host with no GPU and no readable RAPL counter: one line, exit
    2, before anything runs (with a GPU, the baseline's reading decides)."""
    if not goal.uses_energy or fingerprint.gpus()[0]:
        return
    why = energy.EnergyMeter([]).rapl.why
    if why:
        raise UsageError(f"--objective {goal.token}: no energy counter can be read here (no "
                         f"GPU visible; CPU package: {why}); use --objective throughput")


def prepare(args, kind: RunKind) -> Prepared:
    """Check the input and set up the run directory; nothing runs yet."""
    ranges = space.parse_space(args.space)  # first: it names a script it swallowed by mistake
    fixed = space.parse_fix(args.fix)
    baseline_values = parse_values(args.baseline)
    goal = objective.Objective.parse(args.objective) if args.objective else None
    if args.resume:
        if args.target:
            raise UsageError("--resume continues a run with its own script and settings; "
                             "drop the script from the command line")
        if args.launcher or args.hostfile:
            raise UsageError("--resume starts ranks the way the run did; drop --launcher and "
                             "--hostfile")
        run_dir = rundir.resolve(args.resume, Path(args.runs_dir).expanduser()
                                 if args.runs_dir else None)
        state = load_state(run_dir)
        if goal is not None and goal != state.settings.objective:
            raise UsageError(f"--resume keeps the run's --objective "
                             f"{state.settings.objective.token}; drop --objective {goal.token}")
        settings = state.settings
        for flag, given, own, default in (
                ("--storage", args.storage, settings.storage, "study.db in the run directory"),
                ("--study-name", args.study_name, settings.study_name,
                 f"autotune-{run_dir.name}")):
            if given is not None and given != own:
                raise UsageError(f"--resume keeps the run's study ({flag} {own or default}); "
                                 f"drop {flag} {given}")
        check_not_running(run_dir)
        earlier = _extends(run_dir, args.confirm_rounds)
        over = {k: v for k, v in (("trials", args.trials), ("budget_s", args.budget),
                                  ("confirm_rounds", args.confirm_rounds),
                                  ("recipe_dir", args.recipe_dir and os.path.abspath(
                                      os.path.expanduser(args.recipe_dir)))) if v is not None}
        state = dataclasses.replace(state, kind=kind, run_id=state.run_id or run_dir.name,
                                    settings=dataclasses.replace(state.settings, **over))
        if earlier is None:
            check_budget(run_dir, state.settings.budget_s)
        recipe_dir = check_recipe_dir(state.settings.recipe_dir or recipes.DEFAULT_DIR)
        launcher, reached = reach.settle(engines.resolve(state.settings.launcher,
                                                         state.settings.hostfile))
        return Prepared(run_dir, Journal(run_dir), state,
                        fingerprint.current(state.settings.command), recipe_dir, True,
                        launcher, reach_note=reached.text() if reached else "",
                        earlier=earlier)
    target = common.resolve_target(args)
    launcher = engines.from_args(args)
    cwd = common.probe_cwd(args)
    probe_target = common.absolute_script(target, cwd)
    settings = _settings(args, probe_target, cwd, launcher, ranges, fixed, baseline_values,
                         goal or objective.THROUGHPUT)
    check_energy_readable(settings.objective)
    recipe_dir = check_recipe_dir(settings.recipe_dir)
    fp = fingerprint.current(target)
    warm, note = (None, "")
    if not args.no_warm_start and rank_command.is_python_script(target[0]):
        warm, note = recipes.warm_start_candidate(recipe_dir, target, fp)
    launcher, reached = reach.settle(launcher)  # once the input is checked, before any run
    root = Path(args.runs_dir).expanduser() if args.runs_dir else None
    run_dir = rundir.new_run_dir(kind, target[0], root=root)
    state = TuneState.new(settings, run_dir, kind=kind, run_command=target, run_cwd=os.getcwd(),
                          warm_start=warm.knobs if warm else None)
    return Prepared(run_dir, Journal(run_dir), state, fp, recipe_dir, False, launcher, note,
                    reached.text() if reached else "")


def _extends(run_dir: Path, rounds: int | None) -> Earlier | None:
    """A finished tuning resumed with ``--confirm-rounds N``: the confirmation it had, which
    N rounds more extend. None for a tuning that did not finish; a `UsageError` for a finished
    one without N, or without a confirmation to extend."""
    if "recipe" not in _summary(run_dir):
        return None
    if not rounds:
        raise UsageError(f"--resume: the tuning in {run_dir} finished (see its summary.json); "
                         f"'autotune run --recipe' launches its recipe, and 'autotune tune "
                         f"--resume {run_dir.name} --confirm-rounds N' adds N rounds to its "
                         f"confirmation")
    earlier = earlier_rounds(read_events(run_dir)[0])
    if earlier is None or len(earlier.entries) < 2:
        raise UsageError(f"--resume --confirm-rounds: the tuning in {run_dir} confirmed no "
                         f"config against the baseline, so there is no confirmation to extend")
    return earlier


def check_recipe_dir(path: str) -> Path:
    """The recipe's directory, or its nearest existing parent, must be a directory we may
    write in: checked before any probe, so a finished search is never lost to it."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    if not p.is_dir() or not os.access(p, os.W_OK | os.X_OK):
        raise UsageError(f"--recipe-dir {path}: {p} is "
                         f"{'not a directory' if not p.is_dir() else 'not writable'}")
    return Path(path)


def _summary(run_dir: Path) -> dict:
    """The run's ``summary.json`` (it names the recipe once that is saved), or {}."""
    try:
        return json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return {}


def notify(note: Note) -> None:
    {NoteKind.WARNING: console.warning, NoteKind.HINT: console.hint}.get(
        note.kind, lambda m: print(f"autotune: {m}", file=sys.stderr, flush=True))(note.text)


def start_journal(prep: Prepared) -> None:
    s, saved = prep.settings, prep.settings.to_dict()
    prep.journal.emit(Event.RUN_STARTED, kind=prep.state.kind, command=list(s.command), cwd=s.cwd,
                      budget_s=s.budget_s, trials=s.max_trials,
                      hardware=fingerprint.summary(prep.fp), resumed=prep.resume,
                      launcher=engines.describe(prep.launcher), objective=s.objective.token,
                      space={"space": saved["space_tokens"], "fix": saved["fix_tokens"]})
    controllers.mark_controller(prep.run_dir)
    detach.ready(prep.run_dir)


@contextlib.contextmanager
def ending(journal: Journal, *, quiet=None):
    """Emit ``run_ended`` with the exit code however the body ends; yields a settable status.
    ``quiet`` (`autotune.monitor.Watching.quiet`) is called first, so that nothing of this
    process is appended after ``run_ended``."""
    status = {"code": 1}
    try:
        yield status
    except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM/SIGHUP (autotune.Terminated)
        status["code"] = 128 + getattr(exc, "signum", 2)
        raise
    except AutotuneError as exc:
        status["code"] = exc.exit_code
        raise
    finally:
        if quiet is not None:
            quiet()
        try:
            journal.emit(Event.RUN_ENDED, exit_code=status["code"])
        except AutotuneError:
            if status["code"] == 0:
                raise  # else the error already on its way says it


def tune_in(prep: Prepared) -> tuple[TuneReport, recipes.Recipe, Path]:
    """Run the tuning, save the recipe; returns (report, recipe, its path)."""
    if prep.reach_note:
        notify(Note.info(prep.reach_note))
    if prep.warm_note:  # a recipe that cannot be used is a warning; one that can, news
        notify(Note.info(prep.warm_note) if prep.state.warm_start else
               Note.warning(prep.warm_note))
    report = Tuner(prep.state, prep.run_dir, prep.journal, notify=notify, resume=prep.resume,
                   launcher=prep.launcher, earlier=prep.earlier).run()
    # kept for runs on other worlds; a script that starts its own ranks has a world of its own
    recipe = build_recipe(report, prep, global_batch=None if report.space.own_ranks
                          else prep.settings.global_batch)
    try:
        path = recipes.save(recipe, prep.recipe_dir)
    except OSError as exc:
        raise rundir.write_error(prep.recipe_dir, f"{exc.strerror or exc}; the tuning is kept: "
                                 f"autotune {prep.state.kind} --resume {prep.run_dir} "
                                 f"--recipe-dir DIR saves it") from None
    prep.journal.emit(Event.RECIPE_SAVED, path=str(path))
    states.write_summary(prep.run_dir, report, path)
    return report, recipe, path


def build_recipe(report: TuneReport, prep: Prepared,
                 global_batch: int | None = None) -> recipes.Recipe:
    target = prep.target
    return recipes.Recipe(
        name=recipes.recipe_name(target[0], prep.fp), knobs=dict(report.best.knobs),
        samples_per_s=report.best.samples_per_s, ci_half=report.best.ci_half,
        baseline_samples_per_s=report.baseline.samples_per_s,
        baseline_ci_half=report.baseline.ci_half, baseline_knobs=dict(report.baseline.knobs),
        speedup=report.speedup, kept_baseline=report.kept_baseline, fingerprint=prep.fp,
        script_path=target[0], script_args=tuple(target[1:]), trials=report.trials_measured,
        source=report.source, reason=report.reason,
        verdict=report.verdict.to_dict() if report.verdict else None,
        global_batch=global_batch, notes=report.best_notes,
        breakdown=report.best_breakdown.rounded_shares() if report.best_breakdown else None,
        batch_note=report.batch_note,
        payback_note=report.payback.text() if report.payback else "",
        core_s_per_sample=report.best_probe.core_s_per_sample if report.best_probe else 0.0,
        gpu_s_per_sample=report.best_probe.gpu_s_per_sample if report.best_probe else 0.0,
        speedup_low=None if report.kept_baseline else report.speedup_low,
        speedup_high=None if report.kept_baseline else report.speedup_high,
        objective=report.objective, objective_parts=objective_parts(report),
        keep_batch=report.keep_batch, tuned_on=report.tuned_on)


def _front_line(report: TuneReport, p: objective.Point) -> str:
    return ("* " if p.name == report.picked else "  ") + objective.front_line(p)


def objective_parts(report: TuneReport) -> dict | None:
    """The recipe's [objective] table beyond its name (None for throughput)."""
    if not report.scored:
        return None
    best, base = report.best_score, report.baseline_score
    return {"note": report.objective_note, "score": best.value if best else None,
            "efficiency": best.efficiency if best else None,
            "noise_scale": best.noise_scale if best else None,
            "j_per_sample": best.j_per_sample if best else None,
            "samples_per_j": best.samples_per_j if best else None,
            "baseline_j_per_sample": base.j_per_sample if base else None,
            "front": [_front_line(report, p) for p in report.pareto]}


def summary(report: TuneReport, recipe_path: Path) -> dict:
    """What ``summary.json`` holds once the recipe is saved (``--json`` prints it)."""
    return report.to_dict(recipe_path)


def print_summary(report: TuneReport, recipe_path: Path, *, plain: bool) -> None:
    out = console.make_console(plain=plain)
    table = console.Table(title="autotune tune", show_lines=False)
    for col in ("", "knobs", "samples/s", "± 95% CI", "cost per sample"):
        table.add_column(col, justify="right" if col.startswith(("s", "±", "c")) else "left")
    rows = [("baseline", report.baseline, report.baseline_probe),
            ("best", report.best, report.best_probe)]
    keep = report.keep_batch
    if keep is not None:  # the winner changes the job's batch: the one that keeps it, too
        rows.append(("keeps batch", keep, None))
    for label, s, facts in rows:
        table.add_row(label, space.knobs_text(s.knobs), f"{s.samples_per_s:.1f}",
                      f"{s.ci_half:.1f}",
                      cost_text(facts.core_s_per_sample, facts.gpu_s_per_sample)
                      if facts else "-")
    out.print(table)
    out.print(f"{_gain_label(report.objective)}: {_claim(report)} — {report.reason}")
    if keep is not None:
        out.print("keeping the script's global batch ('autotune run --recipe ... "
                  "--keep-batch'): "
                  + (f"{claim_text(keep.speedup, keep.speedup_low, keep.speedup_high)} with "
                     f"{space.knobs_text(keep.knobs)}" if not keep.kept_baseline else
                     "the script's defaults") + f" — {keep.reason}")
    for line in objective_lines(report):
        out.print(line)
    eff = report.scaling_efficiency
    if eff is not None:
        n = int(report.best.knobs.get("instances", 1))
        out.print(f"scaling: {n} ranks give {n * eff:.2f}x the best one-rank throughput "
                  f"({report.one_rank_samples_per_s:.1f} samples/s): {eff:.0%} efficiency")
    for label, facts in (("baseline", report.baseline_probe), ("best", report.best_probe)):
        if facts is not None and facts.energy is not None:
            out.print(f"energy per sample ({label}): {facts.energy.describe()}")
    if report.memory:
        out.print(f"memory: {report.memory.text}")
    if report.batch_note:
        out.print(f"batch: {report.batch_note}")
    if report.payback:
        out.print(f"payback: {report.payback.text()}")
    if report.process_noise:
        out.print(f"noise: {report.process_noise.text()}")
    stop = report.stop_reason.text if report.stop_reason else "the study ended"
    out.print(f"trials: {report.trials_measured} measured ({report.trials_total} in the study); "
              f"stopped: {stop}")
    if report.verdict:
        out.print(f"verdict: {report.verdict.text}")
    for label, b in (("baseline", report.baseline_breakdown), ("best", report.best_breakdown)):
        if b is not None:
            out.print(f"where the time goes ({label}): {b.describe()}")
    # paths whole, never folded at the console's width: a terminal wraps them for the eye,
    # and a copy of the line is still the path
    out.print(f"recipe: {recipe_path}", soft_wrap=True)
    out.print(f"run directory: {report.run_dir}", soft_wrap=True)


def _gain_label(token: str) -> str:
    """What ``speedup`` measures under an objective."""
    return {"goodput": "goodput gain", "energy": "energy gain (samples/J)"}.get(token, "speedup")


def objective_lines(report: TuneReport) -> list[str]:
    """The objective, the winner's score parts, and the Pareto front, for the summary."""
    if not report.scored:
        return []
    out = [f"objective: {report.objective}"]
    for label, sc in (("baseline", report.baseline_score), ("best", report.best_score)):
        if not sc:
            continue
        parts = [f"{sc.samples_per_s:.1f} samples/s"]
        if sc.efficiency is not None:
            parts.append(f"efficiency {sc.efficiency:.3f} (B_noise {sc.noise_scale:.4g})"
                         f" -> goodput {sc.value:.1f}")
        if sc.j_per_sample is not None:
            parts.append(f"{sc.j_per_sample:.3g} J/sample ({sc.samples_per_j:.3g} "
                         f"samples/J)")
        out.append(f"score ({label}): {', '.join(parts)}")
    if report.objective_note:
        out.append(report.objective_note)
    if report.pareto:
        out.append(f"Pareto front ({len(report.pareto)}; * the pick: the fastest within "
                   f"{objective.PICK_WITHIN_REL:.0%} of the best samples/J):")
        out.extend("  " + _front_line(report, p) for p in report.pareto)
    return out


def _claim(report: TuneReport) -> str:
    """The speed-up as claimed: its interval as measured, never rounded up
    (`decision.claim_text`); for a kept baseline, 1x."""
    if report.kept_baseline or not math.isfinite(report.speedup_high):
        return "1x (the script's defaults kept)" if report.kept_baseline else \
            f"{report.speedup:.3f}x"
    return claim_text(report.speedup, report.speedup_low, report.speedup_high)


def run(args) -> int:
    from autotune.monitor import watch

    prep = prepare(args, RunKind.TUNE)
    start_journal(prep)
    try:
        with watch(prep.run_dir, plain=args.plain or args.json,
                   title=f"autotune tune · {os.path.basename(prep.target[0])}") as watching, \
                ending(prep.journal, quiet=watching.quiet) as status:
            report, _recipe, path = tune_in(prep)
            status["code"] = 0
    except KeyboardInterrupt:
        console.hint(f"resume with: autotune tune --resume {prep.run_dir}")
        raise
    if args.json:
        print(jsontext.dumps(summary(report, path)))
    else:
        print_summary(report, path, plain=args.plain)
    return 0
