"""Run one configuration of a script as a short probe and measure it.

`run_trial(spec)` starts the ranks, listens to their meters, ends the probe once the 95% interval
of samples/s is tight or the time is up, stops the script cleanly (then TERM, then KILL, then a
sweep for stragglers) and returns a frozen `TrialResult` (`autotune.measuring.result`), read
from the ended probe by `autotune.measuring.reading`. No process of the trial outlives it.
"""

from __future__ import annotations

import dataclasses
import math
import os
import signal
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from autotune import Note
from autotune.hardware import proc
from autotune.launching import engines, script_flags
from autotune.launching.collector import Collector, for_launcher
from autotune.launching.group import start_group
from autotune.launching.group import log_path as log_path_of
from autotune.measuring import alternate, logs, reading, series, steady
from autotune.measuring.energy import EnergyMeter
from autotune.measuring.foreign_load import ForeignLoad, cpu_s
from autotune.measuring.outcome import idle
from autotune.measuring.probe_state import POLL_S, ProbeState, TrialSpec
from autotune.measuring.result import TrialResult
from probes import protocol

ESTIMATE_EVERY_S = 1.0
MIN_IDLE_START_S = 10.0  # a probe ending with no batch after this long idle: hung


def run_trial(spec: TrialSpec, *, on_progress: Callable[[steady.Estimate], bool] | None = None,
              on_start: Callable[[list[proc.Launched]], None] | None = None,
              turn: alternate.Turn | None = None) -> TrialResult:
    """Probe one configuration. ``on_progress(estimate)`` returning True prunes the trial.

    With a ``turn`` (`autotune.measuring.alternate.run_together`) it takes turns with other
    trials: its clocks stand still while it is held, it ends when the turns end, and its
    figure is read from the slices it ran."""
    asked = spec.ranks
    log_dir = Path(asked.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    probe = ProbeState(spec, on_progress)
    collector = for_launcher(asked.launcher)
    load = ForeignLoad(others=turn.others if turn is not None else None)
    base_env = dict(os.environ if asked.env is None else asked.env)
    base_env[protocol.ENV_TICK_S] = str(spec.tick_s)
    if spec.noise:
        base_env[protocol.ENV_NOISE] = "1"
    base_env.update(series.watch_env(asked.command, asked.cwd, spec.watch_dirs))
    if spec.metric:
        base_env["PYTHONUNBUFFERED"] = "1"  # lines are timed when they reach the log
    knobs, won = script_flags.split_knobs(asked.knobs, asked.command[1:])
    probe.notes.extend(Note.info(e.note()) for e in won)
    ranks_spec = dataclasses.replace(asked, knobs=knobs, log_dir=log_dir, env=base_env,
                                     marker=f"{asked.name}-{uuid.uuid4().hex[:12]}")
    log_path = log_path_of(ranks_spec, 0)
    probe.log = logs.Reader(log_path)
    begun = proc.birth_clock()  # what is born after this for the ranks is the trial's
    try:
        group = start_group(ranks_spec, channel=collector.env())
        probe.launched.extend(group.launched)  # first: from here `finally` stops them
        probe.group = group
        if turn is not None:
            turn.attach(probe.launched)
        if asked.launcher.kind is engines.Kind.LOCAL and turn is None:  # counters of this host only
            probe.energy = EnergyMeter([slot.gpu.index for slot in group.plan.slots
                                        if slot.gpu is not None])
        if asked.launcher.kind is not engines.Kind.LOCAL:  # ranks are the engine's children, not ours
            probe.marked = proc.MarkedScan({lp.spec.marker for lp in group.launched},
                                           since=begun)
        if on_start is not None:
            on_start(probe.launched)
        _loop(probe, collector, load, turn)
    finally:
        if turn is not None:
            turn.release()  # a held rank would take neither the stop below nor a signal
        # Ctrl-C between the group's start and the line above leaves its ranks unheld: they
        # are found among the live launches by the trial's marker
        held = {lp.pid for lp in probe.launched}
        probe.launched.extend(lp for lp in proc.live() if lp.pid not in held
                              and lp.spec.marker.startswith(f"{ranks_spec.marker}-r"))
        if any(lp.poll() is None for lp in probe.launched):
            probe.stopped_by_us = True
            probe.stop_t = time.monotonic()
            collector.stop_ranks()
            deadline = time.monotonic() + spec.grace_s
            while time.monotonic() < deadline and any(lp.poll() is None for lp in probe.launched):
                time.sleep(0.05)
                probe.absorb(collector.drain())
        exit_codes = [proc.stop(lp, grace_s=spec.grace_s) for lp in probe.launched]
        if asked.launcher.kind is engines.Kind.SRUN and -signal.SIGKILL in exit_codes:
            # a killed srun leaves its step to Slurm: the next probe must not wait for it
            why = engines.wait_steps_ended(base_env)
            if why:
                probe.notes.append(Note.warning(why))
        collector.settle()
        probe.absorb(collector.drain())
        collector.close()
    return reading.result_of(probe, exit_codes, load, log_path, turn)


def _loop(probe: ProbeState, collector: Collector, load: ForeignLoad,
          turn: alternate.Turn | None = None) -> None:
    """Poll the ranks until the probe ends: a rank failed or all ended, it hung, its figure is
    tight (or it trains alone, or was pruned), its time is up; in turns, the turns ended."""
    spec = probe.spec
    next_estimate = time.monotonic() + ESTIMATE_EVERY_S
    held = 0.0  # seconds the turn held it so far: its clocks skip them
    while True:
        time.sleep(POLL_S)
        now = time.monotonic()
        probe.absorb(collector.drain())
        probe.read_log()
        if turn is not None:
            if turn.ended():
                return
            skip = turn.held_s() - held
            held += skip
            probe.skip(skip)
            if not turn.running():
                if any(lp.poll() is not None for lp in probe.launched):
                    return  # killed while held (the OOM killer): nothing else ends it
                # held, it still reads the CPU the others take meanwhile: a script of theirs
                # that ends in its slice (a finite loader) is not read again, and what it
                # took since it was last read would count as foreign load on this one
                load.sample(probe.processes())
                continue
        tree = probe.processes()
        load.sample(tree)
        codes = [lp.poll() for lp in probe.launched]
        probe.exited_first = next((c for c in codes if c not in (None, 0)), None)
        # a rank failed (the rest will be stopped; an engine would run on, but the rank's
        # goodbye says so), or all ended on their own
        if probe.exited_first is not None or probe.failed is not None \
                or all(c is not None for c in codes):
            return
        progress = probe.progress()
        if _hung(probe, progress, now, tree, load, turn):
            return
        if turn is None and now >= next_estimate:  # in turns, the turns end it
            next_estimate = now + ESTIMATE_EVERY_S
            probe.update_estimate()
            if _measured_enough(probe):
                return
        probe.cpu_trail.append((now, load.ours_s()))
        if probe.energy is not None:
            probe.energy.read(now)
        if turn is None and now - probe.t_begin > spec.max_s and \
                _ends_at_limit(probe, progress, now):
            return


def _hung(probe: ProbeState, progress: tuple[int, int, int], now: float, tree: list,
          load: ForeignLoad, turn: alternate.Turn | None) -> bool:
    """Take in the probe's ``progress``, and tell whether it hung (``probe.hung_s`` then says
    how long): no progress for `TrialSpec.hang_s` after its first batch (or, its ranks idle,
    for `TrialSpec.idle_hang_s`), or none and no CPU use for `TrialSpec.startup_s` from the
    start (a busy start-up, just slow, gets another such period)."""
    spec = probe.spec
    if progress != probe.last_progress:
        probe.last_progress = progress
        probe.last_progress_t = now
        probe.ours_at_progress = load.ours_s()
        if probe.first_progress is None and any(progress):
            probe.first_progress = (now, progress[0] or progress[1])
        if turn is not None:
            turn.saw(now, progress[0] or progress[1] or progress[2])
    elif any(progress):
        still = now - probe.last_progress_t
        if still > spec.hang_s or (spec.idle_hang_s is not None and still > spec.idle_hang_s
                                   and idle(load.ours_s() - probe.ours_at_progress, still)):
            probe.hung_s = still
            return True
    elif now - probe.t_start > spec.startup_s:
        cpu = cpu_s(tree)
        if idle(cpu - probe.cpu_seen, spec.startup_s):
            probe.hung_s = now - probe.t_start
            return True
        probe.cpu_seen = cpu
        probe.t_start = now  # busy, just slow: give it another start-up period
    return False


def _measured_enough(probe: ProbeState) -> bool:
    """Whether the probe's estimate (just brought up to date) ends it: tight (``probe.tight_s``
    then says after how much measuring), or showing ranks that train alone where that was
    asked (`TrialSpec.alone_after_s`), or pruned by its ``on_progress`` (``probe.pruned`` then
    says so)."""
    spec, est = probe.spec, probe.estimate
    if est is None:
        return False
    if est.tight(spec.target_rel, spec.min_measure_s):
        probe.tight_s = est.measured_s
        return True
    if spec.alone_after_s is not None and est.measured_s >= spec.alone_after_s \
            and est.windows >= 3 and not probe.script.facts.get("backend"):
        return True
    if probe.on_progress is not None and probe.on_progress(est):
        probe.pruned = True
        return True
    return False


def _ends_at_limit(probe: ProbeState, progress: tuple[int, int, int], now: float) -> bool:
    """Past its `TrialSpec.max_s`: whether the probe ends now, or measures on (within
    `TrialSpec.overtime_s`) while its batches flow and its figure has no interval yet. One
    ending with no batch, late by its baseline's first batch and its ranks idle, hung."""
    spec = probe.spec
    if now - probe.t_begin <= spec.max_s + spec.overtime_s and \
            probe.first_progress is not None and not _has_interval(probe):
        probe.overtime_at = probe.overtime_at or now
        return False
    late = spec.expect_first_s is not None and \
        now - probe.t_begin >= max(MIN_IDLE_START_S, 3 * spec.expect_first_s)
    if not any(progress) and late and probe.idle_for(MIN_IDLE_START_S, now):
        probe.hung_s = now - probe.t_begin  # no batch, and no work towards one
    return True


def _has_interval(probe: ProbeState) -> bool:
    """Whether the probe's last estimate (brought up to date each `ESTIMATE_EVERY_S`) has an
    interval: enough windows for one."""
    est = probe.estimate
    return est is not None and est.windows >= steady.MIN_TIGHT_WINDOWS and \
        math.isfinite(est.ci_half)
