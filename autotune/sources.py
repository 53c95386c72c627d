"""Where a probe's figure comes from, and what the user is told about it. Pure.

A probe counts DataLoader samples; without a DataLoader, steps times the samples in a step
(`samples_per_step`); with ``--metric``, the script's own lines (`autotune.metric`). It also
watches the user's tree for writes (`watch_env`, read by `probes.writes`). The trial runner
(`autotune.trial`) calls these and puts their sentences in the result's reason and notes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from autotune import flags
from autotune.launch import placeholders
from autotune.metric import MetricLog
from probes import protocol

DISAGREE_REL = 0.25  # --metric and autotune's own count further apart than this: said


def samples_per_step(command: Sequence[str], knobs: Mapping[str, float],
                     given: int | None) -> tuple[int | None, str]:
    """Samples in one step of one rank, for scripts without a DataLoader, and where it came from.

    ``--samples-per-step`` (``given``), else the value of the ``{batch_size}`` placeholder, else
    the user's own explicit batch-size flag (`autotune.flags`). Scripts that accumulate gradients
    over several batches per optimizer step need ``--samples-per-step`` or ``--metric``.
    """
    if given:
        return int(given), f"samples per step: {int(given)}, from --samples-per-step"
    args = list(command[1:])
    if "batch_size" in placeholders(args) and "batch_size" in knobs:
        n = int(knobs["batch_size"])
        return n, f"samples per step: {n}, the value of {{batch_size}}"
    explicit = flags.explicit_knobs(args).get("batch_size")
    if explicit is not None and explicit.number and explicit.number > 0:
        return explicit.number, f"samples per step: {explicit.number}, from '{explicit.typed}'"
    return None, ""


def watch_env(command: Sequence[str], cwd: str,
              watch_dirs: Sequence[str] | None) -> dict[str, str]:
    """Where writes are reported: the user's tree (default: ``cwd`` and the script's directory)
    minus the probe's own directory when it runs elsewhere (``--probe-cwd``)."""
    here = os.path.realpath(cwd)
    if watch_dirs is not None:
        watch = [os.path.realpath(d) for d in watch_dirs]
    else:
        watch = [here]
        script = os.path.join(cwd, command[0]) if command else ""
        if script and os.path.isfile(script):
            watch.append(os.path.realpath(os.path.dirname(script)))
    watch = list(dict.fromkeys(watch))
    return {protocol.ENV_WATCH_DIRS: os.pathsep.join(watch),
            protocol.ENV_SCRATCH_DIR: "" if here in watch else here}


def metric_reason(log: MetricLog, *, batch_known: bool, ran_s: float, log_path) -> str:
    """Why ``--metric`` gave no estimate."""
    if log.lines == 0:
        return (f"--metric matched no line of rank 0's output in {ran_s:.0f} s (log: "
                f"{log_path}); check the pattern against the log, or allow more --seconds")
    if log.metric.per_step and not batch_known:
        return (f"--metric gives {log.metric.group}, but the samples in one step are unknown: "
                f"put {{batch_size}} in the script's args or pass --samples-per-step N")
    return (f"only {log.lines} lines matched --metric in {ran_s:.0f} s: too few to measure; "
            f"print more often or allow more --seconds")


def notes(*, source: str, step_note: str, metric_rate: float, counted_rate: float,
          writes: Mapping[str, dict]) -> list[str]:
    """What the user should know about how a probe was measured and what it touched."""
    out = []
    if source == "steps" and step_note:
        out.append(step_note)
    if metric_rate > 0 and counted_rate > 0 \
            and abs(metric_rate - counted_rate) > DISAGREE_REL * counted_rate:
        out.append(f"WARNING: --metric says {metric_rate:.1f} samples/s, autotune counted "
                   f"{counted_rate:.1f}; check that the group means what its name says "
                   f"(samples_per_s is the whole job's figure as rank 0 prints it; a per-rank "
                   f"figure is rank_samples_per_s)")
    if writes:
        paths = sorted(writes)
        existed = sum(1 for p in paths if writes[p].get("existed"))
        shown = ", ".join(paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")
        out.append(f"WARNING: the probe wrote into your tree: {shown}"
                   + (f" ({existed} existed before)" if existed else "")
                   + "; run probes elsewhere with --probe-cwd DIR")
    return out
