"""The baseline: the script with its own settings, probed first; the space follows from it.

What the meter saw the script use (batch size, workers, threads, torch.distributed) and its peak
memory, with the user's ranges and fixes and the script's explicit flags, give the space
(`autotune.tuning.space.build`). When that space searches ``bucket_mb``, allreduce is timed once on two
ranks of this host (`autotune.launching.allreduce`) and the measured range narrows its candidates. All of
it is saved in the run's state, so a resume does not re-measure.
"""

from __future__ import annotations

import dataclasses

from autotune.launching import allreduce, rank_command
from autotune.store import fingerprint
from autotune.tuning import space
from autotune.errors import AutotuneError
from autotune.measuring.outcome import Outcome

# One short allreduce sweep (4 KB .. 64 MB, x4 steps): a few seconds on two CPU ranks.
ALLREDUCE_MAX_BYTES = 64 * allreduce.MB
ALLREDUCE_SECONDS_PER_SIZE = 0.2
ALLREDUCE_TIMEOUT_S = 120.0


def job_devices(tuner, machine: space.Machine) -> int:
    """What the full run spreads its ranks over: every visible GPU of every host (hosts on
    CPU). A global batch is divided by ``instances`` times this."""
    return space.job_devices(machine.device, machine.gpus, tuner.launcher.host_count)


def own_world(tuner, result, devices: int) -> int:
    """The world a global batch is divided by: a script that starts its own ranks has the one
    torch reported, not the ranks autotune started."""
    world = int(result.seen.get("world_size") or 1)
    own = space.Baseline.from_seen(result.seen).own_ranks
    if not (own and tuner.s.global_batch and world > devices):
        return devices
    tuner.note("hint", f"--global-batch {tuner.s.global_batch}: the script starts its own "
                       f"{world} ranks, so each rank's batch is "
                       f"{tuner.s.global_batch // world}; measuring the baseline again with it")
    return world


def placeholder_values(tuner, devices: int = 1) -> dict[str, int]:
    """Values for the script's placeholders in the baseline probe, telling the user which
    were guessed."""
    given = {r.alias: r.values[0] for r in space.parse_fix(tuner.s.baseline_tokens).values()}
    out = {}
    cores = fingerprint.cores()
    for name in sorted(rank_command.placeholders(tuner.s.command[1:])):
        if name == "batch_size" and tuner.s.global_batch:
            out[name] = tuner.s.global_batch // devices
            continue
        default = cores if name == "threads" else space.KNOBS[
            space.ALIASES.get(name, name)].conventional
        out[name] = int(given.get(name, default))
        if name not in given:
            tuner.note("hint", f"baseline: {{{name}}} is a placeholder, so the script's own "
                              f"default is unknown; using {name}={out[name]} (set it with "
                              f"--baseline {name}=N)")
    if tuner.s.global_batch:
        out["batch_size"] = tuner.s.global_batch // devices
    return out


