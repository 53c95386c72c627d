"""The baseline: the script with its own settings, probed first; the space follows from it.

What the meter saw the script use (batch size, workers, threads, torch.distributed) and its peak
memory, with the user's ranges and fixes and the script's explicit flags, give the space
(`autotune.tuning.space.build`). When that space searches ``bucket_mb``, allreduce is timed once on two
ranks of this host (`autotune.measuring.allreduce`) and the measured range narrows its candidates. All of
it goes into the run's state, so a resume does not re-measure.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence

from autotune.measuring import allreduce
from autotune.launching import engines, rank_command, script_source
from autotune.hardware import fingerprint
from autotune.tuning import fitting, space, spread
from autotune import AutotuneError, Note
from autotune.measuring.outcome import Outcome
from autotune.measuring.series import Source
from autotune.tuning.prober import Prober
from autotune.tuning.records import AllreduceTiming, BaselineRecord, RanksProbe
from autotune.tuning.state import TuneState
from autotune.store.events import Event

# One short allreduce sweep (4 KB .. 64 MB, x4 steps): a few seconds on two CPU ranks.
ALLREDUCE_MAX_BYTES = 64 * allreduce.MB
ALLREDUCE_SECONDS_PER_SIZE = 0.2
ALLREDUCE_TIMEOUT_S = 120.0
# Two ranks that trained this long without a process group train alone: the probe ends there.
ALONE_AFTER_S = 2.0
# A probe that saw too few batches is tried again with a longer window, up to this many tries
# in all: the baseline is the reference every config is compared with, and the two-rank probe
# decides whether ranks are searched; a busy machine can take a whole window's start-up.
BASELINE_TRIES = 3


def longer_window(max_s: float, first_s: float) -> float:
    """The next try's window after one that measured too little: twice the last, and at least
    the start-up the last saw (``first_s``, launch to first batch; 0 when none came) plus the
    last window again, so that a start as slow as the last still leaves a window to measure."""
    return max(2 * max_s, first_s + max_s)


def placeholder_values(args: Sequence[str], *, given: Mapping[str, int] | None = None,
                       global_batch: int | None = None,
                       devices: int = 1) -> tuple[dict[str, int], tuple[str, ...]]:
    """Values for the ``{placeholders}`` in a script's ``args`` when it runs with its own
    settings, and the names among them that were guessed.

    ``batch_size`` is a global batch divided over ``devices`` when there is one (set even
    without a placeholder: interception applies it); else a value ``given`` wins; else the
    knob's conventional value, and for ``threads`` every core this process may run on (what a
    rank gets by default, and what ``probe`` and ``tune`` alike assume).
    """
    given = dict(given or {})
    out, guessed = {}, []
    for name in sorted(rank_command.placeholders(args)):
        if name == "batch_size" and global_batch:
            out[name] = global_batch // devices
            continue
        default = fingerprint.cores() if name == "threads" else \
            space.KNOBS[space.ALIASES.get(name, name)].conventional
        out[name] = int(given.get(name, default))
        if name not in given:
            guessed.append(name)
    if global_batch:
        out["batch_size"] = global_batch // devices
    return out, tuple(guessed)


def job_devices(launcher: engines.Launcher, machine: space.Machine) -> int:
    """What the full run spreads its ranks over: every visible GPU of every host (hosts on
    CPU). A global batch is divided by ``instances`` times this."""
    return space.job_devices(machine.device, machine.gpus, launcher.host_count)


def own_world(seen: Mapping, global_batch: int | None, devices: int) -> int:
    """The world a global batch is divided by: a script that starts its own ranks has the one
    torch reported, not the ranks autotune started."""
    world = int(seen.get("world_size") or 1)
    own = space.Baseline.from_seen(seen).own_ranks
    return world if own and global_batch and world > devices else devices


def measure(prober: Prober, state: TuneState) -> TuneState:
    """Probe the script as it is; the state with the space built from what it used, and the
    baseline's answer. An allreduce timing the state holds already is not taken again."""
    settings = state.settings
    gb = settings.global_batch
    machine = fingerprint.machine()
    devices = job_devices(prober.launcher, machine)
    values, guessed = placeholder_values(settings.command[1:], given=settings.baseline_values,
                                         global_batch=gb, devices=devices)
    for name in guessed:
        state = prober.note(state, Note.hint(
            f"baseline: {{{name}}} is a placeholder, so the script's own default is unknown; "
            f"using {name}={values[name]} (set it with --baseline {name}=N)"))
    state, result, values, devices = _measured(prober, state, values, devices)
    base = space.Baseline.from_seen(
        result.seen, peak_rss_bytes=result.peak_rss_bytes,
        cuda_peak_bytes=result.cuda_peak_bytes,
        placeholder_values={space.ALIASES.get(k, k): v for k, v in values.items()
                            if k != "threads"})
    if "threads" in values:
        base = dataclasses.replace(base, threads=values["threads"])
    fixed, notes = space.explicit_fixes(settings.command[1:], settings.ranges, settings.fixed,
                                        global_batch=gb)
    for note in notes:
        state = prober.note(state, Note.hint(note))
    req = space.SpaceRequest(ranges=settings.ranges, fixed=fixed, global_batch=gb,
                             placeholders=tuple(sorted(rank_command.placeholders(
                                 settings.command[1:]))), devices=devices)
    sp = space.build(machine, base, req)
    _finished(prober, dataclasses.replace(result, knobs=dict(sp.baseline)))  # no bucket_mb
    state = _learn(prober, state, sp, result)
    state, base, ranks_probe = discover_ranks(prober, state, machine, base, req)
    sp = space.build(machine, base, req)
    saved = None
    if "bucket_mb" in sp.domains and "bucket_mb" not in req.ranges:
        saved = state.allreduce or time_allreduce(prober)
        bounds = saved.bucket_mb_range
        if bounds is not None:
            sp = space.build(dataclasses.replace(machine, bucket_mb_range=bounds), base, req)
        state = _tell_buckets(prober, state, saved, sp.domains.get("bucket_mb", ()))
    return dataclasses.replace(state, space=sp, allreduce=saved, ranks_probe=ranks_probe,
                               baseline=BaselineRecord(dict(sp.baseline), result.samples_per_s,
                                                       result.ci_half, result.source,
                                                       result.seen, result.breakdown,
                                                       result.energy, result.noise))


