"""The one place Optuna enters: the study of a tuning run, its sampler, pruner and recovery.

One study per run, maximising each config's score (`autotune.tuning.objective`: samples/s by
default), or samples/s and samples/J together in a multi-objective study, which is not pruned
(Optuna's ``Trial.report`` refuses multi-objective trials). Storage is SQLite in the run directory unless the user
gives any Optuna storage URL (several tuners may share one, e.g. PostgreSQL). Trial parameters
are each knob's *position* in its ordered candidate list (`autotune.tuning.space`), so TPE sees the order
of uneven values like batch sizes; the knob values themselves are in ``user_attrs["knobs"]``.
What a trial records beside its value goes through one typed record, its schema checked on
write and read (`autotune.tuning.trial_attrs.TrialAttrs`: `write`, `attrs_of`).

Every trial records its `Outcome` in ``user_attrs["outcome"]``, the value itself, whatever it is
(`record_outcome`; read back by `outcome_of`, equal); a config not tried because a known OOM rules
it out records OOM with ``user_attrs["not_tried"]``. Trials that ran out of memory or failed are
completed with value 0 and a positive constraint named after their outcome
(``trial.set_constraint``), which TPE treats as infeasible. A study left with a RUNNING trial by a
controller that was killed is recovered by `open_study`: the trial is marked FAIL and its
parameters are queued again ahead of the queue, so it is re-run first and no finished trial is
lost or repeated.
`importances` reads a stored study back for the report: which knob mattered.
"""

from __future__ import annotations

import logging
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import optuna
import sqlalchemy.exc
from optuna.pruners import BasePruner
from optuna.trial import FrozenTrial, Trial, TrialState

from autotune import AutotuneError, UsageError
from autotune.tuning import search_rules
from autotune.measuring.outcome import Outcome
from autotune.tuning.trial_attrs import LEGACY_OUTCOMES, TrialAttrs

__all__ = ["StudyHandle", "IntervalPruner", "Trial", "FrozenTrial", "TrialState", "TrialPruned",
           "open_study", "sqlite_url", "comparable", "best_comparable", "best_floor",
           "importances", "record_outcome", "outcome_attrs", "outcome_of", "not_tried",
           "TrialAttrs", "attrs_of", "write", "LEGACY_OUTCOMES"]

TrialPruned = optuna.TrialPruned

optuna.logging.set_verbosity(optuna.logging.ERROR)
logging.getLogger("alembic").setLevel(logging.WARNING)
log = logging.getLogger(__name__)


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{Path(path).resolve()}"


def comparable(t: FrozenTrial) -> bool:
    """A finished trial whose throughput counts: complete, feasible, measured cleanly."""
    outcome = outcome_of(t)
    return (t.state == TrialState.COMPLETE and outcome is not None and outcome.usable
            and all(v <= 0 for v in t.constraints.values()) and t.values is not None)


def write(trial: Trial, attrs: TrialAttrs) -> None:
    """Record ``attrs`` (the fields given, checked: `TrialAttrs.to_attrs`) in a live trial."""
    for key, value in attrs.to_attrs().items():
        trial.set_user_attr(key, value)


def attrs_of(t: FrozenTrial) -> TrialAttrs:
    """What a trial recorded (`TrialAttrs.of`)."""
    return TrialAttrs.of(t.user_attrs)


def outcome_attrs(outcome: Outcome, *, not_tried: bool = False) -> TrialAttrs:
    """The attrs that record ``outcome`` (``not_tried``: a known OOM ruled it out)."""
    return TrialAttrs(outcome=Outcome(outcome), not_tried=not_tried)


def record_outcome(trial: Trial, outcome: Outcome, *, not_tried: bool = False) -> None:
    """Record ``outcome`` in a live trial; an infeasible one (an OOM, a failure) also gets a
    positive constraint of its name. A pruned or spoiled trial ends otherwise (pruned, FAIL)."""
    write(trial, outcome_attrs(outcome, not_tried=not_tried))
    if not (Outcome(outcome).usable or outcome in (Outcome.PRUNED, Outcome.FOREIGN_LOAD)):
        trial.set_constraint(outcome.value, 1.0)


def outcome_of(t: FrozenTrial) -> Outcome | None:
    """The `Outcome` a trial recorded; None when it recorded none (still running, enqueued).
    A legacy tag is read as `LEGACY_OUTCOMES` says."""
    return attrs_of(t).outcome


def not_tried(t: FrozenTrial) -> bool:
    """The trial answered without a probe: a known OOM ruled its config out."""
    return attrs_of(t).not_tried


