"""``autotune run --recipe PATH SCRIPT [ARGS]``: the full run with a saved recipe's knobs."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from autotune.monitor import console
from autotune.hardware import fingerprint
from autotune.tuning import recipes
from autotune.tuning.space import knobs_text
from autotune.store import rundir
from autotune.measuring import fullrun
from autotune.measuring.promise import Promise
from autotune.launching import engines, reach
from autotune import UsageError
from autotune.commands import common, detach, tune
from autotune.store import controller as controllers
from autotune.tuning.state import check_not_running, load_state
from autotune.launching.group import RanksSpec
from autotune.store.journal import Journal, read_events
from autotune.store.events import Event, RunKind


def add_parser(sub):
    p = sub.add_parser("run", help="launch the script with a saved recipe",
                       description="Launch the script with a recipe's knobs, stream its "
                                   "output, forward Ctrl-C and SIGTERM to every rank, and exit "
                                   "with its exit code. Throughput is still metered into the "
                                   "run's journal (autotune monitor shows it).")
    p.add_argument("--recipe", metavar="PATH",
                   help="the recipe (.toml) to apply; see 'autotune recipes list'")
    p.add_argument("--again", metavar="RUN",
                   help="start a stopped, failed or lost full run (of 'run' or 'wrap') again: "
                        "its id (or a unique prefix) or directory; same recipe, command, "
                        "directory, launcher, --keep-batch and --samples-per-step, with any "
                        "ARGS given added to the script's (its own resume "
                        "flag, say: autotune run --again RUN -- --resume ckpt.pt)")
    p.add_argument("--keep-batch", action="store_true",
                   help="run the recipe's fastest config that keeps the script's global batch "
                        "(its [keep_batch], when its winner changes the batch) instead of the "
                        "fastest")
    p.add_argument("--runs-dir", metavar="DIR",
                   help="where run directories go (default: $AUTOTUNE_RUNS_DIR or "
                        "~/.autotune/runs)")
    p.add_argument("--samples-per-step", type=int, metavar="N",
                   help="samples in one optimizer step, for scripts without a DataLoader")
    p.add_argument("--plain", action="store_true", help="plain log lines, no live display")
    engines.add_launcher_args(p)
    detach.add_detach_arg(p)
    common.add_script_args(p)
    return p


def fingerprint_warnings(recipe: recipes.Recipe, fp: fingerprint.Fingerprint) -> list[str]:
    """What differs between this run and the one the recipe was tuned on (warnings, not errors)."""
    out = []
    hard = fingerprint.diff(fp, recipe.fingerprint, fields=(
        *fingerprint.HARDWARE, *fingerprint.SOFTWARE, *fingerprint.SCRIPT))
    if hard:
        out.append(f"recipe {recipe.path} was tuned under other conditions "
                   f"({fingerprint.describe(hard)}); its knobs may not be the best here "
                   f"('autotune tune' re-tunes)")
    return out


@dataclass(frozen=True)
class Again:
    """A full run to start again (``--again``): where it was, and what it ran."""

    run_dir: Path
    recipe: str
    target: tuple[str, ...]
    cwd: str
    settings: Mapping[str, object]  # the full run's own (`RunSettings.journaled`)


@dataclass(frozen=True)
class RunSettings:
    """How a full run was started, beside its recipe and command: what ``--again`` starts it
    with again unless told otherwise."""

    launcher: str | None = None  # the launcher's kind, as resolved
    hostfile: str | None = None  # its absolute path
    keep_batch: bool = False
    samples_per_step: int | None = None

    @classmethod
    def of(cls, launcher: engines.Launcher, *, keep_batch: bool,
           samples_per_step: int | None) -> RunSettings:
        return cls(launcher.kind.value, launcher.hostfile, keep_batch, samples_per_step)

    def journaled(self) -> dict[str, object]:
        return dataclasses.asdict(self)

    @classmethod
    def read(cls, journaled: Mapping[str, object]) -> RunSettings:
        """From a journal: what it holds of them (a run journaled before them, none)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in journaled.items() if k in names})

    def over(self, args) -> RunSettings:
        """These settings with what ``args`` gives again in their place (a launcher, with its
        hostfile or none, replaces both)."""
        launcher, hostfile = (args.launcher, args.hostfile) if args.launcher or args.hostfile \
            else (self.launcher, self.hostfile)
        return RunSettings(launcher, hostfile, bool(args.keep_batch or self.keep_batch),
                           args.samples_per_step or self.samples_per_step)