def _finished(prober: Prober, result) -> None:
    """Journal one baseline attempt; the last with the space's knobs."""
    prober.emit(Event.TRIAL_FINISHED, trial="baseline", number=None, mode=result.mode,
                result=result)


def _attempt(prober: Prober, state: TuneState, values: Mapping[str, int], max_s: float):
    """A probe, and on too few batches more with a longer window (`longer_window`), up to
    `BASELINE_TRIES` in all; the state, the result and the window the last try had (a
    re-measure starts from it)."""
    def probe(state, max_s):
        return prober.probe(state, prober.spec(state, values, 1, "baseline", max_s=max_s),
                            label="baseline", number=None, cfg=values, finish=False)

    state, result = probe(state, max_s)
    for _ in range(BASELINE_TRIES - 1):
        no_loader = result.source is Source.NONE and result.steps_per_s > 0  # time won't help
        if result.outcome != Outcome.NO_SIGNAL or not result.stopped or no_loader:
            break
        # Too few batches inside the window: a slow start (imports, data, ranks of its
        # own, a busy machine) or slow steps, not a broken script.
        longer = longer_window(max_s, result.first_s)
        state = prober.note(state, Note.hint(
            f"baseline: no throughput within {max_s:.0f} s ({result.reason}); trying "
            f"again with {longer:.0f} s" + (" (raise --seconds for slow starts)"
                                            if state.settings.seconds else "")))
        _finished(prober, result)
        max_s = longer
        state, result = probe(state, max_s)
    return state, result, max_s