def best_comparable(trials: list[FrozenTrial]) -> FrozenTrial | None:
    ok = [t for t in trials if comparable(t)]
    return max(ok, key=lambda t: t.values[0], default=None)


def best_floor(trials: list[FrozenTrial], revised: Mapping[int, float] | None = None
               ) -> float | None:
    """The highest lower end of a comparable trial's interval: what a probe must be able to
    reach. A lucky high reading with a wide (or unknown) interval sets no bar. The interval is
    the score's (``score_ci_half``: goodput scales it with the value), else the throughput's.
    ``revised``: trial number -> a lower end measured since (a trial's value is immutable)."""
    floors = []
    revised = revised or {}
    for t in trials:
        if t.number in revised:
            floors.append(revised[t.number])
        elif comparable(t):
            attrs = attrs_of(t)
            ci = attrs.score_ci_half if attrs.score_ci_half is not None else attrs.ci_half
            if ci is not None and ci == ci and ci != float("inf"):
                floors.append(t.values[0] - ci)  # a two-objective study: its samples/s
    return max(floors, default=None)


class IntervalPruner(BasePruner):
    """Prunes a probe whose interval cannot reach the best comparable trial's interval.

    Optuna hands pruners the reported values only; the interval of each report comes through
    `observe`, called just before ``trial.report``.
    """

    def __init__(self, *, margin_rel: float = search_rules.PRUNE_MARGIN_REL, min_measure_s: float = 2.0):
        self.margin_rel = margin_rel
        self.min_measure_s = min_measure_s
        self._latest: dict[int, tuple[float, float]] = {}  # number -> (ci_half, measured_s)
        # number -> the lower end of its interval as measured since (`best_floor`)
        self.revised: dict[int, float] = {}

    def observe(self, number: int, ci_half: float, measured_s: float) -> None:
        self._latest[number] = (ci_half, measured_s)

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        step = trial.last_step
        if step is None or trial.number not in self._latest:
            return False
        ci_half, measured_s = self._latest[trial.number]
        if measured_s < self.min_measure_s:
            return False
        floor = best_floor(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)),
                           self.revised)
        return search_rules.cannot_reach(trial.intermediate_values[step], ci_half, floor,
                                   margin_rel=self.margin_rel)


@dataclass
class StudyHandle:
    """The live study plus what `open_study` found on the way."""

    study: optuna.Study
    url: str
    name: str
    pruner: IntervalPruner
    prunes: bool = True  # False: a multi-objective or energy study, never pruned
    recovered: list[int] = field(default_factory=list)  # numbers of interrupted trials re-queued

    def trials(self, states=None) -> list[FrozenTrial]:
        return self.study.get_trials(deepcopy=False, states=states)

    def fixed_params(self, t: FrozenTrial) -> dict:
        """A trial's parameters: suggested, else the ones it was enqueued with (known from its
        start, before its objective suggests them)."""
        return dict(t.params) or dict(t.system_attrs.get("fixed_params") or {})

    def fail_stale(self) -> None:
        """Fail the trials whose tuner stopped beating (killed), so a waiter is not held."""
        optuna.storages.fail_stale_trials(self.study)

    def enqueue(self, params: dict, attrs: TrialAttrs | None = None) -> None:
        self.study.enqueue_trial(params, user_attrs=attrs.to_attrs() if attrs else None,
                                 skip_if_exists=False)

    def add_answered(self, params: dict[str, int], sizes: dict[str, int],
                     value: float | list[float], attrs: TrialAttrs) -> None:
        """A config measured outside the study (the two-rank probe of the baseline stage) as a
        finished trial: ``params`` are candidate positions, ``sizes`` each knob's number of
        candidates (the distributions the objective suggests from)."""
        self.study.add_trial(optuna.trial.create_trial(
            params=params, user_attrs=attrs.to_attrs(),
            **({"values": value} if isinstance(value, list) else {"value": value}),
            distributions={n: optuna.distributions.IntDistribution(0, sizes[n] - 1)
                           for n in params}))

    def optimize(self, objective: Callable[[Trial], float],
                 callbacks: list[Callable[[optuna.Study, FrozenTrial], None]]) -> None:
        """Run trials until a callback stops the study. A storage that fails (disk full) is one
        line, whatever Optuna made of it (its ``assert`` included); a trial it left RUNNING is
        retried by ``--resume``."""
        try:
            self.study.optimize(objective, callbacks=callbacks, gc_after_trial=False,
                                catch=(NotComparable,))
        except (optuna.exceptions.StorageInternalError, sqlalchemy.exc.SQLAlchemyError,
                AssertionError) as exc:
            ours = exc.__context__
            while ours is not None and not isinstance(ours, AutotuneError):
                ours = ours.__context__
            raise ours or failure(f"cannot write the study {self.url}", exc) from None

    def stop(self) -> None:
        self.study.stop()