def again_of(args) -> Again:
    """The run ``--again`` names, its recipe, command (with the ARGS given added) and cwd; a
    `UsageError` for a run that is not a full run, or one still controlled."""
    root = Path(args.runs_dir).expanduser() if args.runs_dir else None
    old = rundir.resolve(args.again, root)
    if args.recipe:
        raise UsageError("--again runs the run's own recipe; drop --recipe")
    check_not_running(old, "--again")
    events = read_events(old)[0]
    started = next((e for e in events if e["event"] == Event.RUN_STARTED), None)
    kind = (started or {}).get("kind")
    if kind not in ("run", "wrap"):
        raise UsageError(f"--again: {old.name} is a {kind or 'unknown'} run, not a full run; "
                         f"'autotune tune --resume {old.name}' continues a tuning")
    fullrun = [e for e in events if e["event"] == Event.FULLRUN_STARTED]
    saved = [e["path"] for e in events if e["event"] == Event.RECIPE_SAVED]
    recipe = started.get("recipe") if kind == "run" else (saved[-1] if saved else None)
    if not recipe or not fullrun:
        raise UsageError(f"--again: {old.name} never started its full run (no recipe or no "
                         f"full run in its journal); 'autotune wrap --resume {old.name}' "
                         f"continues its tuning")
    extra = list(args.target or [])
    extra = extra[1:] if extra[:1] == ["--"] else extra
    cwd = started.get("cwd") if kind == "run" else load_state(old).run_cwd
    return Again(old, str(recipe), (*fullrun[-1]["command"], *extra), str(cwd),
                 dict(fullrun[-1].get("settings") or {}))


def run(args) -> int:
    from autotune.monitor import watch

    again = again_of(args) if args.again else None
    if again is None and not args.recipe:
        raise UsageError("autotune run needs --recipe PATH (or --again RUN): see 'autotune "
                         "recipes list'")
    if again:
        settings = RunSettings.read(again.settings).over(args)
        launcher = engines.resolve(settings.launcher, settings.hostfile)
    else:
        launcher = engines.from_args(args)
        settings = RunSettings.of(launcher, keep_batch=args.keep_batch,
                                  samples_per_step=args.samples_per_step)
    recipe = chosen(recipes.load(again.recipe if again else args.recipe),
                    keep_batch=settings.keep_batch)
    target = again.target if again else common.resolve_target(args)
    cwd = again.cwd if again else os.getcwd()
    fp = fingerprint.current(target)
    for warning in fingerprint_warnings(recipe, fp):
        console.warning(warning)
    knobs = rank_knobs(recipe, fp, launcher)
    launcher, reached = reach.settle(launcher)  # once the recipe fits this run
    if reached:
        print(f"autotune: {reached.text()}", file=sys.stderr, flush=True)
    root = Path(args.runs_dir).expanduser() if args.runs_dir else \
        (again.run_dir.parent if again else None)
    run_dir = rundir.new_run_dir("run", target[0], root=root)
    journal = Journal(run_dir)
    journal.emit(Event.RUN_STARTED, kind=RunKind.RUN, command=list(target), cwd=cwd,
                 hardware=fingerprint.summary(fp), recipe=str(recipe.path),
                 launcher=engines.describe(launcher),
                 **({"again_of": again.run_dir.name} if again else {}))
    if again:
        Journal(again.run_dir).emit(Event.RUN_AGAIN, run=run_dir.name)
        console.hint(f"run {again.run_dir.name} started again as {run_dir.name}: "
                     f"{' '.join(target)}")
    controllers.mark_controller(run_dir)
    detach.ready(run_dir)
    with watch(run_dir, plain=args.plain,
               title=f"autotune run · {os.path.basename(target[0])}") as watching, \
            tune.ending(journal, quiet=watching.quiet) as status:
        status["code"] = full_run(recipe, target, knobs, launcher=launcher, cwd=cwd,
                                  run_dir=run_dir, journal=journal,
                                  samples_per_step=settings.samples_per_step, fp=fp,
                                  keep_batch=settings.keep_batch)
    return said(status["code"], run_dir)


