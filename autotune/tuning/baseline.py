"""The baseline: the script with its own settings, probed first; the space follows from it.

What the meter saw the script use (batch size, workers, threads, torch.distributed) and its peak
memory, with the user's ranges and fixes and the script's explicit flags, give the space
(`autotune.space.build`). Both are saved in the run's state, so a resume does not re-measure.
"""

from __future__ import annotations

import dataclasses

from autotune import fingerprint, launch, space
from autotune.errors import AutotuneError
from autotune.outcome import Outcome


def placeholder_values(tuner) -> dict[str, int]:
    """Values for the script's placeholders in the baseline probe, telling the user which
    were guessed."""
    given = {r.alias: r.values[0] for r in space.parse_fix(tuner.s.baseline_tokens).values()}
    out = {}
    cores = fingerprint.cores()
    for name in sorted(launch.placeholders(tuner.s.command[1:])):
        if name == "batch_size" and tuner.s.global_batch:
            out[name] = tuner.s.global_batch
            continue
        default = cores if name == "threads" else space.KNOBS[
            space.ALIASES.get(name, name)].conventional
        out[name] = int(given.get(name, default))
        if name not in given:
            tuner.note("hint", f"baseline: {{{name}}} is a placeholder, so the script's own "
                              f"default is unknown; using {name}={out[name]} (set it with "
                              f"--baseline {name}=N)")
    if tuner.s.global_batch:
        out["batch_size"] = tuner.s.global_batch
    return out


def measure(tuner) -> None:
    """Probe the script as it is, build the space from what it used, save both."""
    values = placeholder_values(tuner)
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
                             placeholders=tuple(sorted(launch.placeholders(
                                 tuner.s.command[1:]))))
    sp = space.build(fingerprint.machine(), base, req)
    tuner.journal.emit("trial_finished", trial="baseline", number=None, mode=result.mode,
                       result=dataclasses.replace(result, knobs=dict(sp.baseline)))
    tuner.state["space"] = sp.to_dict()
    tuner.state["baseline"] = {"knobs": dict(sp.baseline), "samples_per_s":
                               result.samples_per_s, "ci_half": result.ci_half,
                               "source": result.source, "seen": result.seen}
    tuner.save_state()