class NotComparable(Exception):
    """Raised by an objective for a probe taken under foreign load: the trial becomes FAIL."""


def failure(what: str, exc: BaseException) -> AutotuneError:
    """A storage error as one line: ``what`` and the cause, found down the exception chain
    (SQLite's 'database or disk is full' is a disk full, not a bad storage)."""
    chain = [exc]
    while len(chain) < 8 and (chain[-1].__cause__ or chain[-1].__context__) is not None:
        chain.append(chain[-1].__cause__ or chain[-1].__context__)
    text = " ".join(map(str, chain)).lower()
    cause = "disk full" if "disk is full" in text or "no space left" in text else \
        "permission denied" if "readonly" in text or "permission denied" in text else \
        next((str(e) for e in reversed(chain) if str(e)), type(exc).__name__).splitlines()[0]
    return AutotuneError(f"{what}: {cause}")


# Several tuners on one storage: a trial whose tuner died (SIGKILL, a lost host) stops beating;
# once its heartbeat is GRACE_S old, the next trial any tuner starts fails it and queues its
# config once more (one retry), for whichever tuner asks next. A beat every 5 s is one UPDATE;
# the grace of three beats rides out a loaded host or a slow database without failing a live
# trial. Optuna wants whole seconds.
HEARTBEAT_S = 5
GRACE_S = 15


def _quiet_storage_threads() -> None:
    """Optuna beats the heartbeat on a thread of its own; when the storage fails under it (disk
    full, the server gone) the main thread meets the same failure and says it in one line, so
    the thread's traceback is only noise. Other threads' errors are reported as ever."""
    if getattr(threading.excepthook, "autotune_quiet", False):
        return
    previous = threading.excepthook

    def hook(args):
        if isinstance(args.exc_value, (optuna.exceptions.StorageInternalError,
                                       sqlalchemy.exc.SQLAlchemyError)):
            log.debug("storage error on thread %s: %s", args.thread, args.exc_value)
            return
        previous(args)

    hook.autotune_quiet = True
    threading.excepthook = hook


def _storage(url: str, flag: str | None, *, tries: int = 3):
    """Open ``url``; a bad URL is blamed on ``flag`` (the user's ``--storage``), the disk never.
    Tuners starting together on an empty database race to create Optuna's tables (PostgreSQL: a
    unique violation in the loser), so a failure is tried again."""
    beat = {}
    if flag:  # a storage the user gave can be shared; the run's own SQLite file is not
        _quiet_storage_threads()
        retry = getattr(optuna.storages, "RetryHeartbeatStaleTrialCallback", None)  # >= 4.9
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            beat = {"heartbeat_interval": HEARTBEAT_S, "grace_period": GRACE_S,
                    **({"heartbeat_stale_trial_callback": retry(max_retry=1)} if retry else
                       {"failed_trial_callback":
                        optuna.storages.RetryFailedTrialCallback(max_retry=1)})}
    for attempt in range(tries):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return optuna.storages.RDBStorage(url, **beat)
        except Exception as exc:  # noqa: BLE001 - sqlalchemy raises many kinds; all mean the same
            if attempt + 1 < tries:
                time.sleep(0.5 * (attempt + 1))
                continue
            err = failure(f"cannot open the study {url!r}", exc)
            if flag and not str(err).endswith(("disk full", "permission denied")):
                raise UsageError(f"{flag}: {err}") from None
            raise err from None


def _fail_interrupted(storage, name: str, run_id: str) -> list[FrozenTrial]:
    """Mark this run's RUNNING trials FAIL (their controller is gone); return them."""
    try:
        study_id = storage.get_study_id_from_name(name)
    except KeyError:
        return []
    running = [t for t in storage.get_all_trials(study_id, deepcopy=False,
                                                 states=(TrialState.RUNNING,))
               if attrs_of(t).run == run_id]
    for t in running:
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, t.number)
        for key, value in TrialAttrs(interrupted=True).to_attrs().items():
            storage.set_trial_user_attr(trial_id, key, value)
        storage.set_trial_state_values(trial_id, TrialState.FAIL)
    return running