def chosen(recipe: recipes.Recipe, *, keep_batch: bool) -> recipes.Recipe:
    """The recipe as the run uses it: its fastest config, or with ``keep_batch`` the one that
    keeps the script's global batch (`Recipe.keeping_batch`: a recipe whose knobs keep it
    already is run as it is, and said so; one that changes it and holds no alternative is a
    `RecipeError`, exit 2)."""
    if not keep_batch:
        return recipe
    kept = recipe.keeping_batch()
    if kept is recipe:
        console.hint(f"--keep-batch: recipe {recipe.path}'s knobs keep the script's global "
                     f"batch already; running them")
    else:
        console.hint(f"--keep-batch: running the recipe's config that keeps the script's "
                     f"global batch: {knobs_text(kept.knobs)}"
                     + (" (the script's defaults: nothing that keeps it was faster beyond "
                        "doubt)" if kept.kept_baseline else ""))
    return kept


def rank_knobs(recipe: recipes.Recipe, fp: fingerprint.Fingerprint,
               launcher: engines.Launcher, *, told: bool = False) -> tuple[dict[str, float], int]:
    """The recipe's knobs for the ranks of a run on the visible GPUs (``fp.gpu_count``) of
    ``launcher``'s hosts, and ``instances``; a `RecipeError` before anything starts.

    ``told``: the tuning that made the recipe has just said what its notes and batch change
    say (``wrap``), so they are not said again."""
    knobs, instances = recipe.run_knobs(fp.cores, fp.gpu_count, hosts=launcher.host_count)
    for line in node_change(recipe, knobs, instances, hosts=launcher.host_count,
                            gpus=fp.gpu_count):
        console.warning(line)
    for note in () if told else recipe.notes:  # what its probes said: a backend replaced
        console.hint(f"recipe: {note}")
    if recipe.batch_note and not recipe.global_batch and not told:
        console.warning(f"recipe: {recipe.batch_note}")
    if recipe.global_batch and knobs.get("batch_size") != recipe.knobs.get("batch_size"):
        console.hint(f"the recipe's global batch of {recipe.global_batch} is kept: "
                     f"batch_size={knobs['batch_size']} per rank on this run's "
                     f"{recipe.global_batch // knobs['batch_size']} ranks (the recipe has "
                     f"{recipe.knobs.get('batch_size')} for the world it was tuned on)")
    return knobs, instances


def node_change(recipe: recipes.Recipe, knobs: dict[str, float], instances: int, *,
                hosts: int, gpus: int) -> list[str]:
    """What a run on another number of nodes than the recipe was tuned on should know: the
    per-node knobs carry over; the job's global batch changes with the nodes (unless the recipe
    keeps one, `Recipe.run_knobs`); a fusion bucket was tuned for the link it was measured on."""
    tuned = recipe.tuned_on.nodes
    if hosts == tuned:
        return []
    link = recipe.tuned_on.link or "the link between its ranks not measured"
    per_node = {k: v for k, v in knobs.items() if k in ("instances", "threads", "workers")}
    out = [f"recipe {recipe.path} was tuned on {tuned} node(s) ({link}); this run has {hosts}: "
           f"its per-node knobs carry over ({knobs_text(per_node) or 'none'})"]
    batch = knobs.get("batch_size")
    if batch and not recipe.global_batch:
        devices_then = recipe.fingerprint.gpu_count or 1
        devices_now = gpus if recipe.fingerprint.gpu_count and gpus else 1
        then = int(recipe.knobs.get("batch_size", batch)) * \
            int(recipe.knobs.get("instances", 1)) * devices_then * tuned
        now = int(batch) * instances * devices_now * hosts
        out.append(f"the job's global batch goes from {then} (as tuned) to {now} "
                   f"({int(batch)} per rank x {now // int(batch)} ranks); keep it with "
                   f"'autotune tune --global-batch {then}', or scale the learning rate with it")
    if "bucket_mb" in recipe.knobs:
        out.append(f"bucket_mb={int(recipe.knobs['bucket_mb'])} was tuned for {link}; "
                   f"{hosts} node(s) talk over another link (a bucket tuned over one host's "
                   f"loopback is not one for a network link): 'autotune tune' on these nodes "
                   f"derives it again")
    return out