def _measured(prober: Prober, state: TuneState, values: dict[str, int], devices: int):
    """The baseline's probe, taken again with the per-rank batch of a script that starts its
    own ranks; (state, result, values, devices) once it gave a figure. Raises `AutotuneError`
    when it gave none, or one under foreign load."""
    settings, gb = state.settings, state.settings.global_batch
    state, result, max_s = _attempt(prober, state, values,
                                    prober.spec(state, values, 1, "baseline").max_s)
    world = own_world(result.seen, gb, devices) \
        if result.ok or result.outcome == Outcome.FOREIGN_LOAD else devices
    if world != devices:
        state = prober.note(state, Note.hint(
            f"--global-batch {gb}: the script starts its own {world} ranks, so each rank's "
            f"batch is {gb // world}; measuring the baseline again with it"))
        devices, values = world, {**values, "batch_size": gb // world}
        _finished(prober, result)
        state, result, _ = _attempt(prober, state, values, max_s)
    if result.outcome == Outcome.FOREIGN_LOAD:  # re-measured by the prober, still spoiled
        _finished(prober, result)
        raise AutotuneError(
            f"the baseline probe (the script with its own settings) cannot be the reference: "
            f"{result.reason}; no recipe is saved. Tune when the machine is quiet, or pass "
            f"--foreign-limit CORES (now {settings.foreign_limit_cores:g}) to compare anyway")
    if not result.ok:
        _finished(prober, result)
        raise AutotuneError(
            f"the baseline probe (the script with its own settings) did not give a "
            f"throughput: {result.outcome.value}: {result.reason}; log: {result.log_path}"
            + (f"\n{result.log_tail}" if result.log_tail else ""))
    return state, result, values, devices


def _learn(prober: Prober, state: TuneState, sp, result) -> TuneState:
    """The state with what the baseline's probe taught: the summary's baseline facts under
    the config that names every knob, the script's timing, the first of the two processes
    the spread between processes is measured on; and the notes that say so."""
    learned = state.learned.measured(sp.baseline, result)
    timing = fitting.ScriptTiming.of(result, sp.trial_knobs(sp.baseline)[0])
    state = dataclasses.replace(state, learned=dataclasses.replace(
        learned, timing=timing, spread=spread.ProcessSpread(first=spread.Side.of(result))))
    if timing is not None:
        state = prober.note(state, Note.info(f"baseline: {timing.describe()}" + (
            "; later probes are fitted to it" if not state.settings.seconds else "")))
    parts = result.breakdown
    if parts is not None:
        state = prober.note(state, Note.info(f"baseline: where the time goes: "
                                             f"{parts.describe()}; {parts.advice()}"))
    return state


def ranks_unasked(machine: space.Machine, base: space.Baseline, req: space.SpaceRequest) -> str:
    """Why no two-rank probe is needed to learn whether the script trains data-parallel ("":
    one is). Not when the baseline ran ranks already (it saw torch.distributed, or the job
    spreads over several devices), when the user chose ``instances``, or when this host cannot
    hold two ranks of one job."""
    if base.distributed or base.own_ranks:
        return "the baseline saw torch.distributed"
    if "instances" in req.fixed or "instances" in req.ranges:
        return "instances is set by --fix/--space"
    if req.devices > 1:
        return "the baseline ran a rank on each device"
    if machine.device == "gpu" and not machine.mps:
        return f"ranks sharing a GPU need CUDA MPS: {machine.mps_why}"
    if machine.device != "gpu" and machine.cores < 2:
        return "one core holds one rank"
    if req.global_batch and req.global_batch % 2:
        return f"--global-batch {req.global_batch} is odd, so two ranks cannot split it"
    return ""


def discover_ranks(prober: Prober, state: TuneState, machine: space.Machine,
                   base: space.Baseline, req: space.SpaceRequest
                   ) -> tuple[TuneState, space.Baseline, RanksProbe | None]:
    """Whether the script trains data-parallel when started as ``torchrun --nproc_per_node 2``
    would start it, learned from a probe of two ranks: most DDP scripts start the process group
    only when launched with ``WORLD_SIZE > 1``, which a baseline of one rank (run as ``python
    train.py``) never shows.

    A script whose own source never names what starts or joins a process group
    (`autotune.launching.script_source`) is not probed: ``instances`` stays at 1 with that
    reason. Otherwise the probe is the baseline's config on two ranks, each with half the
    device. Its ranks seen joining a process group: the baseline is marked distributed
    (``instances`` and ``bucket_mb`` are searched), and the answer (`RanksProbe`) goes to the
    study as its first two-rank trial. Otherwise ``instances`` stays at 1 with the reason
    (ranks that trained alone, or how the probe failed, with its log). Returns the state with
    what the probe taught, the baseline, and the answer.
    """
    if ranks_unasked(machine, base, req):
        return state, base, None
    settings = state.settings
    never = script_source.never_parallel(settings.command, settings.cwd, os.environ)
    if never:
        prober.tell(Note.info(f"ranks: not probed on 2 ranks: {never}"))
        return state, dataclasses.replace(base, alone_why=never), None
    trying = space.build(machine, dataclasses.replace(base, distributed=True), req)
    if 2 not in trying.domains.get("instances", ()):
        return state, base, None
    cfg = dict(trying.baseline, instances=2)
    if "thread_pct" in trying.domains:
        half = 50 if machine.device == "gpu" else \
            space.pct_for_threads(max(1, machine.cores // 2), machine.cores)
        cfg["thread_pct"] = min(trying.domains["thread_pct"], key=lambda v: (abs(v - half), v))
    cfg = trying.config(cfg)
    knobs, instances = trying.trial_knobs(cfg)
    prober.tell(Note.info("ranks: probing the script on 2 ranks (torchrun's environment) to "
                          "learn whether it trains data-parallel"))

    def probe(state, **over):
        return prober.probe(state, prober.spec(state, knobs, instances, "ranks",
                                               alone_after_s=ALONE_AFTER_S, **over),
                            label="ranks", number=None, cfg=cfg)

    max_s = prober.spec(state, knobs, instances, "ranks").max_s
    state, result = probe(state)
    for _ in range(BASELINE_TRIES - 1):
        if result.outcome != Outcome.NO_SIGNAL or not result.stopped:
            break
        # two ranks start slower than one (a process group to form, twice the imports)
        longer = longer_window(max_s, result.first_s)
        prober.tell(Note.info(f"ranks: no throughput within {max_s:.0f} s ({result.reason}); "
                              f"trying again with {longer:.0f} s"))
        max_s = longer
        state, result = probe(state, max_s=max_s)
    seen = result.seen
    joined = bool(seen.get("backend")) and int(seen.get("world_size") or 0) >= 2 and \
        not seen.get("started_by_script")
    if joined and (result.ok or result.outcome == Outcome.FOREIGN_LOAD):
        if not result.ok:  # data-parallel, but the probe is no trial to compare
            state = prober.note(state, Note.hint(
                "ranks: the script joins a process group of 2 ranks when launched that way, "
                "so instances and bucket_mb are searched"))
            return state, dataclasses.replace(base, distributed=True), None
        state = prober.note(state, Note.hint(
            f"ranks: the script joins a process group of 2 ranks ({seen.get('backend')}) when "
            f"launched that way, so instances and bucket_mb are searched; the probe is the "
            f"first 2-rank trial ({result.samples_per_s:.1f} samples/s)"))
        return state, dataclasses.replace(base, distributed=True), RanksProbe(
            dict(cfg), result.samples_per_s, result.ci_half, result.energy, result.noise)
    if result.ok:
        why = ("a probe of 2 ranks (torchrun's environment) saw them train alone, with no "
               "process group and no DDP, so extra ranks would each train a model of their own")
    elif result.outcome == Outcome.FOREIGN_LOAD:
        why = f"a probe of 2 ranks could not tell ({result.reason})"
    else:
        why = (f"a probe of 2 ranks (torchrun's environment) ended {result.outcome.value}: "
               f"{result.reason} (log: {result.log_path})")
    return state, dataclasses.replace(base, alone_why=why), None


def time_allreduce(prober: Prober) -> AllreduceTiming:
    """Allreduce timed on two ranks (of this host, or one on each of two nodes of a launcher's:
    `autotune.measuring.allreduce.ranks_per_host`): its result, or why it failed (a bound for
    one knob never fails the tuning).

    CPU ranks on gloo even on a GPU host: a probe puts ranks that share a GPU on gloo (NCCL
    refuses them), and gloo stages CUDA tensors through host memory.
    """
    try:
        result = allreduce.measure(
            ranks=2, log_dir=prober.run_dir / "logs", cwd=str(prober.run_dir),
            launcher=prober.launcher, device="cpu", max_bytes=ALLREDUCE_MAX_BYTES,
            seconds_per_size=ALLREDUCE_SECONDS_PER_SIZE, timeout_s=ALLREDUCE_TIMEOUT_S)
        return AllreduceTiming(result)
    except Exception as exc:  # noqa: BLE001 - a bound for one knob never fails the tuning
        return AllreduceTiming(error=str(exc) or type(exc).__name__)


def _tell_buckets(prober: Prober, state: TuneState, saved: AllreduceTiming,
                  candidates) -> TuneState:
    prober.emit(Event.ALLREDUCE, **saved.to_dict(), candidates=list(candidates))
    values = ", ".join(map(str, candidates))
    bounds, r = saved.bucket_mb_range, saved.result
    if bounds is None or r is None:  # the conventional candidates stay; tuning goes on
        first = saved.error.splitlines()[0].rstrip(":")
        return prober.note(state, Note.warning(
            f"bucket_mb: not narrowed by a measurement: {first}; searching the usual "
            f"candidates {values}"))
    peak = max(p.busbw_gbps for p in r.points)
    return prober.note(state, Note.hint(
        f"bucket_mb: allreduce on {r.world_size} {r.backend} ranks here pays off from "
        f"{bounds[0]:g} to {bounds[1]:g} MB (peak bus bandwidth {peak:.2f} GB/s); searching "
        f"{values}"))