def open_study(url: str, name: str, *, run_id: str, seed: int | None = None,
               n_startup_trials: int = 4, min_measure_s: float = 2.0,
               requeue: bool = False, must_exist: bool = False,
               flag: str | None = None, objectives: int = 1,
               prune: bool = True) -> StudyHandle:
    """Create or load the study; with ``requeue``, re-queue this run's interrupted trials, to
    run before anything queued earlier. ``must_exist``: a study that is not there is an error,
    never a new one. ``flag`` is blamed for a URL that cannot be opened. ``objectives``: how
    many values each trial returns, all maximised; ``prune``: False turns pruning off (a
    multi-objective study must).

    ``run_id`` tags trials (``user_attrs["run"]``) so a resumed run touches only its own
    RUNNING trials, never those of another tuner sharing the storage.
    """
    file = Path(url[len("sqlite:///"):]) if url.startswith("sqlite:///") else None
    if must_exist and file and (not file.is_file() or not file.stat().st_size):
        raise UsageError(f"--resume: {file} is empty or missing, not the run's study: its "
                         f"finished trials are gone; start a new run")
    storage = _storage(url, flag)
    if must_exist and name not in {s.study_name for s in storage.get_all_studies()}:
        raise UsageError(f"--resume: {url} holds no study {name!r}: the run's finished trials "
                         f"are gone; start a new run")
    interrupted = _fail_interrupted(storage, name, run_id) if requeue else []
    pruner = IntervalPruner(min_measure_s=min_measure_s)
    prune = prune and objectives == 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        sampler = optuna.samplers.TPESampler(multivariate=True, n_startup_trials=n_startup_trials,
                                             seed=seed)
    study = optuna.create_study(storage=storage, study_name=name,
                                directions=["maximize"] * objectives, sampler=sampler,
                                pruner=pruner if prune else optuna.pruners.NopPruner(),
                                load_if_exists=True)
    handle = StudyHandle(study=study, url=url, name=name, pruner=pruner, prunes=prune)
    if requeue:
        # Also trials stopped by Ctrl-C: optimize() marks those FAIL, the objective tags them.
        stopped = [t for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
                   if attrs_of(t).run == run_id and attrs_of(t).interrupted]
        retried = {attrs_of(t).retry_of for t in study.get_trials(deepcopy=False)}
        waiting = study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
        queue = [(t.system_attrs.get("fixed_params", {}), t.user_attrs) for t in waiting]
        for t in {t.number: t for t in [*interrupted, *stopped]}.values():
            if t.number in retried or not t.params:
                continue
            queue.insert(len(handle.recovered),
                         (dict(t.params), TrialAttrs(retry_of=t.number).to_attrs()))
            handle.recovered.append(t.number)
        _requeue(storage, storage.get_study_id_from_name(name), waiting, queue)
        for params, attrs in queue[len(waiting):]:  # as they were recorded
            study.enqueue_trial(params, user_attrs=dict(attrs), skip_if_exists=False)
    return handle


def _requeue(storage, study_id: int, waiting: list[FrozenTrial],
             queue: list[tuple[dict, dict]]) -> None:
    """Give the waiting trials (run in number order) the first entries of ``queue``."""
    for t, (params, attrs) in zip(waiting, queue):
        if (params, attrs) == (t.system_attrs.get("fixed_params", {}), t.user_attrs):
            continue
        trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, t.number)
        storage.set_trial_system_attr(trial_id, "fixed_params", params)
        for key in {*t.user_attrs, *attrs}:
            storage.set_trial_user_attr(trial_id, key, attrs.get(key))


def importances(url: str, *, min_trials: int) -> tuple[dict[str, float], str]:
    """(importance by parameter, how it was computed) of the storage's largest study; ({}, why
    not) when it holds fewer than ``min_trials`` complete trials or Optuna cannot compute it.
    fANOVA (Optuna's default) needs scikit-learn; PED-ANOVA, where Optuna has it, does not."""
    summaries = optuna.study.get_all_study_summaries(storage=url)
    if not summaries:
        return {}, "study.db holds no study"
    name = max(summaries, key=lambda s: s.n_trials).study_name
    study = optuna.load_study(study_name=name, storage=url)
    done = [t for t in study.trials if t.state == TrialState.COMPLETE]
    if len(done) < min_trials:
        return {}, f"only {len(done)} complete trials in the study"
    ped = getattr(optuna.importance, "PedAnovaImportanceEvaluator", None)
    # a multi-objective study (throughput,energy): importance for its first value, samples/s
    target = (lambda t: t.values[0]) if len(study.directions) > 1 else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for evaluator in (None, ped() if ped is not None else None):
            try:
                imp = optuna.importance.get_param_importances(study, evaluator=evaluator,
                                                              target=target)
            except ImportError:  # fANOVA needs scikit-learn
                continue
            if imp:
                kind = type(evaluator).__name__ if evaluator else "fANOVA"
                return {k: float(v) for k, v in imp.items()}, f"Optuna {kind}"
    return {}, "Optuna could not compute importances"