def measure(tuner) -> None:
    """Probe the script as it is, build the space from what it used, save both."""
    machine = fingerprint.machine()
    devices = job_devices(tuner, machine)
    values = placeholder_values(tuner, devices)
    result = tuner.probe(tuner.spec_for(values, 1, "baseline"), label="baseline", number=None,
                         cfg=values, finish=False)
    no_loader = result.source == "none" and result.steps_per_s > 0  # more time won't help
    if result.outcome == Outcome.NO_SIGNAL and result.exit_code in (0, None) and not no_loader:
        # Too few batches inside the window: a slow start (imports, data) or slow steps, not a
        # broken script. One more try with twice the time before giving up.
        tuner.note("hint", f"baseline: no throughput within {tuner.s.seconds:.0f} s "
                           f"({result.reason}); trying once more with "
                           f"{2 * tuner.s.seconds:.0f} s (raise --seconds for slow starts)")
        tuner.journal.emit("trial_finished", trial="baseline", number=None,
                           mode=result.mode, result=result)
        result = tuner.probe(tuner.spec_for(values, 1, "baseline", max_s=2 * tuner.s.seconds),
                             label="baseline", number=None, cfg=values, finish=False)
    world = own_world(tuner, result, devices) \
        if result.ok or result.outcome == Outcome.FOREIGN_LOAD else devices
    if world != devices:
        devices, values = world, {**values, "batch_size": tuner.s.global_batch // world}
        tuner.journal.emit("trial_finished", trial="baseline", number=None,
                           mode=result.mode, result=result)
        result = tuner.probe(tuner.spec_for(values, 1, "baseline"), label="baseline",
                             number=None, cfg=values, finish=False)
    if result.outcome == Outcome.FOREIGN_LOAD:
        tuner.note("warning", "baseline: measured under foreign CPU load; its number is "
                              "only a guide, the confirmation re-measures it")
    elif not result.ok:
        tuner.journal.emit("trial_finished", trial="baseline", number=None, mode=result.mode,
                           result=result)
        raise AutotuneError(
            f"the baseline probe (the script with its own settings) did not give a "
            f"throughput: {result.outcome.value}: {result.reason}; log: {result.log_path}"
            + (f"\n{result.log_tail}" if result.log_tail else ""))
    base = space.Baseline.from_seen(
        result.seen, peak_rss_bytes=result.peak_rss_bytes,
        cuda_peak_bytes=result.cuda_peak_bytes,
        placeholder_values={space.ALIASES.get(k, k): v for k, v in values.items()
                            if k != "threads"})
    if "threads" in values:
        base = dataclasses.replace(base, threads=values["threads"])
    ranges = space.parse_space(tuner.s.space_tokens)
    fixed, notes = space.explicit_fixes(tuner.s.command[1:], ranges,
                                        space.parse_fix(tuner.s.fix_tokens),
                                        global_batch=tuner.s.global_batch)
    for note in notes:
        tuner.note("hint", note)
    req = space.SpaceRequest(ranges=ranges, fixed=fixed, global_batch=tuner.s.global_batch,
                             placeholders=tuple(sorted(rank_command.placeholders(
                                 tuner.s.command[1:]))), devices=devices)
    sp = space.build(machine, base, req)
    if "bucket_mb" in sp.domains and "bucket_mb" not in req.ranges:
        bounds = bucket_bounds(tuner)
        if bounds is not None:
            sp = space.build(dataclasses.replace(machine, bucket_mb_range=bounds), base, req)
        _tell_buckets(tuner, bounds, sp.domains.get("bucket_mb", ()))
    tuner.journal.emit("trial_finished", trial="baseline", number=None, mode=result.mode,
                       result=dataclasses.replace(result, knobs=dict(sp.baseline)))
    tuner.state["space"] = sp.to_dict()
    tuner.state["baseline"] = {"knobs": dict(sp.baseline), "samples_per_s":
                               result.samples_per_s, "ci_half": result.ci_half,
                               "source": result.source, "seen": result.seen}
    tuner.save_state()


def bucket_bounds(tuner) -> tuple[float, float] | None:
    """(low, high) MB for ``bucket_mb`` from allreduce timed on two ranks of this host, or None
    when the probe failed (the conventional candidates stay; tuning goes on).

    CPU ranks on gloo even on a GPU host: a probe puts ranks that share a GPU on gloo (NCCL
    refuses them), and gloo stages CUDA tensors through host memory. The result, or the
    failure, is kept in the run's state, so a resume does not time it again.
    """
    saved = tuner.state.get("allreduce")
    if saved is None:
        try:
            result = allreduce.measure(
                ranks=2, log_dir=tuner.run_dir / "logs", cwd=str(tuner.run_dir),
                launcher=tuner.launcher, device="cpu",
                max_bytes=ALLREDUCE_MAX_BYTES, seconds_per_size=ALLREDUCE_SECONDS_PER_SIZE,
                timeout_s=ALLREDUCE_TIMEOUT_S)
            saved = {"result": result.to_dict()}
        except Exception as exc:  # noqa: BLE001 - a bound for one knob never fails the tuning
            saved = {"error": str(exc) or type(exc).__name__}
        tuner.state["allreduce"] = saved
        tuner.save_state()
    if "error" in saved:
        return None
    return allreduce.bucket_range(allreduce.parse(saved["result"]))


def _tell_buckets(tuner, bounds: tuple[float, float] | None, candidates) -> None:
    saved = tuner.state["allreduce"]
    tuner.journal.emit("allreduce", **saved, candidates=list(candidates))
    values = ", ".join(map(str, candidates))
    if bounds is None:
        first = saved["error"].splitlines()[0].rstrip(":")
        tuner.note("warning", f"bucket_mb: not narrowed by a measurement: {first}; searching "
                              f"the usual candidates {values}")
        return
    r = saved["result"]
    peak = max(p["busbw_gbps"] for p in r["points"])
    tuner.note("hint", f"bucket_mb: allreduce on {r['world_size']} {r['backend']} ranks here "
                       f"pays off from {bounds[0]:g} to {bounds[1]:g} MB (peak bus bandwidth "
                       f"{peak:.2f} GB/s); searching {values}")