def full_run(recipe: recipes.Recipe, target: tuple[str, ...],
             knobs: tuple[dict[str, float], int], *, launcher: engines.Launcher, cwd: str,
             run_dir: Path, journal: Journal, samples_per_step: int | None,
             fp: fingerprint.Fingerprint, keep_batch: bool = False) -> int:
    """The full run of ``target`` with ``knobs`` (`rank_knobs`), for ``run`` and ``wrap``,
    held against the recipe's figure where the run's world is the recipe's (`promise_of`);
    its settings journaled for ``--again`` (`RunSettings`)."""
    ranks = RanksSpec(command=target, knobs=knobs[0], instances=knobs[1], cwd=cwd,
                      log_dir=run_dir / "logs", name="fullrun", launcher=launcher, gpus=None)
    promise, why_not = promise_of(recipe, fp, knobs, launcher)
    if why_not:
        console.hint(f"the full run is not held to the recipe's figure: {why_not}")
    settings = RunSettings.of(launcher, keep_batch=keep_batch, samples_per_step=samples_per_step)
    return fullrun.run_full(fullrun.FullRunSpec(ranks=ranks, journal_knobs=dict(recipe.knobs),
                                                samples_per_step=samples_per_step,
                                                promise=promise,
                                                settings=settings.journaled()), journal)


def promise_of(recipe: recipes.Recipe, fp: fingerprint.Fingerprint,
               knobs: tuple[dict[str, float], int], launcher: engines.Launcher) \
        -> tuple[Promise | None, str]:
    """The recipe's figure as the run's promise, or why the run cannot be held to it: summed
    samples/s compare only on the world it was measured on (its ranks, one host, its batch)."""
    run_knobs, instances = knobs
    tuned = int(recipe.knobs.get("instances", 1))
    if launcher.host_count > 1:
        return None, f"it runs on {launcher.host_count} hosts; the recipe's figure is one host's"
    if instances != tuned:
        return None, f"it runs {instances} ranks a host; the recipe's figure is for {tuned}"
    batch = recipe.knobs.get("batch_size")
    if batch is not None and run_knobs.get("batch_size") not in (None, batch):
        return None, (f"its per-rank batch is {run_knobs.get('batch_size')}; the recipe's "
                      f"figure is for {batch}")
    if not recipe.samples_per_s > 0:
        return None, "the recipe has no measured figure"
    differs = fingerprint.describe(fingerprint.diff(fp, recipe.fingerprint, fields=(
        *fingerprint.HARDWARE, *fingerprint.SOFTWARE)))
    shares = {p: float(v[0]) for p, v in (recipe.breakdown or {}).items()}
    return Promise(recipe.samples_per_s, recipe.ci_half, shares, differs), ""


def said(code: int, run_dir: Path) -> int:
    """The full run's exit code, told when it is a failure; a run stopped on the signal it was
    sent (Ctrl-C, ``kill``, ``scancel``) says that, not that the script failed."""
    if code:
        log = run_dir / "logs" / "fullrun.log"
        ended = [e for e in read_events(run_dir)[0] if e["event"] == Event.FULLRUN_ENDED]
        stopped = ended[-1].get("signal") if ended else None
        if stopped:
            console.hint(f"the run stopped on {stopped}, as asked (exit code {code}); its "
                         f"output is in {log}")
        else:
            console.error(f"the script exited with code {code}; its output is in {log}")
    return code
